"""What a resumed directory is trusted with.

A run directory's checkpoints are read with ``torch.load(weights_only=True)`` (no code
runs from them), but a sweep directory holds Ray Tune's state, which Tune restores by
unpickling: whoever can write that directory can run code as the user who resumes it. So
a directory is resumed only when it belongs to the current user and no one else can
write it (the rule ssh applies to its keys), and a sweep's Tune files must be the ones the
sweep itself recorded (``raycobo.tune.sweep``). Digests alone would not do: they sit in
the directory they protect, and whoever plants a file can write its digest. So the record
is signed, an HMAC-SHA256 under a secret that never leaves this user's machine
(``user_key``: ``$XDG_CONFIG_HOME/raycobo/secret``, default ``~/.config``, mode 600,
made on first use); a directory that someone else's raycobo wrote is not signed with it,
and resuming one is the explicit ``--trust-files``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from raycobo.settings import ConfigError


def check_plain_files(path: Path, what: str, links: bool = False) -> None:
    """Refuse to resume ``path`` when anything under it is neither a regular file nor a
    folder: a run or a sweep writes nothing else, and reading a planted FIFO, device or
    link (to /dev/zero, say) would block or never end. Links are refused, not followed
    (``links``: left to the caller, which refuses them unless told to trust them)."""
    for p in sorted(Path(path).rglob("*")):
        mode = p.lstat().st_mode
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or (links and stat.S_ISLNK(mode)):
            continue
        kind = (
            "symbolic link"
            if stat.S_ISLNK(mode)
            else "FIFO"
            if stat.S_ISFIFO(mode)
            else "socket"
            if stat.S_ISSOCK(mode)
            else "device"
        )
        raise ConfigError(
            f"refusing to resume the {what} {path}: {p} is a {kind}, not a regular file "
            "(raycobo writes none; reading it could block or never end)"
        )


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


def user_key() -> bytes:
    """This user's signing secret (32 random bytes), made on first use with mode 600 in
    a folder of mode 700; a key others can read is refused."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = base / "raycobo" / "secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError(
            f"the signing key {path} must be yours and private (chmod 600 {path}); a key "
            "others can read signs nothing"
        )
    return bytes.fromhex(path.read_text().strip())


def sign(record: Any) -> str:
    """HMAC-SHA256 of ``record`` (canonical JSON) under this user's key."""
    message = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(user_key(), message, hashlib.sha256).hexdigest()


def signed_by_me(record: Any, signature: str | None) -> bool:
    return isinstance(signature, str) and hmac.compare_digest(sign(record), signature)


def symlinks(folder: Path) -> list[Path]:
    """Every symbolic link under ``folder`` (a link can point anywhere: into code)."""
    return sorted(p for p in Path(folder).rglob("*") if p.is_symlink())
