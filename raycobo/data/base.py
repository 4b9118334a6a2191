"""Containers for federated data: a shared feature pool and per-client index/label views."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FederatedData:
    """Supervised data of n clients.

    Features live once in ``train_x`` / ``test_x``; client c sees rows ``train_idx[c]``
    with labels ``train_y[c]`` (labels are per client, so label permutations cost no copy
    of the features).
    """

    name: str
    train_x: torch.Tensor  # (N, *input_shape) float32
    test_x: torch.Tensor  # (Nt, *input_shape) float32
    train_idx: list[torch.Tensor]  # n x (n_c,) int64
    train_y: list[torch.Tensor]  # n x (n_c,) int64
    test_idx: list[torch.Tensor]
    test_y: list[torch.Tensor]
    clusters: list[int | None]
    num_classes: int

    @property
    def n_clients(self) -> int:
        return len(self.train_idx)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def train_sizes(self) -> list[int]:
        return [int(t.numel()) for t in self.train_idx]

    def subset(self, clients: list[int]) -> FederatedData:
        """The data of ``clients`` only, with compacted feature pools (for one host)."""

        def compact(pool: torch.Tensor, idx: list[torch.Tensor]):
            rows = torch.unique(torch.cat(idx)) if idx else torch.empty(0, dtype=torch.int64)
            return pool[rows].clone(), [torch.searchsorted(rows, i) for i in idx]

        tr = [self.train_idx[c] for c in clients]
        te = [self.test_idx[c] for c in clients]
        train_x, tr = compact(self.train_x, tr)
        test_x, te = compact(self.test_x, te)
        return FederatedData(
            name=self.name,
            train_x=train_x,
            test_x=test_x,
            train_idx=tr,
            train_y=[self.train_y[c] for c in clients],
            test_idx=te,
            test_y=[self.test_y[c] for c in clients],
            clusters=[self.clusters[c] for c in clients],
            num_classes=self.num_classes,
        )


@dataclass
class RawDataset:
    """A centralized dataset before partitioning."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
