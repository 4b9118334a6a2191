"""Algorithm state as plain data, and back.

An algorithm's state is a dataclass of tensors, numbers and a few torch objects (an
``nn.Module`` such as meta-L2C's encoder, an optimizer such as L2C's Adam).
:func:`state_tree` turns it into nested dicts and lists of tensors and numbers, which
``torch.load(weights_only=True)`` reads back without running code from the file;
:func:`load_into` puts such a tree back into a freshly initialised state of the same
algorithm (the template), so classes never have to be named in a file. Trainable
tensors (leaves that require grad) are copied in place, so an optimizer that holds the
template's parameters keeps pointing at the restored ones; every other tensor is new.

Sessions (``raycobo.engine.session``) snapshot and restore their state with these; the
checkpoint files that hold the trees are ``raycobo.lifecycle.checkpoint``'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn


class CheckpointError(RuntimeError):
    """A saved state that does not fit the run it is loaded into (or an unreadable file)."""


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
        saved = tree["fields"]
        missing = [
            f.name
            for f in dataclasses.fields(template)
            if f.name not in saved and getattr(template, f.name) is not None
        ]
        if missing:
            raise CheckpointError(f"{where}: the checkpoint has no {', '.join(missing)}")
        values = {
            f.name: load_into(getattr(template, f.name), saved[f.name], f"{where}.{f.name}")
            for f in dataclasses.fields(template)
            # a field added since the file was written keeps the template's (unset) value
            if f.name in saved or getattr(template, f.name) is not None
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
