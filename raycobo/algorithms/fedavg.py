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
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import local_sgd, sample_clients, weighted_average
from raycobo.algorithms.settings import ClientSampling, LocalTraining, MethodConfig


class FedAvgConfig(LocalTraining, ClientSampling, MethodConfig):
    """FedAvg: the sampled clients' local SGD, averaged by data size."""

    name: Literal["fedavg"] = "fedavg"


@dataclass
class FedAvgState:
    x: torch.Tensor  # (d,) global model
    n: int  # number of clients
    X: torch.Tensor | None = None  # (n, d) personal copies once fine-tuning started


def fedavg_round(
    ops: ClientOps, x: torch.Tensor, cfg: FedAvgConfig, seed: int, t: int, stream: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One FedAvg round from global model x (d,). Returns (new x, client losses)."""
    clients = sample_clients(ops.n_clients, cfg.client_rate, seed, t).to(x.device)
    sizes = ops.data_sizes().to(x.device)[clients]
    start = x.expand(clients.numel(), -1)  # (m, d) view, no copy
    if cfg.local_steps == 1:  # avg_k(x - eta g_k) = x - eta avg_k(g_k): skip the m copies
        G, loss = ops.grads(clients, start, t, stream, 0)
        return x - cfg.lr * weighted_average(G, sizes), loss
    Y, loss = local_sgd(ops, clients, start, cfg.lr, cfg.local_steps, t, stream)
    return weighted_average(Y, sizes), loss


class FedAvg:
    name = "fedavg"

    def __init__(self, cfg: FedAvgConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> FedAvgState:
        return FedAvgState(ops.initial_params().clone(), ops.n_clients)

    def round(self, state: FedAvgState, t: int, ops: ClientOps) -> tuple[FedAvgState, dict]:
        x, loss = fedavg_round(ops, state.x, self.cfg, self.seed, t, rng.STEP)
        sent = float(2 * loss.numel() * ops.dim * 4)  # the model down and back, float32
        return FedAvgState(x, state.n), {"train_loss": float(loss.mean()), "bytes_sent": sent}

    def eval_params(self, state: FedAvgState) -> torch.Tensor:
        if state.X is not None:
            return state.X
        return state.x.expand(state.n, -1)

    def collaboration(self, state: FedAvgState) -> None:
        return None
