"""What ``RunDir.open`` checks before a run writes its directory: that the folder is
one raycobo may write (not the user's own files), the lock, and whether a new run or a
resume fits what the folder holds (a mixin of ``RunDir``)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycobo.config import Config, ConfigError
from raycobo.lifecycle import checkpoint as ckpt
from raycobo.lifecycle.files import remove_stale_temps

RESUMABLE_KEYS = {"rounds"}
# keys that say how a run is run, watched or compared, not what it computes: a resumed
# run may see them changed (a comparison stores its entries; a cluster's address moves)
OPERATIONAL = (
    "compare.",
    "tracking.",
    "checkpoint.",
    "engine.timeout_s",
    "engine.address",
    "engine.num_cpus",
    "engine.num_gpus",
    "engine.dashboard",
    "engine.max_restarts",
)


class RunDirBusy(ConfigError):
    """Another process writes this run directory (exit 2)."""


@dataclass
class Resume:
    """Where a resumed run continues: the newest readable checkpoint (None: from round
    0), its contents, and what the directory said before."""

    round: int
    checkpoint: Path | None
    data: dict[str, Any] | None
    previous: dict[str, Any] | None  # the summary.json found in the directory

    @property
    def from_round(self) -> int | None:
        """The round the run continues from (None: it starts over, no checkpoint)."""
        return self.round if self.checkpoint is not None else None

    @property
    def mlflow_run_id(self) -> str | None:
        """The MLflow run to continue (also when the run had no checkpoint yet)."""
        found = (self.previous or {}).get("mlflow_run_id")
        return found or (self.data or {}).get("mlflow_run_id")


def read_summary(path: Path) -> dict[str, Any] | None:
    """A run directory's summary.json, or None when it has none (or an unreadable one).
    A ``running`` summary whose writer is gone (nobody holds the directory's lock: the
    process was killed before it could write its last status) reads ``interrupted``."""
    try:
        data = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get("status") == "running" and not _locked(path / ".lock"):
        data = {**data, "status": "interrupted", "stale_running": True}
    extension = data.get("extension")  # an extension killed before it could say so
    running = isinstance(extension, dict) and extension.get("status") == "running"
    if running and not _locked(path / ".lock"):
        data = {**data, "extension": {**extension, "status": "interrupted"}}
    return data


def _locked(lock: Path) -> bool:
    """Whether a process holds this run directory's lock (flock; also this process
    through another descriptor)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False  # no lock file: no writer
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def changed_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved config trees."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        dotted = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_keys(a, b, dotted + ".")
        elif a != b:
            out.append(dotted)
    return out


def config_changes(saved: dict[str, Any], cfg: Config) -> list[str]:
    """The keys in which ``cfg`` differs from the config a checkpoint recorded, but for
    those a resumed run may change (``rounds``, the OPERATIONAL keys)."""
    return [
        k
        for k in changed_keys(saved, cfg.to_dict())
        if k not in RESUMABLE_KEYS and not k.startswith(OPERATIONAL)
    ]


class RunDirChecks:
    """The checks of ``RunDir.open`` (reads ``path``, ``checkpoints``, ``cfg``)."""

    def _refuse_foreign(self) -> None:
        """A new run goes into a new or empty folder, or one that holds a raycobo run
        (which ``_check_new`` judges): a folder of the user's own files is not written."""
        try:
            names = sorted(p.name for p in self.path.iterdir())
        except OSError:
            return  # none yet (or one that cannot be: making it says why)
        own = [n for n in names if n != ".lock" and not (n.startswith(".") and n.endswith(".tmp"))]
        if own and "summary.json" not in own and "checkpoints" not in own:
            shown = ", ".join(own[:4]) + (", ..." if len(own) > 4 else "")
            raise ConfigError(
                f"run directory {self.path} is not empty and holds no raycobo run ({shown}); "
                "choose a new or empty folder for --out"
            )

    def _take_lock(self) -> None:
        f = (self.path / ".lock").open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                f.close()
                raise
            f.seek(0)
            owner = f.read().strip() or "unknown"
            f.close()
            raise RunDirBusy(
                f"run directory {self.path} is in use by another raycobo process (pid {owner})"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock = f

    def _check(self, resume: bool) -> Resume | None:
        old = read_summary(self.path)
        status = old.get("status") if old else None
        if not resume:
            self._check_new(old, status)
            return None
        remove_stale_temps(self.checkpoints)  # what killed checkpoint writes left behind
        remove_stale_temps(self.path)
        found = ckpt.newest_readable(self.checkpoints, lambda msg: print(msg, file=sys.stderr))
        if status == "completed" and found is None and self.cfg.rounds > old.get("rounds", 0):
            raise ConfigError(
                f"run directory {self.path} holds a finished run of {old.get('rounds')} rounds "
                "but no checkpoint to extend it from (checkpoint.every was 0, or the "
                "checkpoints were removed); start a new run with rounds="
                f"{self.cfg.rounds} instead"
            )
        if status == "completed" and (found is None or found[0] >= self.cfg.rounds):
            raise ConfigError(
                f"run directory {self.path} holds a finished run of {old.get('rounds')} rounds; "
                "to extend it, pass rounds=N with N larger than that"
            )
        if found is None:
            return Resume(0, None, None, old)
        round, path, data = found
        if round > self.cfg.rounds:
            raise ConfigError(
                f"invalid config key 'rounds': {self.cfg.rounds}, but the checkpoint in "
                f"{self.path} is at round {round}"
            )
        self._check_config(data.get("config"), path)
        return Resume(round, path, data, old)

    def _check_new(self, old: dict[str, Any] | None, status: str | None) -> None:
        if status == "completed":
            raise ConfigError(
                f"run directory {self.path} already holds a finished run; choose another "
                f"--out, or extend it with: raycobo run --resume {self.path} rounds=N"
            )
        nothing_done = (
            status in ("failed", "interrupted")
            and old.get("last_round") == 0
            and ckpt.latest_checkpoint(self.checkpoints) is None
        )
        if nothing_done:  # e.g. a setting refused while the run started: begin anew
            return
        if old is not None or (self.path / "config.yaml").exists():
            where = f" at round {old.get('last_round', 0)}" if old else ""
            raise ConfigError(
                f"run directory {self.path} holds a{'n' if status == 'interrupted' else ''} "
                f"{status or 'unfinished'} run{where}; continue it with: "
                f"raycobo run --resume {self.path}"
            )

    def _check_config(self, saved: dict[str, Any] | None, path: Path) -> None:
        """The config a checkpoint was written under must be the one resumed with (but
        for ``rounds`` and the OPERATIONAL keys): config.yaml edited by hand is refused,
        naming the keys."""
        if saved is None:  # checkpoints of versions that did not record it
            return
        diff = config_changes(saved, self.cfg)
        if diff:
            shown = ", ".join(diff[:6]) + (", ..." if len(diff) > 6 else "")
            raise ConfigError(
                f"{self.path / 'config.yaml'} no longer matches the config its checkpoint "
                f"{path.name} was written under ({shown} changed); a resumed run keeps its "
                "config (only rounds=N may change): restore those keys, or start a new run"
            )
