"""What a resumed directory is trusted with.

A run directory's checkpoints are read with ``torch.load(weights_only=True)`` (no code
runs from them), but a sweep directory holds Ray Tune's state, which Tune restores by
unpickling: whoever can write that directory can run code as the user who resumes it. So
a directory is resumed only when it belongs to the current user and no one else can
write it (the rule ssh applies to its keys), and a sweep's Tune files must be the ones the
sweep itself recorded (``raycobo.tune.sweep``).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from raycobo.settings import ConfigError


def check_trusted(path: Path, what: str, tree: bool = False) -> None:
    """Refuse to resume ``path`` (and, with ``tree``, anything under it) when it is not
    owned by the current user or is writable by other users."""
    items = [Path(path)]
    if tree:
        items += sorted(Path(path).rglob("*"))
    uid = os.getuid()
    for p in items:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue  # links are not followed by the checks below; their targets are
        if st.st_uid != uid:
            raise ConfigError(
                f"refusing to resume the {what} {path}: {p} belongs to uid {st.st_uid}, not "
                f"to you (uid {uid}); a resumed directory is trusted like code"
            )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(
                f"refusing to resume the {what} {path}: {p} is writable by other users "
                f"(mode {stat.S_IMODE(st.st_mode):o}); a resumed directory is trusted like "
                f"code: if you trust what it holds, run chmod -R go-w {path}"
            )


def digests(folder: Path, skip=lambda p: False) -> dict[str, str]:
    """sha256 of every file under ``folder`` (relative path -> hex digest)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink() and not skip(p):
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
