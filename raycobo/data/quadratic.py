"""The quadratic clusters of CoBo's Example 2.

K clusters with centres mu_k; client i in cluster k has
f_i(x) = a_i / 2 * ||x - mu_k||^2, minimised at mu_k with value 0, so
``f_i(x_i) - min f_i`` is just f_i(x_i). Stochastic gradients are
a_i (x - mu_k) + xi, xi ~ N(0, noise^2 I), drawn from hashed coordinates
(seed, round, client, stream, salt, coordinate), so every engine draws the same noise.

Keys: ``data.dim``, ``data.noise``, ``data.curvature`` (range of a_i, drawn uniformly),
``data.center_scale`` (mu_k ~ N(0, center_scale^2 I)), ``data.init_scale`` (x^0 ~
N(0, init_scale^2 I); 0 starts at the origin), ``data.partition.clients_per_cluster``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raycobo import rng
from raycobo.algorithms.base import Evaluation
from raycobo.config import DataConfig


@dataclass
class QuadraticProblem:
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


class QuadraticOps:
    """ClientOps for the quadratic task, in closed form (no data, no model)."""

    def __init__(
        self,
        problem: QuadraticProblem,
        seed: int,
        device: str | torch.device = "cpu",
        client_ids: torch.Tensor | None = None,
    ):
        self.p = problem
        # global ids used in the noise hash, so a host of a subset draws the same noise
        n = problem.n_clients
        self.ids = torch.arange(n) if client_ids is None else torch.as_tensor(client_ids)
        self.seed = seed
        self.device = torch.device(device)
        self.n_clients = problem.n_clients
        self.dim = problem.dim
        self.clusters = [int(c) for c in problem.cluster]
        self._mu = problem.optima().to(self.device)  # (n, d)
        self._a = problem.a.to(self.device)

    def initial_params(self) -> torch.Tensor:
        return self.p.x0.to(self.device).clone()

    def random_params(self, salt: int) -> torch.Tensor:
        coords = torch.arange(self.dim)
        scale = float(self.p.centers.std()) if self.p.centers.numel() > 1 else 1.0
        return (scale * rng.normal(self.seed, rng.INIT, salt, coords)).float().to(self.device)

    def data_sizes(self) -> torch.Tensor:
        return torch.ones(self.n_clients, device=self.device)

    def param_layout(self) -> list[tuple[int, int, int]]:
        return [(0, 1, self.dim)]  # one layer, one channel

    def loss_values(self, clients: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        """Exact f_i(z) - min f_i = a_i/2 ||z - mu_i||^2. -> (m,)"""
        diff = Z - self._mu[clients]
        return 0.5 * self._a[clients] * (diff * diff).sum(dim=1)

    def grads(self, clients, Z, round, stream, salt=0):
        clients = clients.to(self.device)
        G = self._a[clients, None] * (Z - self._mu[clients])  # (m, d) exact gradient
        if self.p.noise > 0:
            coords = torch.arange(self.dim).reshape(1, -1)
            ids = self.ids[clients.cpu()].reshape(-1, 1)
            keys = (self.seed, round, rng.column(stream), ids, rng.column(salt), coords)
            xi = rng.normal(*keys)  # (m, d)
            G = G + self.p.noise * xi.to(G.dtype).to(self.device)
        return G, self.loss_values(clients, Z)

    def losses(self, clients, Z, round, stream, salt=0):
        return self.loss_values(clients.to(self.device), Z)

    def evaluate(self, clients: torch.Tensor, Z: torch.Tensor) -> Evaluation:
        return Evaluation(loss=self.loss_values(clients.to(self.device), Z), accuracy=None)

    def evaluate_mixture(
        self, clients: torch.Tensor, Z: torch.Tensor, weights: torch.Tensor
    ) -> Evaluation:
        """A regression "mixture" predicts with the weighted parameter average. Z: (m, k, d)."""
        point = (weights.to(Z.dtype)[..., None] * Z).sum(dim=1)  # (m, d)
        return self.evaluate(clients, point)
