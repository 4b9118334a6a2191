"""FedProx as a raycobo plugin: a method of your own in about 50 lines.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020,
https://arxiv.org/abs/1812.06127 -- every client runs ``local_steps`` SGD steps on
f_k(w) + mu/2 ||w - w^t||^2 from the global model w^t; the server averages the results
weighted by data size. With mu = 0 it is FedAvg (and gives FedAvg's numbers exactly).

Named in a config as ``algorithm.name: fedprox:FedProx`` (this file on the plugin path,
see fedprox.yaml); its settings are ``algorithm.mu`` and ``algorithm.local_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field

from raycobo import ClientOps, MethodConfig


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
        c, clients = self.cfg, torch.arange(ops.n_clients, device=state.w.device)
        start = state.w.expand(clients.numel(), -1)  # (n, d)
        Y, first = start.clone(), None
        for s in range(c.local_steps):  # stream 1 = the model step's minibatches, salt s
            G, loss = ops.grads(clients, Y, t, 1, s)  # (n, d), (n,)
            Y -= c.lr * (G + c.mu * (Y - start))
            first = loss if first is None else first
        size = ops.data_sizes().to(Y.dtype)  # (n,)
        w = (size / size.sum()) @ Y  # data-size-weighted average, (d,)
        return FedProxState(w, state.n), {"train_loss": float(first.mean())}

    def eval_params(self, state: FedProxState) -> torch.Tensor:
        return state.w.expand(state.n, -1)  # every client predicts with the global model

    def collaboration(self, state: FedProxState) -> None:
        return None
