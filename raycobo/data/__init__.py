"""Datasets and partitions, chosen by ``data.name`` and ``data.partition.kind``."""

from __future__ import annotations

from collections.abc import Callable

from raycobo.config import Config, ConfigError, DataConfig, choose
from raycobo.data.base import FederatedData, RawDataset
from raycobo.data.partition import PARTITIONS, partition
from raycobo.data.quadratic import QuadraticProblem, make_quadratic
from raycobo.data.vision import (
    fashion_mnist_available,
    load_cifar,
    load_digits,
    load_fashion_mnist,
    load_mnist1d,
)

# supervised datasets: (data config, seed) -> centralized dataset
DATASETS: dict[str, Callable[[DataConfig, int], RawDataset]] = {
    "digits": load_digits,
    "fashion_mnist": lambda cfg, seed: load_fashion_mnist(cfg),
    "cifar10": lambda cfg, seed: load_cifar(cfg, "cifar10"),
    "cifar100": lambda cfg, seed: load_cifar(cfg, "cifar100"),
    "mnist1d": load_mnist1d,
}
SYNTHETIC = {"quadratic"}
TEXT = {"multilingual_text"}


def dataset_names() -> list[str]:
    return sorted([*DATASETS, *SYNTHETIC, *TEXT])


def load_data(cfg: Config):
    name = cfg.data.name
    if name == "quadratic":
        return make_quadratic(cfg.data, cfg.seed)
    if name in TEXT:
        from raycobo.data.text import load_text
        from raycobo.models.llm import load_tokenizer

        return load_text(cfg.data, load_tokenizer(cfg.model), cfg.seed)
    loader = choose(DATASETS, name, "data.name", "dataset", dataset_names())
    data = partition(loader(cfg.data, cfg.seed), cfg.data, cfg.seed)
    try:
        return data.holdout(cfg.validation_fraction(), cfg.seed)
    except ValueError as err:
        raise ConfigError(str(err)) from None


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
