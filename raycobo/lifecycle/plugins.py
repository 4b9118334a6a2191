"""The plugin code a run names, recorded when it starts and checked before a resume
imports it.

A run directory is something people copy, share and download, and its ``config.yaml``
can name a plugin (``algorithm.name: mymod:Method``) that lies in the folder itself or in
a ``plugin_paths`` it names: importing what a resumed config names would run code that
came with the directory. So when a run, a comparison or a sweep starts, the source files
its plugins are imported from are recorded with their sha256 in ``plugins.json``, signed
with this user's key (:func:`raycobo.lifecycle.trust.sign`). A resume finds the modules
without importing them and goes on only when every file is the one recorded. A plugin
whose source changed since (its numbers would differ), one now found in another file, and
a directory that recorded nothing or that someone else's raycobo signed are refused in one
line; ``--trust-files`` resumes anyway, and the record is then written anew.

Plugins installed as packages and named by entry point are trusted like raycobo itself.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from raycobo.lifecycle.files import atomic_write_text
from raycobo.lifecycle.trust import sign, signed_by_me
from raycobo.registry import add_search_paths
from raycobo.settings import ConfigError

PLUGINS_FILE = "plugins.json"
MAX_RECORD_BYTES = 1 << 20
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # a module, or an attribute path


def named_modules(tree: Any) -> list[str]:
    """The modules a config tree names by import path (``module:attr`` values anywhere in
    it: the method, data set, model, engine, and a comparison's entries), raycobo's own
    left out."""
    found, stack = set(), [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and ":" in node:
            module, _, attr = node.partition(":")
            plugin = _DOTTED.fullmatch(module) and _DOTTED.fullmatch(attr)
            if plugin and module.split(".")[0] != "raycobo":
                found.add(module)
    return sorted(found)


def module_files(module: str) -> list[Path] | None:
    """The source files importing ``module`` runs (each package's ``__init__`` on the way
    down, then the module), found without running any of them. -> None: not found (the
    import will say so)."""
    files: list[Path] = []
    parts = module.split(".")
    search = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        if spec is None:
            try:
                if search is None:  # a top-level name: finders only, nothing is executed
                    spec = importlib.util.find_spec(name)
                else:
                    spec = importlib.machinery.PathFinder.find_spec(name, search)
            except (ImportError, ValueError):
                return None
        if spec is None:
            return None
        if spec.has_location and spec.origin:
            files.append(Path(spec.origin).resolve())
        search = list(spec.submodule_search_locations or [])
    return files


def _plugin_paths(tree: dict[str, Any]) -> list[str]:
    paths = tree.get("plugin_paths")
    return [str(p) for p in paths] if isinstance(paths, list) else []


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plugin_record(tree: dict[str, Any]) -> dict[str, Any] | None:
    """What a directory records of its plugins: each named module's files and digests,
    and the plugin_paths searched. -> None when the config names no plugin code."""
    modules, paths = named_modules(tree), _plugin_paths(tree)
    if not modules and not paths:
        return None
    add_search_paths(paths)
    found = {}
    for m in modules:
        files = module_files(m)
        if files is not None:
            found[m] = {str(f): _sha256(f) for f in files}
    return {"modules": found, "plugin_paths": paths}


def write_plugin_record(folder: Path, tree: dict[str, Any]) -> None:
    """Record (signed) the plugin code ``tree`` names in ``folder/plugins.json``; a stale
    record is removed when it names none."""
    record = plugin_record(tree)
    path = Path(folder) / PLUGINS_FILE
    if record is None:
        if path.is_file():
            path.unlink()
        return
    atomic_write_text(path, json.dumps({**record, "signature": sign(record)}, indent=1))


def _read_record(path: Path) -> dict[str, Any] | None:
    """A recorded plugins.json, read only when it is a regular file of a bounded size."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        raise ConfigError(f"refusing {path}: not a regular file raycobo wrote") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
            raise ConfigError(f"refusing {path}: not a record raycobo wrote")
        try:
            record = json.loads(f.read())
        except ValueError:
            raise ConfigError(f"refusing {path}: not a record raycobo wrote (no JSON)") from None
    return record if isinstance(record, dict) else None


def check_plugins(folder: Path, tree: dict[str, Any], what: str, trust: bool) -> None:
    """Before a resume imports the plugins ``tree`` names: refuse (one line) unless
    ``folder`` recorded exactly that code and signed it with this user's key, or the
    user trusts it (``trust``: ``--trust-files``)."""
    modules, paths = named_modules(tree), _plugin_paths(tree)
    if trust or (not modules and not paths):
        return
    folder = Path(folder)
    named = ", ".join(modules) if modules else "plugin_paths " + ", ".join(paths)
    again = "if you trust that code, resume with --trust-files"
    record = _read_record(folder / PLUGINS_FILE)
    if record is None:
        raise ConfigError(
            f"refusing to resume the {what} {folder}: its config names plugin code ({named}) "
            f"that it did not record (an older raycobo or someone else's wrote it), and "
            f"resuming would import it; {again}"
        )
    body = {k: v for k, v in record.items() if k != "signature"}
    if not signed_by_me(body, record.get("signature")):
        raise ConfigError(
            f"refusing to resume the {what} {folder}: its record of the plugin code it "
            f"imports ({named}) is not signed with your key (written by someone else's "
            f"raycobo, or edited); {again}"
        )
    if body.get("plugin_paths") != paths:
        raise ConfigError(
            f"refusing to resume the {what} {folder}: its config's plugin_paths are not the "
            f"ones it recorded; {again}"
        )
    add_search_paths(paths)
    for m in modules:
        files = module_files(m)
        if files is None:
            continue  # not found: the import names it, and nothing runs
        recorded = body.get("modules", {}).get(m)
        if recorded is None:
            raise ConfigError(
                f"refusing to resume the {what} {folder}: its config names the plugin module "
                f"'{m}', which it did not record; {again}"
            )
        now = {str(f): _sha256(f) for f in files}
        if list(now.values()) == list(recorded.values()):
            continue  # the same code (found where it was, or a copy of it)
        where = ", ".join(now)
        if list(now) != list(recorded):
            raise ConfigError(
                f"refusing to resume the {what} {folder}: the plugin module '{m}' is now "
                f"found in {where}, not in {', '.join(recorded)} where it ran; {again}"
            )
        raise ConfigError(
            f"refusing to resume the {what} {folder}: the plugin module '{m}' ({where}) "
            "changed since it ran, so its numbers would differ; restore it, or resume with "
            "--trust-files to run it as it is now"
        )
