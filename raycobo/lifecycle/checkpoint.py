"""Checkpoint files: ``checkpoints/round_000120.pt`` in a run directory.

A checkpoint holds the session's state tree (``raycobo.state``), the round, the
evaluations so far, W snapshots, membership changes, counters, the MLflow run id and the
resolved config the run was written under. Files are written to a temporary name in the
same folder and renamed (``raycobo.lifecycle.files``), so a crash leaves either the old file or
the new one, and read with ``torch.load(weights_only=True)``: plain tensors and
containers only, no code runs from a file.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import torch

from raycobo.lifecycle.files import atomic_write
from raycobo.state import CheckpointError

FORMAT = 1
_NAME = re.compile(r"^round_(\d{6,})\.pt$")


def checkpoint_path(folder: Path, round: int) -> Path:
    return folder / f"round_{round:06d}.pt"


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(round, path) of the complete checkpoints in ``folder``, oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(folder: Path) -> tuple[int, Path] | None:
    found = list_checkpoints(folder)
    return found[-1] if found else None


def write_checkpoint(folder: Path, round: int, payload: dict[str, Any], keep: int) -> Path:
    """Save ``payload`` as the checkpoint of ``round``; keep the newest ``keep``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(folder, round)
    atomic_write(path, lambda f: torch.save({"format": FORMAT, "round": round, **payload}, f), True)
    for _, old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's contents; plain tensors and containers only (weights_only)."""
    try:
        data = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file: one line
        raise CheckpointError(f"cannot read checkpoint {path}: {type(err).__name__}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a raycobo checkpoint (format {FORMAT})")
    return data


def newest_readable(folder: Path, warn) -> tuple[int, Path, dict[str, Any]] | None:
    """The newest checkpoint in ``folder`` that can be read, newest first; every one that
    cannot is named through ``warn`` (one line) and skipped."""
    for round, path in reversed(list_checkpoints(folder)):
        try:
            return round, path, read_checkpoint(path)
        except CheckpointError as err:
            warn(f"warning: {err}; trying an older checkpoint")
    return None
