"""IFCA: the Iterative Federated Clustering Algorithm.

Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, https://arxiv.org/abs/2006.04088 -- Algorithm 2 (model
averaging).

k cluster models, independently initialised. Each round every sampled client
(``client_rate``; the CoBo paper uses all clients cross-silo and 10 % cross-device)
evaluates every cluster model on a fresh minibatch of its data, joins the one with the
lowest loss, runs ``local_steps`` SGD steps on it, and the server averages each cluster
model over the clients that chose it. Clients predict with the model they last chose.
k = ``algorithm.num_clusters``, or the ground-truth number of clusters when null (the
advantage the CoBo paper gives IFCA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from raycobo import rng
from raycobo.algorithms.base import ClientOps, LocalSGD, compute
from raycobo.algorithms.common import (
    FLOAT,
    INDEX,
    LocalSteps,
    group_average,
    same_group_matrix,
    sample_clients,
)
from raycobo.algorithms.settings import ClientSampling, ClusterCount, LocalTraining, MethodConfig
from raycobo.settings import ConfigError


class IFCAConfig(LocalTraining, ClientSampling, ClusterCount, MethodConfig):
    """IFCA (Ghosh et al. 2020): k cluster models, each client picks the best."""

    name: Literal["ifca"] = "ifca"


@dataclass
class ClusteredState:
    Theta: torch.Tensor  # (k, d) cluster models
    assign: torch.Tensor  # (n,) cluster chosen by each client


def n_true_clusters(ops: ClientOps) -> int:
    if any(c is None for c in ops.clusters):
        raise ConfigError(
            "invalid config key 'algorithm.num_clusters': the data has no ground-truth "
            "clusters, so set it explicitly"
        )
    return len(set(ops.clusters))


def clustered_fedavg_step(
    ops: ClientOps,
    state: ClusteredState,
    clients: torch.Tensor,
    cfg: IFCAConfig,
    t: int,
) -> tuple[ClusteredState, torch.Tensor]:
    """Local SGD of ``clients`` from their assigned cluster models, then per-cluster
    data-weighted averaging. Returns the new state and the clients' losses."""
    req, keep = clustered_request(ops, state, clients, cfg)
    Y, loss = compute(ops, req, t)
    return ClusteredState(clustered_update(state.Theta, keep, Y, True), state.assign), loss


def clustered_request(
    ops: ClientOps, state: ClusteredState, clients: torch.Tensor, cfg: LocalSteps
) -> tuple[LocalSGD, dict[str, torch.Tensor]]:
    """The clients' local SGD from their assigned cluster models, and what the update
    reads besides (their groups, data sizes and the models they start from)."""
    groups = state.assign[clients]
    req = LocalSGD(clients, state.Theta[groups], cfg.lr, cfg.local_steps, rng.STEP)
    sizes = ops.data_sizes().to(state.Theta.device)[clients]
    return req, {"groups": groups, "sizes": sizes, "theta": state.Theta}


def clustered_update(
    Theta: torch.Tensor, keep: dict[str, torch.Tensor], Y: torch.Tensor, fresh: bool
) -> torch.Tensor:
    """Per cluster, the data-weighted average of its clients' end points Y where they
    started from ``Theta`` (``fresh``); else ``Theta`` moved by the average update they
    made from the models they started from (a late round's)."""
    g, sizes, start = keep["groups"], keep["sizes"], keep["theta"]
    k = Theta.shape[0]
    if fresh:
        return group_average(Y, g, sizes, k, Theta)
    return Theta + (group_average(Y, g, sizes, k, start) - start)


def choose_clusters(
    ops: ClientOps, Theta: torch.Tensor, clients: torch.Tensor, t: int
) -> torch.Tensor:
    """argmin_j f_i(theta_j) on a fresh minibatch, for each client. -> (m,)"""
    k, m = Theta.shape[0], clients.numel()
    cl = clients.repeat_interleave(k)  # (m*k,)
    pts = Theta.repeat(m, 1)  # (m*k, d): client-major, cluster-minor
    # the same minibatch for all k candidate models of a client: salt 0
    L = ops.losses(cl, pts, t, rng.LOSS, 0).view(m, k)
    return L.argmin(dim=1)


class IFCA:
    name = "ifca"

    def __init__(self, cfg: IFCAConfig, rounds: int, seed: int):
        self.cfg, self.seed = cfg, seed

    def init(self, ops: ClientOps) -> ClusteredState:
        k = self.cfg.num_clusters or n_true_clusters(ops)
        Theta = torch.stack([ops.random_params(1000 + j) for j in range(k)])
        assign = choose_clusters(ops, Theta, torch.arange(ops.n_clients, device=Theta.device), -1)
        return ClusteredState(Theta, assign)

    def round(self, state: ClusteredState, t: int, ops: ClientOps) -> tuple[ClusteredState, dict]:
        clients = sample_clients(ops.n_clients, self.cfg.client_rate, self.seed, t)
        clients = clients.to(state.Theta.device)
        assign = state.assign.clone()
        assign[clients] = choose_clusters(ops, state.Theta, clients, t)
        new, loss = clustered_fedavg_step(
            ops, ClusteredState(state.Theta, assign), clients, self.cfg, t
        )
        used = int(torch.unique(assign).numel())
        # each sampled client gets every cluster model and sends back its update and the
        # cluster it chose (float32 numbers, an index)
        k, d = state.Theta.shape
        sent = clients.numel() * ((k + 1) * d * FLOAT + INDEX)
        stats = {"train_loss": float(loss.mean()), "clusters_used": float(used)}
        return new, {**stats, "bytes_sent": float(sent)}

    def eval_params(self, state: ClusteredState) -> torch.Tensor:
        return state.Theta[state.assign]

    def collaboration(self, state: ClusteredState) -> torch.Tensor:
        return same_group_matrix(state.assign)
