"""FedAvg.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, https://arxiv.org/abs/1602.05629.

Each round the sampled clients (``client_rate``) run ``local_steps`` SGD steps from the
global model; the server sets the global model to the data-size-weighted average.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from raycobo import rng
from raycobo.algorithms.base import (
    Answer,
    ClientOps,
    Gradients,
    LocalSGD,
    Plan,
    run_plan,
)
from raycobo.algorithms.common import apply_arrived, sample_clients, weighted_average
from raycobo.algorithms.settings import ClientSampling, LocalTraining, MethodConfig


class FedAvgConfig(LocalTraining, ClientSampling, MethodConfig):
    """FedAvg: the sampled clients' local SGD, averaged by data size."""

    name: Literal["fedavg"] = "fedavg"


@dataclass
class FedAvgState:
    x: torch.Tensor  # (d,) global model
    n: int  # number of clients
    X: torch.Tensor | None = None  # (n, d) personal copies once fine-tuning started


def fedavg_request(
    ops: ClientOps, x: torch.Tensor, cfg: FedAvgConfig, seed: int, t: int, stream: int
) -> Gradients | LocalSGD:
    """Round t's work from global model x (d,): the sampled clients' gradients at x (one
    local step) or their local SGD from x."""
    clients = sample_clients(ops.n_clients, cfg.client_rate, seed, t).to(x.device)
    start = x.expand(clients.numel(), -1)  # (m, d) view, no copy
    if cfg.local_steps == 1:
        return Gradients(clients, start, stream, 0)
    return LocalSGD(clients, start, cfg.lr, cfg.local_steps, stream)


def fedavg_arrived(
    x: torch.Tensor, plan: Plan, arrived: list[tuple[Plan, Answer]], lr: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """The global model after the FedAvg updates that arrived (``apply_arrived`` with
    ``fedavg_update``; each plan keeps its clients' training-set ``sizes``)."""
    return apply_arrived(
        x,
        plan,
        arrived,
        lambda x, p, out, fresh: fedavg_update(x, p.ahead, out, p.keep["sizes"], lr, fresh),
    )


def fedavg_update(
    x: torch.Tensor, request: Gradients | LocalSGD, out: torch.Tensor, sizes, lr: float, fresh: bool
) -> torch.Tensor:
    """The global model after a round's answers ``out`` (gradients or end points) from
    clients of training-set ``sizes``. One step: x - lr avg(g), avg_k(x - lr g_k) without
    the m copies (an older round's gradients, taken at an older x: asynchronous SGD).
    Local SGD: the average end point where they started from this x (``fresh``), else x
    plus the average update they made from their own start."""
    sizes = sizes.to(x.device)
    if isinstance(request, Gradients):
        return x - lr * weighted_average(out, sizes)
    if fresh:
        return weighted_average(out, sizes)
    return x + (weighted_average(out, sizes) - request.start[0])


class FedAvg:
    name = "fedavg"

    def __init__(self, cfg: FedAvgConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> FedAvgState:
        return FedAvgState(ops.initial_params().clone(), ops.n_clients)

    def round(self, state: FedAvgState, t: int, ops: ClientOps) -> tuple[FedAvgState, dict]:
        return run_plan(self, state, t, ops)

    # -- PlansRounds: a round's updates may be applied late (engine.rounds: stale) --------
    def plan_refusal(self) -> str | None:
        return None

    def plan_round(self, state: FedAvgState, t: int, ops: ClientOps) -> Plan:
        req = fedavg_request(ops, state.x, self.cfg, self.seed, t, rng.STEP)
        return Plan(t, ahead=req, keep={"sizes": ops.data_sizes()[req.clients.cpu()]})

    def apply_round(
        self, state: FedAvgState, plan: Plan, now, arrived: list[tuple[Plan, Answer]]
    ) -> tuple[FedAvgState, dict]:
        """The arrived rounds' updates, oldest first; the clients' first-step losses of
        those rounds (none arrived: no train_loss this round)."""
        x, stats = fedavg_arrived(state.x, plan, arrived, self.cfg.lr)
        m = plan.ahead.clients.numel()
        stats["bytes_sent"] = float(2 * m * x.shape[0] * 4)  # the model down and back
        return FedAvgState(x, state.n, state.X), stats

    def eval_params(self, state: FedAvgState) -> torch.Tensor:
        if state.X is not None:
            return state.X
        return state.x.expand(state.n, -1)

    def collaboration(self, state: FedAvgState) -> None:
        return None
