"""Registries of methods, data sets, models and engines, and the plugins they find.

A name in a config is looked up in three places, in order:

1. the built-ins (``cobo``, ``fashion_mnist``, ``mlp``, ...), registered by their packages;
2. an import path ``package.module:Object`` (``algorithm.name: my_methods.fedprox:FedProx``),
   imported from the Python path, the current directory and the config's
   ``plugin_paths``;
3. an entry point of an installed package, in the groups ``raycobo.methods``,
   ``raycobo.datasets``, ``raycobo.models`` and ``raycobo.engines``
   (``algorithm.name: fedprox``).

Engines (``engine.kind``) are registered here, below the config that validates their
keys: an :class:`EngineSpec` names the function that opens the engine's session (imported
only when a run opens one) and the ``engine.*`` keys that are the engine's own.

Every failure is a :class:`ConfigError` of one line naming the config key. The modules a
config's plugins come from are what the Ray engine ships to its workers
(:func:`plugin_modules`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from raycobo.settings import ConfigError

GROUPS = {
    "method": "raycobo.methods",
    "dataset": "raycobo.datasets",
    "model": "raycobo.models",
    "engine": "raycobo.engines",
}


def is_import_path(name: str) -> bool:
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr)


def add_search_paths(paths: list[str] | tuple[str, ...] = ()) -> None:
    """Make plugin modules importable: the current directory and ``paths`` (the config's
    ``plugin_paths``) go on the Python path once."""
    for p in [".", *paths]:
        full = str(Path(p).resolve())
        if full not in sys.path and Path(full).is_dir():
            sys.path.append(full)


def import_object(name: str, key: str) -> Any:
    """``module:attr`` imported, or a ConfigError naming ``key``."""
    module, _, attr = name.partition(":")
    if module.endswith(".py") or "/" in module or "\\" in module:
        folder, stem = Path(module).parent, Path(module).stem
        raise ConfigError(
            f"invalid config key '{key}': '{name}' is a file path, not an import path: "
            f"name the module ('{stem}:{attr}') and put its folder ('{folder}') in plugin_paths"
        )
    add_search_paths()
    try:
        mod = importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - whatever the module raised: one line
        raise ConfigError(
            f"invalid config key '{key}': cannot import module '{module}' for '{name}' "
            f"({type(err).__name__}: {err})"
        ) from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"invalid config key '{key}': module '{module}' has no '{attr}'")
        obj = getattr(obj, part)
    return obj


def _entry_point(what: str, name: str):
    for ep in entry_points(group=GROUPS[what]):
        if ep.name == name:
            return ep
    return None


class Registry:
    """Built-in objects by name, plus plugins by import path or entry point."""

    def __init__(self, what: str, key: str):
        self.what, self.key = what, key  # e.g. "method", "algorithm.name"
        self.builtin: dict[str, Any] = {}

    def add(self, name: str, obj: Any) -> None:
        self.builtin[name] = obj

    def names(self) -> list[str]:
        """Built-ins, then installed plugins (entry points)."""
        found = [ep.name for ep in entry_points(group=GROUPS[self.what])]
        return [*self.builtin, *[n for n in found if n not in self.builtin]]

    def __contains__(self, name: str) -> bool:
        return name in self.builtin

    def get(self, name: str) -> Any:
        if not isinstance(name, str):
            raise ConfigError(f"invalid config key '{self.key}': expected a name, got {name!r}")
        if name in self.builtin:
            return self.builtin[name]
        if is_import_path(name):
            return import_object(name, self.key)
        ep = _entry_point(self.what, name)
        if ep is not None:
            try:
                return ep.load()
            except Exception as err:  # noqa: BLE001
                raise ConfigError(
                    f"invalid config key '{self.key}': the {self.what} '{name}' (entry point "
                    f"{ep.value}) cannot be loaded ({type(err).__name__}: {err})"
                ) from None
        raise ConfigError(
            f"invalid config key '{self.key}': unknown {self.what} '{name}' (choose from "
            f"{', '.join(self.names())}, or name a plugin as package.module:Object)"
        )


def plugin_modules(names: list[str]) -> list[ModuleType]:
    """The top-level modules that the plugins among ``names`` come from (import paths and
    entry points): what Ray's workers need besides raycobo."""
    tops: dict[str, ModuleType] = {}
    for name in names:
        if not isinstance(name, str) or name.split(".")[0] == "raycobo":
            continue
        if is_import_path(name):
            module = name.partition(":")[0]
        else:
            ep = next(
                (e for g in GROUPS.values() for e in entry_points(group=g) if e.name == name),
                None,
            )
            if ep is None:
                continue
            module = ep.value.partition(":")[0]
        top = module.split(".")[0]
        if top != "raycobo" and top in sys.modules:
            tops[top] = sys.modules[top]
    return list(tops.values())


@dataclass(frozen=True)
class EngineSpec:
    """An engine as its registry entry declares it (``engine.kind``).

    ``session``: the function ``(cfg, data) -> Session`` that opens a run's session, or
    its import path ``module:function`` (imported when a run opens one, so that an
    engine's dependencies load only where it runs). ``keys``: fields of ``EngineConfig``
    that only this engine reads (refused, as doing nothing, under another kind).
    ``settings``: a config Section of further ``engine.*`` keys of the engine's own,
    validated by it where ``engine.kind`` names this engine and refused elsewhere."""

    session: str | Callable[..., Any]
    keys: tuple[str, ...] = ()
    settings: type | None = None
    about: str = ""

    def open(self, cfg: Any, data: Any) -> Any:
        """The engine's session over ``data`` for the run ``cfg`` (not started)."""
        factory = self.session
        if isinstance(factory, str):
            factory = import_object(factory, "engine.kind")
        return factory(cfg, data)

    def own_keys(self) -> tuple[str, ...]:
        """Every ``engine.*`` key that is this engine's alone."""
        extra = tuple(self.settings.model_fields) if self.settings is not None else ()
        return self.keys + extra


ENGINES = Registry("engine", "engine.kind")
ENGINES.add(
    "local",
    EngineSpec("raycobo.engine:local_session", about="this process, vectorized over clients"),
)
ENGINES.add(
    "loop",
    EngineSpec("raycobo.engine:local_session", about="this process, the per-client loop"),
)
ENGINES.add(
    "ray",
    EngineSpec(
        "raycobo.engine.ray:ray_session",
        keys=(
            # the client hosts: placement and resources
            "gpus_per_client",
            "clients_per_actor",
            "cpus_per_actor",
            # failures and stragglers
            "max_restarts",
            "on_failure",
            "slow_hosts",
            "slow_seconds",
            # the round's schedule
            "rounds",
            "staleness",
        ),
        about="client hosts as Ray actors (one machine or a cluster)",
    ),
)


def engine(name: str) -> EngineSpec:
    """The engine ``engine.kind`` names: a built-in, ``module:Object``, or an entry point
    of the group ``raycobo.engines`` (a ConfigError naming the key otherwise)."""
    spec = ENGINES.get(name)
    if not isinstance(spec, EngineSpec):
        raise ConfigError(
            f"invalid config key 'engine.kind': '{name}' is no engine (an EngineSpec from "
            f"raycobo.registry), but {type(spec).__name__}"
        )
    return spec
