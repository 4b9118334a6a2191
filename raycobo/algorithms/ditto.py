"""Ditto: personal models regularised toward a FedAvg global model.

Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, https://arxiv.org/abs/2012.04221 -- Algorithm 1.

Each round the sampled clients (i) run FedAvg's local steps on the global model w and
(ii) update their personal model v_k <- v_k - eta * (grad f_k(v_k) + lambda (v_k - w^t)),
with w^t the global model at the start of the round. lambda = 1 by default, as the
CoBo paper (Appendix B) uses. It plans its rounds (``PlansRounds``): the global model's
FedAvg updates may arrive late (``engine.rounds: stale``), the personal steps are
needed by the round itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import Answer, ClientOps, LocalSGD, Plan, run_plan
from raycobo.algorithms.common import FLOAT, sample_clients
from raycobo.algorithms.fedavg import fedavg_arrived, fedavg_request
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
        return run_plan(self, state, t, ops)

    # -- PlansRounds: the global model's updates may be applied late -------------------
    def plan_refusal(self) -> str | None:
        return None

    def plan_round(self, state: DittoState, t: int, ops: ClientOps) -> Plan:
        """The sampled clients' FedAvg work on w (ahead) and their personal steps toward
        w^t, v <- v - lr (g + lam (v - w^t)) (now)."""
        c = self.cfg
        ahead = fedavg_request(ops, state.w, c, self.seed, t, rng.GLOBAL)
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(state.w.device)
        now = LocalSGD(clients, state.V[clients], c.lr, c.local_steps, rng.STEP, c.lam, state.w)
        return Plan(t, ahead, now, {"sizes": ops.data_sizes()[ahead.clients.cpu()]})

    def apply_round(
        self, state: DittoState, plan: Plan, now: Answer | None, arrived: list
    ) -> tuple[DittoState, dict]:
        """w after the arrived FedAvg updates (FedAvg's rule), the personal models of the
        round's clients from its own answer; the personal steps' first losses."""
        w, _ = fedavg_arrived(state.w, plan, arrived, self.cfg.lr)
        assert now is not None and plan.now is not None
        V = state.V.clone()
        V[plan.now.clients] = now[0]
        # the global model down to each of FedAvg's clients and its update back (the
        # personal models stay with their clients); float32
        sent = 2 * plan.ahead.clients.numel() * w.shape[0] * FLOAT
        return DittoState(w, V), {"train_loss": float(now[1].mean()), "bytes_sent": float(sent)}

    def eval_params(self, state: DittoState) -> torch.Tensor:
        return state.V

    def collaboration(self, state: DittoState) -> None:
        return None
