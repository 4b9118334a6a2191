"""Oracle: FedAvg run separately inside each ground-truth cluster (CoBo Section 4.1).

Its collaboration matrix is the block-diagonal cluster indicator, the target that
CoBo's W should recover.
"""

from __future__ import annotations

from typing import Literal

import torch

from raycobo.algorithms.base import ClientOps, Plan, run_plan
from raycobo.algorithms.common import FLOAT, apply_arrived, same_group_matrix, sample_clients
from raycobo.algorithms.ifca import (
    ClusteredState,
    clustered_request,
    clustered_update,
    n_true_clusters,
)
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
        return run_plan(self, state, t, ops)

    # -- PlansRounds: a round's updates may be applied late (engine.rounds: stale) --------
    def plan_refusal(self) -> None:
        return None

    def plan_round(self, state: ClusteredState, t: int, ops: ClientOps) -> Plan:
        """The sampled clients' local SGD from their clusters' models."""
        clients = sample_clients(ops.n_clients, self.cfg.client_rate, self.seed, t)
        ahead, keep = clustered_request(ops, state, clients.to(ops.device), self.cfg)
        return Plan(t, ahead, keep=keep)

    def apply_round(self, state: ClusteredState, plan: Plan, now, arrived: list):
        """Per cluster, the data-weighted average of its clients' end points where they
        started from these models; a late round's moves each cluster by the average
        update its clients made from the models they started from."""
        Theta, stats = apply_arrived(
            state.Theta,
            plan,
            arrived,
            lambda Theta, p, Y, fresh: clustered_update(Theta, p.keep, Y, fresh),
        )
        # each sampled client's cluster model down and its update back (float32)
        stats["bytes_sent"] = float(2 * plan.ahead.clients.numel() * Theta.shape[1] * FLOAT)
        return ClusteredState(Theta, state.assign), stats

    def eval_params(self, state: ClusteredState) -> torch.Tensor:
        return state.Theta[state.assign]

    def collaboration(self, state: ClusteredState) -> torch.Tensor:
        return same_group_matrix(state.assign)
