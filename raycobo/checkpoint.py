"""Algorithm state as plain data, and checkpoint files written atomically.

An algorithm's state is a dataclass of tensors, numbers and a few torch objects (an
``nn.Module`` such as meta-L2C's encoder, an optimizer such as L2C's Adam).
:func:`state_tree` turns it into nested dicts and lists of tensors and numbers, which
``torch.load(weights_only=True)`` reads back without running code from the file;
:func:`load_into` puts such a tree back into a freshly initialised state of the same
algorithm (the template), so classes never have to be named in the file. Trainable
tensors (leaves that require grad) are copied in place, so an optimizer that holds the
template's parameters keeps pointing at the restored ones; every other tensor is new.

Checkpoint files (``checkpoints/round_000120.pt``) are written to a temporary name in the
same folder and renamed, so a crash leaves either the old file or the new one.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT = 1
_NAME = re.compile(r"^round_(\d{6,})\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint that does not fit the run it is loaded into."""


def state_tree(obj: Any) -> Any:
    """Plain data (tensors, numbers, strings, None, lists, dicts) for ``obj``."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, nn.Module):
        return {"__module__": {k: v.detach().cpu().clone() for k, v in obj.state_dict().items()}}
    if isinstance(obj, torch.optim.Optimizer):
        return {"__optimizer__": state_tree(obj.state_dict())}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: state_tree(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {"__dataclass__": type(obj).__name__, "fields": fields}
    if isinstance(obj, dict):
        return {k: state_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [state_tree(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise CheckpointError(f"cannot checkpoint a {type(obj).__name__}")


def load_into(template: Any, tree: Any, where: str = "state") -> Any:
    """``template`` (a freshly initialised state) holding the values of ``tree``."""
    if isinstance(template, torch.Tensor):
        if not isinstance(tree, torch.Tensor):
            raise CheckpointError(f"{where}: expected a tensor")
        value = tree.to(device=template.device, dtype=template.dtype)
        if template.requires_grad and template.is_leaf and value.shape == template.shape:
            with torch.no_grad():
                template.copy_(value)  # an optimizer may hold this parameter: keep it
            return template
        return value  # a new tensor: fields that shared storage in the template stay apart
    if isinstance(template, nn.Module):
        template.load_state_dict(_unwrap(tree, "__module__", where))
        return template
    if isinstance(template, torch.optim.Optimizer):
        template.load_state_dict(_unwrap(tree, "__optimizer__", where))
        return template
    if dataclasses.is_dataclass(template) and not isinstance(template, type):
        name = type(template).__name__
        if not isinstance(tree, dict) or tree.get("__dataclass__") != name:
            got = tree.get("__dataclass__") if isinstance(tree, dict) else type(tree).__name__
            raise CheckpointError(f"{where}: the checkpoint holds a {got}, the run a {name}")
        values = {
            f.name: load_into(
                getattr(template, f.name), tree["fields"][f.name], f"{where}.{f.name}"
            )
            for f in dataclasses.fields(template)
        }
        for k, v in values.items():
            object.__setattr__(template, k, v)  # frozen dataclasses too
        return template
    if template is None or isinstance(template, bool | int | float | str):
        return _from_plain(tree)
    if isinstance(template, dict):
        return {k: load_into(template.get(k), v, f"{where}.{k}") for k, v in tree.items()}
    if isinstance(template, list | tuple):
        if len(template) != len(tree):
            return _from_plain(tree)
        out = [
            load_into(a, b, f"{where}[{i}]")
            for i, (a, b) in enumerate(zip(template, tree, strict=True))
        ]
        return type(template)(out)
    raise CheckpointError(f"{where}: cannot restore a {type(template).__name__}")


def _unwrap(tree: Any, key: str, where: str) -> Any:
    if not isinstance(tree, dict) or key not in tree:
        raise CheckpointError(f"{where}: expected a saved {key.strip('_')}")
    return tree[key]


def _from_plain(tree: Any) -> Any:
    """A value whose template was None (e.g. an optional tensor that was set later)."""
    if isinstance(tree, dict) and "__dataclass__" in tree:
        raise CheckpointError("cannot restore a dataclass without a template")
    return tree


# ---------------------------------------------------------------------------------------
# files


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


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, synced, then renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_checkpoint(folder: Path, round: int, payload: dict[str, Any], keep: int) -> Path:
    """Save ``payload`` as the checkpoint of ``round``; keep the newest ``keep``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(folder, round)
    atomic_save({"format": FORMAT, "round": round, **payload}, path)
    for _, old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's contents; plain tensors and containers only (weights_only)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file: one line
        raise CheckpointError(f"cannot read checkpoint {path}: {type(err).__name__}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a raycobo checkpoint (format {FORMAT})")
    return data
