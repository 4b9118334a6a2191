"""Datasets and partitions, chosen by ``data.name`` and ``data.partition.kind``.

A data set is a loader ``(data: DataConfig, seed: int) -> RawDataset | FederatedData``: a
centralized :class:`RawDataset` is split among clients by ``data.partition``; a
:class:`FederatedData` already holds its clients. Built-ins and plugins (an import path
``package.module:load`` or an entry point in ``raycobo.datasets``) are found by the same
registry; a plugin reads its own settings from ``data.options``.
"""

from __future__ import annotations

from raycobo.config import Config, ConfigError, DataConfig
from raycobo.data.base import FederatedData, RawDataset
from raycobo.data.files import load_arrays, load_image_folder
from raycobo.data.partition import PARTITIONS, partition
from raycobo.data.quadratic import QuadraticProblem, make_quadratic
from raycobo.data.shift import shift_features
from raycobo.data.vision import (
    fashion_mnist_available,
    load_cifar,
    load_digits,
    load_fashion_mnist,
    load_mnist1d,
)
from raycobo.registry import Registry

DATASETS = Registry("dataset", "data.name")
for _name, _load in {
    "digits": load_digits,
    "fashion_mnist": lambda cfg, seed: load_fashion_mnist(cfg),
    "cifar10": lambda cfg, seed: load_cifar(cfg, "cifar10"),
    "cifar100": lambda cfg, seed: load_cifar(cfg, "cifar100"),
    "mnist1d": load_mnist1d,
    "arrays": load_arrays,
    "image_folder": load_image_folder,
}.items():
    DATASETS.add(_name, _load)
SYNTHETIC = {"quadratic"}
TEXT = {"multilingual_text"}
# the data keys that only some data sets read: given to another, they would do nothing
ONLY_FOR = {"path": {"arrays"}, "image_size": {"image_folder"}}


def dataset_names() -> list[str]:
    return sorted([*DATASETS.names(), *SYNTHETIC, *TEXT])


def load_data(cfg: Config):
    name = cfg.data.name
    _check_keys(cfg.data)
    if name in SYNTHETIC:
        return make_quadratic(cfg.data, cfg.seed)
    if name in TEXT:
        from raycobo.data.text import load_text
        from raycobo.models.llm import load_tokenizer

        return load_text(cfg.data, load_tokenizer(cfg.model), cfg.seed)
    loader = DATASETS.get(name)
    if not callable(loader):
        raise ConfigError(
            f"invalid config key 'data.name': the data set '{name}' is a "
            f"{type(loader).__name__}, not a loader (data_config, seed) -> RawDataset"
        )
    got = loader(cfg.data, cfg.seed)
    if isinstance(got, RawDataset):
        got = partition(got, cfg.data, cfg.seed)
    elif not isinstance(got, FederatedData):
        raise ConfigError(
            f"invalid config key 'data.name': the data set '{name}' returned a "
            f"{type(got).__name__}, not a raycobo RawDataset or FederatedData"
        )
    got = shift_features(got, cfg.data.feature_shift)
    try:
        data = got.holdout(cfg.validation_fraction(), cfg.seed)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.data.evaluate_on == "validation":
        if cfg.validation_fraction() <= 0:
            raise ConfigError(
                "invalid config key 'data.evaluate_on': validation needs held-out data "
                "(data.validation_fraction > 0)"
            )
        data = data.scored_on_validation()
    return data


def _check_keys(data: DataConfig) -> None:
    """A key that the chosen data set does not read is refused (it would do nothing)."""
    for key, users in ONLY_FOR.items():
        if getattr(data, key) is not None and data.name not in users:
            raise ConfigError(
                f"invalid config key 'data.{key}': {data.name} does not read it (it is for "
                f"{', '.join(sorted(users))})"
            )
    if data.feature_shift != "none" and (data.name in SYNTHETIC or data.name in TEXT):
        raise ConfigError(
            f"invalid config key 'data.feature_shift': {data.name} has no images or features "
            "to transform"
        )
    builtin = data.name in DATASETS or data.name in SYNTHETIC or data.name in TEXT
    if data.options and builtin:
        raise ConfigError(
            f"invalid config key 'data.options': {data.name} is a built-in data set; options "
            "are settings of a plugin data set"
        )


__all__ = [
    "DATASETS",
    "PARTITIONS",
    "FederatedData",
    "QuadraticProblem",
    "RawDataset",
    "dataset_names",
    "fashion_mnist_available",
    "load_data",
]
