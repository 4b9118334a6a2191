"""Files written so that a crash leaves the old version or the new one, never half of
one, and a full disk says which file and why in one line."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

LOW_SPACE = 1 << 20  # below this many free bytes a failed write is read as a full disk


class DiskFull(OSError):
    """No space left on the device holding a run's files (the message names the file)."""

    def __init__(self, path: Path, note: str = ""):
        super().__init__(errno.ENOSPC, f"no space left on device writing {path}")
        self.path, self.note = path, note  # note: what it means for the run

    def __str__(self) -> str:
        return f"no space left on device writing {self.path}" + (
            f"; {self.note}" if self.note else ""
        )

    def __reduce__(self):
        return (type(self), (self.path, self.note))


def _disk_full(path: Path, err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    try:  # torch.save reports a short write as a RuntimeError of its own
        return shutil.disk_usage(path.parent).free < LOW_SPACE
    except OSError:
        return False


def temp_name(path: Path) -> Path:
    """The temporary file beside ``path`` that an atomic write of it uses."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def signals_postponed() -> Iterator[None]:
    """SIGINT and SIGTERM arriving inside the block are held and delivered when it ends,
    to whatever handlers were there before. A signal's Python handler raising inside a
    C++ writer (``torch.save``) turns into a RuntimeError of torch's, so an interrupt
    during a checkpoint ended a run ``failed`` instead of ``interrupted``. Outside the
    main thread (where handlers cannot be set) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    wanted = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in wanted}
    try:
        yield
    finally:
        for s, handler in before.items():  # None: one set outside Python (kept as default)
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for s in dict.fromkeys(caught):  # each once, in the order they came
            signal.raise_signal(s)


def atomic_write(path: Path, write: Callable[[IO], None], binary: bool = False) -> None:
    """``write(f)`` into a temporary file beside ``path``, synced, then renamed over it,
    with interrupts postponed to the end (:func:`signals_postponed`). A full disk raises
    :class:`DiskFull` naming ``path``."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with signals_postponed():
            with tmp.open("wb" if binary else "w") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except Exception as err:
        if _disk_full(path, err):
            raise DiskFull(path) from None
        raise
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def remove_stale_temps(folder: Path) -> list[Path]:
    """Delete temporary files that killed writes left in ``folder`` (``.<name>.<pid>.tmp``
    of processes that no longer run). -> the files removed"""
    removed = []
    if not folder.is_dir():
        return removed
    for p in folder.glob(".*.tmp"):
        pid = p.name.rsplit(".", 2)[-2] if p.name.count(".") >= 3 else ""
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fresh_dir(path: Path) -> Path:
    """Create the folder ``path``, or ``path-2``, ``path-3``, ... where it exists already
    (two commands that named their output folders in the same second)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for k in range(1, 10_000):
        candidate = path if k == 1 else path.with_name(f"{path.name}-{k}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"no free folder name beside {path}")
