"""Partitions of a centralized dataset into clients with ground-truth clusters.

Every partition is a pure function of the labels, the config and a seed, and returns
per-client train/test index arrays, per-client labels and each client's cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from raycobo.config import ConfigError, DataConfig
from raycobo.data.base import FederatedData, RawDataset


@dataclass
class Partition:
    train_idx: list[torch.Tensor]
    train_y: list[torch.Tensor]
    test_idx: list[torch.Tensor]
    test_y: list[torch.Tensor]
    clusters: list[int | None]
    num_classes: int


def _distinct_permutations(k: int, c: int, g: torch.Generator) -> list[torch.Tensor]:
    perms: list[torch.Tensor] = []
    seen: set[tuple[int, ...]] = set()
    while len(perms) < k:
        p = torch.randperm(c, generator=g)
        key = tuple(p.tolist())
        if key in seen and len(seen) < _factorial_cap(c):
            continue
        seen.add(key)
        perms.append(p)
    return perms


def _factorial_cap(c: int) -> int:
    out = 1
    for i in range(2, c + 1):
        out *= i
        if out > 10**6:
            break
    return out


def label_permutation(raw: RawDataset, cfg: DataConfig, seed: int) -> Partition:
    """CoBo Section 4.1 (cross-silo): clusters differ by a random label permutation.

    Each cluster draws ``data.fraction`` of the training set at random and splits it
    evenly among its clients; the cluster's permutation relabels its clients' train and
    test data; test data is (``data.test_fraction`` of) the test split, permuted.
    """
    sizes = cfg.partition.cluster_sizes()
    g = torch.Generator().manual_seed(seed)
    n_train, n_test = len(raw.train_y), len(raw.test_y)
    per_cluster = int(round(cfg.fraction * n_train))
    if per_cluster < max(sizes):
        raise ConfigError(
            f"invalid config key 'data.fraction': {cfg.fraction} of {n_train} samples "
            f"cannot be split among {max(sizes)} clients"
        )
    test_sel = torch.randperm(n_test, generator=g)[: max(1, int(round(cfg.test_fraction * n_test)))]
    test_sel = test_sel.sort().values
    perms = _distinct_permutations(len(sizes), raw.num_classes, g)
    out = Partition([], [], [], [], [], raw.num_classes)
    for k, size in enumerate(sizes):
        chosen = torch.randperm(n_train, generator=g)[:per_cluster]
        for part in torch.tensor_split(chosen, size):
            part = part.sort().values
            out.train_idx.append(part)
            out.train_y.append(perms[k][raw.train_y[part]])
            out.test_idx.append(test_sel)
            out.test_y.append(perms[k][raw.test_y[test_sel]])
            out.clusters.append(k)
    return out


PARTITIONS: dict[str, Callable[[RawDataset, DataConfig, int], Partition]] = {
    "label_permutation": label_permutation,
}


def partition(raw: RawDataset, cfg: DataConfig, seed: int) -> FederatedData:
    try:
        fn = PARTITIONS[cfg.partition.kind]
    except KeyError:
        raise ConfigError(
            f"invalid config key 'data.partition.kind': unknown partition "
            f"'{cfg.partition.kind}' (choose from {', '.join(sorted(PARTITIONS))})"
        ) from None
    p = fn(raw, cfg, seed)
    return FederatedData(
        name=raw.name,
        train_x=raw.train_x,
        test_x=raw.test_x,
        train_idx=p.train_idx,
        train_y=p.train_y,
        test_idx=p.test_idx,
        test_y=p.test_y,
        clusters=p.clusters,
        num_classes=p.num_classes,
    )
