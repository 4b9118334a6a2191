"""ClientOps for the quadratic task of CoBo's Example 2 (``raycobo.data.quadratic``), in
closed form: exact gradients plus counter-based Gaussian noise, no data and no model."""

from __future__ import annotations

import torch

from raycobo import rng
from raycobo.algorithms.base import Evaluation
from raycobo.data.quadratic import QuadraticProblem


class QuadraticOps:
    """ClientOps for the quadratic task, in closed form (no data, no model)."""

    execution = None  # nothing to plan: no model, no batches

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
