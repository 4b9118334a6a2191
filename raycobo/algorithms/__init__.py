"""Collaborative-learning algorithms as pure torch math over explicit state.

This package imports neither ray nor mlflow: engines (``raycobo.engine``) and tracking
(``raycobo.tracking``) live above it. Each method lives in its own module with its
settings class (``CoBoConfig`` in ``cobo.py``, ...); ``METHODS`` maps a name to both, and
``AlgorithmConfig`` is the union of the settings classes, told apart by ``name``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, NamedTuple, Union

from pydantic import Field, TypeAdapter

from raycobo.algorithms.base import Algorithm, ClientOps, Evaluation, evaluate
from raycobo.algorithms.cobo import CoBo, CoBoConfig
from raycobo.algorithms.countsketch import CountSketchConfig, CountSketchFL
from raycobo.algorithms.ditto import Ditto, DittoConfig
from raycobo.algorithms.fc import FCConfig, FederatedClustering
from raycobo.algorithms.fedavg import FedAvg, FedAvgConfig
from raycobo.algorithms.fedavg_ft import FedAvgFT, FedAvgFTConfig
from raycobo.algorithms.federico import FedeRiCo, FedeRiCoConfig
from raycobo.algorithms.fedsep import FedSep, FedSepConfig
from raycobo.algorithms.fedsep_hetero import FedSepHetero, FedSepHeteroConfig
from raycobo.algorithms.ifca import IFCA, IFCAConfig
from raycobo.algorithms.l2c import L2C, L2CConfig
from raycobo.algorithms.local import Local, LocalConfig
from raycobo.algorithms.meta_l2c import MetaL2CConfig, meta_l2c
from raycobo.algorithms.oracle import Oracle, OracleConfig
from raycobo.algorithms.settings import MethodConfig
from raycobo.algorithms.topk_ef import TopKConfig, TopKEF
from raycobo.algorithms.validation import ValidationBased, ValidationConfig
from raycobo.settings import ConfigError, choose


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
}
ALGORITHMS: dict[str, Callable[[Any, int, int], Algorithm]] = {
    name: m.build for name, m in METHODS.items()
}

# the ``algorithm`` section of a config: one method's settings, chosen by ``name``
AlgorithmConfig = Annotated[
    Union[tuple(m.settings for m in METHODS.values())],  # noqa: UP007 - built at import
    Field(discriminator="name"),
]
_ADAPTER: TypeAdapter = TypeAdapter(AlgorithmConfig)


def method_keys(name: str) -> list[str]:
    """The settings (``algorithm.<key>``) of a method, ``name`` first."""
    settings = choose(METHODS, name, "algorithm.name", "algorithm").settings
    return list(settings.model_fields)


def methods_with(key: str) -> list[str]:
    """The methods that have setting ``key``."""
    return [n for n, m in METHODS.items() if key in m.settings.model_fields]


def check_method_keys(section: dict[str, Any]) -> None:
    """Refuse keys that the section's method does not have, naming the methods that do."""
    name = section.get("name", "cobo")
    if not isinstance(name, str):
        return  # the schema reports a wrong type
    keys = method_keys(name)
    for key in section:
        if key in keys:
            continue
        owners = methods_with(key)
        if not owners:
            raise ConfigError(f"unknown config key 'algorithm.{key}'")
        raise ConfigError(
            f"invalid config key 'algorithm.{key}': {name} has no setting '{key}' "
            f"(it is a setting of {', '.join(owners)})"
        )


def algorithm_settings(**values: Any) -> MethodConfig:
    """One method's settings from keyword values (``name`` chooses the method)."""
    check_method_keys(values)
    return _ADAPTER.validate_python(values)


def build_algorithm(cfg: MethodConfig, rounds: int, seed: int) -> Algorithm:
    factory = choose(ALGORITHMS, cfg.name, "algorithm.name", "algorithm")
    return factory(cfg, rounds, seed)


__all__ = [
    "ALGORITHMS",
    "METHODS",
    "Algorithm",
    "AlgorithmConfig",
    "ClientOps",
    "Evaluation",
    "algorithm_settings",
    "build_algorithm",
    "check_method_keys",
    "evaluate",
    "method_keys",
    "methods_with",
]
