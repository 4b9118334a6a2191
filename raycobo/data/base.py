"""Containers for federated data: a shared feature pool and per-client index/label views."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch


def compact_rows(
    pool: torch.Tensor, idx: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The rows of ``pool`` that ``idx`` use, once each and in order, and the indices
    into them: ``(pool[rows], [positions of idx[k] in rows])``."""
    rows = torch.unique(torch.cat(idx)) if idx else torch.empty(0, dtype=torch.int64)
    return pool[rows], [torch.searchsorted(rows, i) for i in idx]


@dataclass
class FederatedData:
    """Supervised data of n clients.

    Features live once in ``train_x`` / ``test_x``; client c sees rows ``train_idx[c]``
    with labels ``train_y[c]`` (labels are per client, so label permutations cost no copy
    of the features).
    """

    uses_model: ClassVar[bool] = True  # trained through model.name
    reports_perplexity: ClassVar[bool] = False
    ops: ClassVar[str] = "supervised"  # the ClientOps that train it (raycobo.engine.OPS)

    name: str
    train_x: torch.Tensor  # (N, *input_shape) float32
    test_x: torch.Tensor  # (Nt, *input_shape) float32
    train_idx: list[torch.Tensor]  # n x (n_c,) int64
    train_y: list[torch.Tensor]  # n x (n_c,) int64
    test_idx: list[torch.Tensor]
    test_y: list[torch.Tensor]
    clusters: list[int | None]
    num_classes: int
    # the last val_sizes[c] entries of client c's training data are its validation part
    val_sizes: list[int] | None = None

    @property
    def n_clients(self) -> int:
        return len(self.train_idx)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def train_sizes(self) -> list[int]:
        """Samples of each client's training data, the validation part included."""
        return [int(t.numel()) for t in self.train_idx]

    def validation_sizes(self) -> list[int]:
        return list(self.val_sizes) if self.val_sizes is not None else [0] * self.n_clients

    def holdout(self, fraction: float, seed: int) -> FederatedData:
        """Hold out ``fraction`` of every client's training samples (chosen by a seeded
        shuffle, at least one, never all) as its validation part."""
        if fraction <= 0:
            return self
        idx, ys, sizes = [], [], []
        for c, (i, y) in enumerate(zip(self.train_idx, self.train_y, strict=True)):
            n = i.numel()
            if n < 2:
                raise ValueError(
                    f"invalid config key 'data.validation_fraction': client {c} has {n} "
                    "training sample(s), too few to hold any out"
                )
            g = torch.Generator().manual_seed(seed * 100_003 + c)
            perm = torch.randperm(n, generator=g)
            idx.append(i[perm])
            ys.append(y[perm])
            sizes.append(min(n - 1, max(1, round(fraction * n))))
        return replace(self, train_idx=idx, train_y=ys, val_sizes=sizes)

    def scored_on_validation(self) -> FederatedData:
        """The same clients, evaluated on their held-out validation parts instead of the
        test split (training never draws from those parts)."""
        sizes = self.validation_sizes()
        return replace(
            self,
            test_x=self.train_x,
            test_idx=[i[len(i) - v :] for i, v in zip(self.train_idx, sizes, strict=True)],
            test_y=[y[len(y) - v :] for y, v in zip(self.train_y, sizes, strict=True)],
        )

    def subset(self, clients: list[int]) -> FederatedData:
        """The data of ``clients`` only, with compacted feature pools (for one host)."""

        tr = [self.train_idx[c] for c in clients]
        te = [self.test_idx[c] for c in clients]
        train_x, tr = compact_rows(self.train_x, tr)
        test_x, te = compact_rows(self.test_x, te)
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
            val_sizes=[self.val_sizes[c] for c in clients] if self.val_sizes else None,
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
