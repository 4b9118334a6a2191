"""Federated Clustering (FC).

Werner, He, Karimireddy, Jaggi, Stich, "Provably Personalized and Robust Federated
Learning", TMLR 2023, https://arxiv.org/abs/2306.08393 -- Algorithm 1.

Every round each client j computes its stochastic gradient at every client i's model,
g_ij = grad f_j(x_i) (O(n^2) gradient evaluations). Client i aggregates
{g_ij}_j with *threshold clustering* around its own gradient:
v <- g_ii; repeat ``fc_iters`` times: v <- (1/n) sum_j [g_ij if ||g_ij - v|| <= tau_i else v],
then x_i <- x_i - eta * v. The clients j inside the radius form row i of the
collaboration matrix.

Reading chosen: the CoBo paper gives FC "the ground-truth number of clusters and size of
clusters" (Appendix B). With ``fc_threshold`` null, tau_i is the distance from g_ii to
its c-th nearest gradient, c = round(n / k) the mean cluster size for k clusters
(``num_clusters`` or the ground truth), so each client's radius admits about one
cluster. A fixed ``fc_threshold`` uses the paper's constant radius instead. The
momentum of the original algorithm is omitted (plain SGD, like the other baselines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import FLOAT
from raycobo.algorithms.ifca import n_true_clusters
from raycobo.algorithms.settings import ClusterCount, MethodConfig


class FCConfig(ClusterCount, MethodConfig):
    """Federated clustering (Werner et al. 2023)."""

    name: Literal["fc"] = "fc"
    fc_threshold: float | None = Field(default=None, gt=0, description="merge threshold")
    fc_iters: int = Field(default=3, ge=1, description="clustering iterations per round")


@dataclass
class FCState:
    X: torch.Tensor  # (n, d)
    W: torch.Tensor  # (n, n) last threshold-clustering membership


def threshold_cluster(
    G: torch.Tensor, own: int, tau: float | None, c: int, iters: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Threshold clustering of the gradients G (n, d) around G[own].

    Returns the aggregate v (d,) and the membership mask (n,)."""
    v = G[own]
    dist = (G - v).norm(dim=1)  # (n,)
    if tau is None:
        tau = float(dist.sort().values[min(c, G.shape[0]) - 1])
    inside = dist <= tau
    for _ in range(iters):
        dist = (G - v).norm(dim=1)
        inside = dist <= tau
        v = torch.where(inside[:, None], G, v).mean(dim=0)
    return v, inside


class FederatedClustering:
    name = "fc"

    def __init__(self, cfg: FCConfig, rounds: int, seed: int):
        self.cfg = cfg

    def init(self, ops: ClientOps) -> FCState:
        n = ops.n_clients
        X = ops.initial_params().expand(n, -1).clone()
        return FCState(X, torch.ones(n, n, device=X.device))

    def round(self, state: FCState, t: int, ops: ClientOps) -> tuple[FCState, dict]:
        c = self.cfg
        n = ops.n_clients
        k = c.num_clusters or n_true_clusters(ops)
        size = max(1, round(n / k))
        X = state.X.clone()
        W = torch.zeros(n, n, device=X.device)
        others = torch.arange(n, device=X.device)
        losses = []
        for i in range(n):  # row i: every client's gradient at x_i
            G, loss = ops.grads(others, state.X[i].expand(n, -1), t, rng.CROSS, i)  # (n, d)
            v, inside = threshold_cluster(G, i, c.fc_threshold, size, c.fc_iters)
            X[i] = state.X[i] - c.lr * v
            W[i] = inside.to(W.dtype)
            losses.append(loss[i])
        stats = {"train_loss": float(torch.stack(losses).mean()), "cross_grads": float(n * n)}
        # every model to every other client and its gradient there back (float32)
        stats["bytes_sent"] = float(2 * n * (n - 1) * X.shape[1] * FLOAT)
        return FCState(X, W), stats

    def eval_params(self, state: FCState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: FCState) -> torch.Tensor:
        return state.W
