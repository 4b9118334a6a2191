"""Ditto: personal models regularised toward a FedAvg global model.

Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, https://arxiv.org/abs/2012.04221 -- Algorithm 1.

Each round the sampled clients (i) run FedAvg's local steps on the global model w and
(ii) update their personal model v_k <- v_k - eta * (grad f_k(v_k) + lambda (v_k - w^t)),
with w^t the global model at the start of the round. lambda = 1 by default, as the
CoBo paper (Appendix B) uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import local_sgd, sample_clients
from raycobo.algorithms.fedavg import fedavg_round
from raycobo.algorithms.settings import ClientSampling, LocalTraining, MethodConfig


class DittoConfig(LocalTraining, ClientSampling, MethodConfig):
    """Ditto (Li et al. 2021): FedAvg plus personal models pulled toward it."""

    name: Literal["ditto"] = "ditto"
    lam: float = Field(default=1.0, ge=0, description="lambda: pull toward the global model")


@dataclass
class DittoState:
    w: torch.Tensor  # (d,) global model
    V: torch.Tensor  # (n, d) personal models


class Ditto:
    name = "ditto"

    def __init__(self, cfg: DittoConfig, rounds: int, seed: int):
        self.cfg, self.seed = cfg, seed

    def init(self, ops: ClientOps) -> DittoState:
        x0 = ops.initial_params()
        return DittoState(x0.clone(), x0.expand(ops.n_clients, -1).clone())

    def round(self, state: DittoState, t: int, ops: ClientOps) -> tuple[DittoState, dict]:
        c = self.cfg
        w_new, _ = fedavg_round(ops, state.w, c, self.seed, t, rng.GLOBAL)
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(state.w.device)
        V = state.V.clone()
        # personal steps toward w^t: v <- v - lr (g + lam (v - w^t))
        Vk, loss = local_sgd(
            ops, clients, V[clients], c.lr, c.local_steps, t, rng.STEP, c.lam, state.w
        )
        V[clients] = Vk
        return DittoState(w_new, V), {"train_loss": float(loss.mean())}

    def eval_params(self, state: DittoState) -> torch.Tensor:
        return state.V

    def collaboration(self, state: DittoState) -> None:
        return None
