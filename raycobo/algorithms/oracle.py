"""Oracle: FedAvg run separately inside each ground-truth cluster (CoBo Section 4.1).

Its collaboration matrix is the block-diagonal cluster indicator, the target that
CoBo's W should recover.
"""

from __future__ import annotations

from typing import Literal

import torch

from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import same_group_matrix, sample_clients
from raycobo.algorithms.ifca import ClusteredState, clustered_fedavg_step, n_true_clusters
from raycobo.algorithms.settings import ClientSampling, LocalTraining, MethodConfig


class OracleConfig(LocalTraining, ClientSampling, MethodConfig):
    """FedAvg inside each ground-truth cluster."""

    name: Literal["oracle"] = "oracle"


class Oracle:
    name = "oracle"

    def __init__(self, cfg: OracleConfig, rounds: int, seed: int):
        self.cfg, self.seed = cfg, seed

    def init(self, ops: ClientOps) -> ClusteredState:
        k = n_true_clusters(ops)
        ids = sorted(set(ops.clusters))
        assign = torch.tensor([ids.index(c) for c in ops.clusters], device=ops.device)
        x0 = ops.initial_params()
        return ClusteredState(x0.expand(k, -1).clone(), assign)

    def round(self, state: ClusteredState, t: int, ops: ClientOps) -> tuple[ClusteredState, dict]:
        clients = sample_clients(ops.n_clients, self.cfg.client_rate, self.seed, t)
        new, loss = clustered_fedavg_step(ops, state, clients.to(ops.device), self.cfg, t)
        return new, {"train_loss": float(loss.mean())}

    def eval_params(self, state: ClusteredState) -> torch.Tensor:
        return state.Theta[state.assign]

    def collaboration(self, state: ClusteredState) -> torch.Tensor:
        return same_group_matrix(state.assign)
