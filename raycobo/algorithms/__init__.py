"""Collaborative-learning algorithms as pure torch math over explicit state.

This package imports neither ray nor mlflow: engines (``raycobo.engine``) and tracking
(``raycobo.tracking``) live above it. Each method lives in its own module with its
settings class (``CoBoConfig`` in ``cobo/settings.py``, ...); ``METHODS`` maps a
built-in name to both. A method outside the package (a plugin) is a class named by
import path or entry point (``raycobo.registry``) with the same constructor
``(settings, rounds, seed)``, the Algorithm protocol's methods and a ``Settings``
attribute, its settings class: the built-ins and the plugins are found by the same
:func:`method`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from raycobo.algorithms.apple import APPLE, APPLEConfig
from raycobo.algorithms.base import Algorithm, ClientOps, Evaluation, evaluate
from raycobo.algorithms.cobo import CoBo, CoBoConfig
from raycobo.algorithms.countsketch import CountSketchConfig, CountSketchFL
from raycobo.algorithms.ditto import Ditto, DittoConfig
from raycobo.algorithms.fc import FCConfig, FederatedClustering
from raycobo.algorithms.fedala import FedALA, FedALAConfig
from raycobo.algorithms.fedamp import FedAMP, FedAMPConfig
from raycobo.algorithms.fedavg import FedAvg, FedAvgConfig
from raycobo.algorithms.fedavg_ft import FedAvgFT, FedAvgFTConfig
from raycobo.algorithms.federico import FedeRiCo, FedeRiCoConfig
from raycobo.algorithms.fedfomo import FedFomo, FedFomoConfig
from raycobo.algorithms.fedsep import FedSep, FedSepConfig
from raycobo.algorithms.fedsep_hetero import FedSepHetero, FedSepHeteroConfig
from raycobo.algorithms.ifca import IFCA, IFCAConfig
from raycobo.algorithms.l2c import L2C, L2CConfig
from raycobo.algorithms.local import Local, LocalConfig
from raycobo.algorithms.meta_l2c import MetaL2CConfig, meta_l2c
from raycobo.algorithms.oracle import Oracle, OracleConfig
from raycobo.algorithms.pfedgraph import PFedGraph, PFedGraphConfig
from raycobo.algorithms.settings import MethodConfig
from raycobo.algorithms.topk_ef import TopKConfig, TopKEF
from raycobo.algorithms.validation import ValidationBased, ValidationConfig
from raycobo.registry import Registry
from raycobo.settings import ConfigError, did_you_mean


class Method(NamedTuple):
    build: Callable[[Any, int, int], Algorithm]  # (settings, rounds, seed) -> algorithm
    settings: type[MethodConfig]


METHODS: dict[str, Method] = {
    "cobo": Method(CoBo, CoBoConfig),
    "local": Method(Local, LocalConfig),
    "fedavg": Method(FedAvg, FedAvgConfig),
    "fedavg_ft": Method(FedAvgFT, FedAvgFTConfig),
    "ditto": Method(Ditto, DittoConfig),
    "ifca": Method(IFCA, IFCAConfig),
    "fc": Method(FederatedClustering, FCConfig),
    "oracle": Method(Oracle, OracleConfig),
    "federico": Method(FedeRiCo, FedeRiCoConfig),
    "l2c": Method(L2C, L2CConfig),
    "meta_l2c": Method(meta_l2c, MetaL2CConfig),
    "fedsep": Method(FedSep, FedSepConfig),
    "topk_ef": Method(TopKEF, TopKConfig),
    "fedsep_hetero": Method(FedSepHetero, FedSepHeteroConfig),
    "countsketch": Method(CountSketchFL, CountSketchConfig),
    "validation_based": Method(ValidationBased, ValidationConfig),
    "fedamp": Method(FedAMP, FedAMPConfig),
    "fedfomo": Method(FedFomo, FedFomoConfig),
    "fedala": Method(FedALA, FedALAConfig),
    "apple": Method(APPLE, APPLEConfig),
    "pfedgraph": Method(PFedGraph, PFedGraphConfig),
}
ALGORITHMS: dict[str, Callable[[Any, int, int], Algorithm]] = {
    name: m.build for name, m in METHODS.items()
}
REGISTRY = Registry("method", "algorithm.name")
for _name, _m in METHODS.items():
    REGISTRY.add(_name, _m)

# what a plugin method must have (the Algorithm protocol)
PROTOCOL = ("name", "init", "round", "eval_params", "collaboration")


def method(name: str) -> Method:
    """A method by name: built-in, import path (``pkg.mod:Class``) or entry point."""
    found = REGISTRY.get(name)
    if isinstance(found, Method):
        return found
    settings = getattr(found, "Settings", None)
    if not (isinstance(settings, type) and issubclass(settings, MethodConfig)):
        raise ConfigError(
            f"invalid config key 'algorithm.name': the method '{name}' has no settings "
            "class: give it an attribute Settings, a subclass of raycobo.MethodConfig"
        )
    missing = [a for a in PROTOCOL if not hasattr(found, a)]
    if missing:
        raise ConfigError(
            f"invalid config key 'algorithm.name': the method '{name}' does not implement "
            f"the Algorithm protocol (no {', '.join(missing)})"
        )
    return Method(found, settings)


def method_names() -> list[str]:
    """The built-in methods' names, then the installed plugins'."""
    return REGISTRY.names()


def method_keys(name: str) -> list[str]:
    """The settings (``algorithm.<key>``) of a method, ``name`` first."""
    return list(method(name).settings.model_fields)


def methods_with(key: str) -> list[str]:
    """The built-in methods that have setting ``key``."""
    return [n for n, m in METHODS.items() if key in m.settings.model_fields]


def check_method_keys(section: dict[str, Any]) -> type[MethodConfig]:
    """Refuse keys that the section's method does not have, naming the methods that do.
    -> the method's settings class"""
    name = section.get("name", "cobo")
    settings = method(name).settings
    for key in section:
        if key in settings.model_fields:
            continue
        if key in settings.retired:
            raise ConfigError(f"unknown config key 'algorithm.{key}': {settings.retired[key]}")
        owners = methods_with(key)
        if not owners:
            hint = did_you_mean(f"algorithm.{key}", list(settings.model_fields))
            raise ConfigError(f"unknown config key 'algorithm.{key}'{hint}")
        raise ConfigError(
            f"invalid config key 'algorithm.{key}': {name} has no setting '{key}' "
            f"(it is a setting of {', '.join(owners)})"
        )
    return settings


def algorithm_settings(**values: Any) -> MethodConfig:
    """One method's settings from keyword values (``name`` chooses the method)."""
    values.setdefault("name", "cobo")
    return check_method_keys(values).model_validate(values)


def build_algorithm(cfg: MethodConfig, rounds: int, seed: int) -> Algorithm:
    return method(cfg.name).build(cfg, rounds, seed)


__all__ = [
    "ALGORITHMS",
    "METHODS",
    "Algorithm",
    "ClientOps",
    "Method",
    "MethodConfig",
    "Evaluation",
    "algorithm_settings",
    "build_algorithm",
    "check_method_keys",
    "evaluate",
    "method",
    "method_keys",
    "method_names",
    "methods_with",
]
