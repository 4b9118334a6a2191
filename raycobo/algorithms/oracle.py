"""Oracle: FedAvg run separately inside each ground-truth cluster (CoBo Section 4.1).

Its collaboration matrix is the block-diagonal cluster indicator, the target that
CoBo's W should recover.
"""

from __future__ import annotations

from typing import Literal

import torch

from raycobo import rng
from raycobo.algorithms.base import ClientOps, LocalSGD, Plan, run_plan
from raycobo.algorithms.common import group_average, same_group_matrix, sample_clients
from raycobo.algorithms.ifca import ClusteredState, n_true_clusters
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
        c = self.cfg
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(ops.device)
        groups = state.assign[clients]
        ahead = LocalSGD(clients, state.Theta[groups], c.lr, c.local_steps, rng.STEP)
        sizes = ops.data_sizes().to(state.Theta.device)[clients]
        return Plan(t, ahead, keep={"groups": groups, "sizes": sizes, "theta": state.Theta})

    def apply_round(self, state: ClusteredState, plan: Plan, now, arrived: list):
        """Per cluster, the data-weighted average of its clients' end points where they
        started from these models; a late round's moves each cluster by the average
        update its clients made from the models they started from."""
        Theta, losses = state.Theta, []
        k = Theta.shape[0]
        for p, (Y, loss) in arrived:
            g, sizes, start = p.keep["groups"], p.keep["sizes"], p.keep["theta"]
            if p.round == plan.round and not losses:  # started from these models
                Theta = group_average(Y, g, sizes, k, Theta)
            else:
                Theta = Theta + (group_average(Y, g, sizes, k, start) - start)
            losses.append(loss)
        stats = {"train_loss": float(torch.cat(losses).mean())} if losses else {}
        return ClusteredState(Theta, state.assign), stats

    def eval_params(self, state: ClusteredState) -> torch.Tensor:
        return state.Theta[state.assign]

    def collaboration(self, state: ClusteredState) -> torch.Tensor:
        return same_group_matrix(state.assign)
