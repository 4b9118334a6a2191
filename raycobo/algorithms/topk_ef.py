"""Top-K with error feedback (FedSep's communication baseline, Stich et al.): each client
adds its error memory to its local update, sends the K largest entries (value + index)
and keeps the rest as memory; the server averages the sparse updates and broadcasts the
(dense) result. Communication is counted in bytes of float32 values and int32 indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import (
    FLOAT,
    INDEX,
    local_updates,
    top_count,
    top_k,
)
from raycobo.algorithms.settings import (
    ClientSampling,
    LocalTraining,
    MethodConfig,
    ServerStep,
    TopKShare,
)


class TopKConfig(LocalTraining, ClientSampling, ServerStep, TopKShare, MethodConfig):
    """Top-K with error feedback (FedSep's communication baseline)."""

    name: Literal["topk_ef"] = "topk_ef"


@dataclass
class TopKState:
    x: torch.Tensor  # (d,) global model
    E: torch.Tensor  # (n, d) error memories


class TopKEF:
    name = "topk_ef"

    def __init__(self, cfg: TopKConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> TopKState:
        x = ops.initial_params().clone()
        return TopKState(x, torch.zeros(ops.n_clients, ops.dim, dtype=x.dtype, device=x.device))

    def round(self, state: TopKState, t: int, ops: ClientOps) -> tuple[TopKState, dict]:
        c = self.cfg
        d = ops.dim
        k = top_count(c, d)
        clients, delta, loss = local_updates(ops, state.x, c, self.seed, t)
        V = delta + state.E[clients]  # update plus memory
        sent = top_k(V, k)
        E = state.E.clone()
        E[clients] = V - sent
        update = sent.mean(dim=0)
        x = state.x + c.server_lr * update
        m = clients.numel()
        down = int((update != 0).sum())
        # up: k (value, index) pairs per client; down: the aggregate, dense or as pairs
        bytes_down = m * min(d * FLOAT, down * (FLOAT + INDEX))
        return TopKState(x, E), {
            "train_loss": float(loss.mean()),
            "bytes_sent": float(m * k * (FLOAT + INDEX) + bytes_down),
        }

    def eval_params(self, state: TopKState) -> torch.Tensor:
        return state.x.expand(state.E.shape[0], -1)

    def collaboration(self, state: TopKState) -> None:
        return None


# ---------------------------------------------------------------------------------------
# FedSep for model-heterogeneous FL (Section 4.2)
