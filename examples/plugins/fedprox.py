"""FedProx as a raycobo plugin: a method of your own in about 60 lines.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020,
https://arxiv.org/abs/1812.06127 -- every client runs ``local_steps`` SGD steps on
f_k(w) + mu/2 ||w - w^t||^2 from the global model w^t; the server averages the results
weighted by data size. With mu = 0 it is FedAvg (and gives FedAvg's numbers exactly).

Named in a config as ``algorithm.name: fedprox:FedProx`` (this file on the plugin path,
see fedprox.yaml); its settings are ``algorithm.mu`` and ``algorithm.local_steps``.

The round is written as plan -> apply (``raycobo.PlansRounds``): ``plan_round`` says
what to compute -- a ``LocalSGD`` request, which the Ray engine runs inside the hosts
that hold the data, one call for all the steps -- and ``apply_round`` averages what
came back. That is also what lets ``engine.rounds: stale`` apply a round's updates up
to ``engine.staleness`` rounds late (as FedAvg's: from the model they started from).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field

from raycobo import ClientOps, LocalSGD, MethodConfig, Plan, run_plan


class FedProxConfig(MethodConfig):
    """FedProx: local SGD with a proximal term toward the global model."""

    mu: float = Field(default=0.01, ge=0, description="mu: strength of the proximal term")
    local_steps: int = Field(default=5, ge=1, description="local SGD steps per round")


@dataclass
class FedProxState:
    w: torch.Tensor  # (d,) the global model
    n: int  # clients


class FedProx:
    name = "fedprox"
    Settings = FedProxConfig  # how raycobo validates algorithm.* for this method

    def __init__(self, cfg: FedProxConfig, rounds: int, seed: int):
        self.cfg = cfg

    def init(self, ops: ClientOps) -> FedProxState:
        return FedProxState(ops.initial_params().clone(), ops.n_clients)

    def round(self, state: FedProxState, t: int, ops: ClientOps):
        return run_plan(self, state, t, ops)  # plan, compute, apply

    def plan_round(self, state: FedProxState, t: int, ops: ClientOps) -> Plan:
        c, clients = self.cfg, torch.arange(ops.n_clients)
        start = state.w.expand(clients.numel(), -1)  # (n, d); stream 1: the model step's
        ahead = LocalSGD(clients, start, c.lr, c.local_steps, stream=1, prox=c.mu)
        return Plan(t, ahead=ahead, keep={"size": ops.data_sizes()})

    def apply_round(self, state: FedProxState, plan: Plan, now, arrived):
        w, losses = state.w, []
        for p, (Y, loss) in arrived:  # oldest first; in a synchronous round, this one's
            share = (p.keep["size"] / p.keep["size"].sum()).to(Y)
            if p.round == plan.round and not losses:  # started from this w
                w = share @ Y  # the data-size-weighted average, (d,)
            else:  # a late round's: its average update, from the w it started from
                w = w + (share @ Y - p.ahead.start[0])
            losses.append(loss)
        return FedProxState(w, state.n), (
            {"train_loss": float(torch.cat(losses).mean())} if losses else {}
        )

    def plan_refusal(self) -> None:
        return None  # late updates are fine with every setting

    def eval_params(self, state: FedProxState) -> torch.Tensor:
        return state.w.expand(state.n, -1)  # every client predicts with the global model

    def collaboration(self, state: FedProxState) -> None:
        return None
