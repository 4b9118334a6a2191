"""The quadratic clusters of CoBo's Example 2.

K clusters with centres mu_k; client i in cluster k has
f_i(x) = a_i / 2 * ||x - mu_k||^2, minimised at mu_k with value 0, so
``f_i(x_i) - min f_i`` is just f_i(x_i). Stochastic gradients are
a_i (x - mu_k) + xi, xi ~ N(0, noise^2 I), drawn from hashed coordinates
(seed, round, client, stream, salt, coordinate), so every engine draws the same noise.

Keys: ``data.dim``, ``data.noise``, ``data.curvature`` (range of a_i, drawn uniformly),
``data.center_scale`` (mu_k ~ N(0, center_scale^2 I)), ``data.init_scale`` (x^0 ~
N(0, init_scale^2 I); 0 starts at the origin), ``data.partition.clients_per_cluster``.
The engine that computes on it is ``raycobo.engine.quadratic.QuadraticOps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from raycobo.config import DataConfig


@dataclass
class QuadraticProblem:
    uses_model: ClassVar[bool] = False  # closed form: no network, no model.name
    reports_perplexity: ClassVar[bool] = False
    ops: ClassVar[str] = "quadratic"  # closed-form gradients (raycobo.engine.OPS)

    centers: torch.Tensor  # (K, d) mu_k
    cluster: torch.Tensor  # (n,) cluster of each client
    a: torch.Tensor  # (n,) curvature a_i
    noise: float
    x0: torch.Tensor  # (d,)

    @property
    def n_clients(self) -> int:
        return int(self.cluster.numel())

    @property
    def dim(self) -> int:
        return int(self.centers.shape[1])

    def optima(self) -> torch.Tensor:
        return self.centers[self.cluster]  # (n, d)

    def subset(self, clients: list[int]) -> QuadraticProblem:
        idx = torch.as_tensor(clients, dtype=torch.int64)
        return QuadraticProblem(self.centers, self.cluster[idx], self.a[idx], self.noise, self.x0)


def make_quadratic(cfg: DataConfig, seed: int) -> QuadraticProblem:
    sizes = cfg.partition.cluster_sizes()
    g = torch.Generator().manual_seed(seed)
    centers = cfg.center_scale * torch.randn(len(sizes), cfg.dim, generator=g)
    cluster = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    lo, hi = cfg.curvature
    a = lo + (hi - lo) * torch.rand(len(cluster), generator=g)
    x0 = cfg.init_scale * torch.randn(cfg.dim, generator=g)
    return QuadraticProblem(centers, cluster, a, cfg.noise, x0)
