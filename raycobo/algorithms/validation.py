"""Validation-based collaboration weights (CoBo Table 2, "Validation Based").

Wagner, Fan, Jaggi, "Personalized Collaborative Fine-Tuning for On-Device Large Language
Models" (COLM 2024): trust-weighted gradient aggregation with trust from validation
performance, the strategy CoBo compares against. Every ``trust_every`` rounds client i
evaluates every client's model on a minibatch of its own validation data, L_ij, and sets
w_i = softmax_j(-L_ij / tau) (``trust_temperature``); every round each client computes
its gradient at its own model and client i steps along the trust-weighted sum
x_i <- x_i - eta sum_j w_ij g_j(x_j).

Readings chosen: the softmax turns losses into trust (the reference normalises scores
into weights without fixing a temperature; tau = 0.1 makes a 0.1-nat loss gap a factor
e); trust starts as the identity (local training) and is first measured at round
``trust_every``: from one shared start with uniform trust every client would take the same
step forever and never tell its peers apart. Validation draws come from the client's
held-out data (stream VAL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps, all_clients
from raycobo.algorithms.common import FLOAT
from raycobo.algorithms.settings import MethodConfig


class ValidationConfig(MethodConfig):
    """Trust from validation losses (Wagner et al. 2024; CoBo Table 2's LLM baseline)."""

    name: Literal["validation_based"] = "validation_based"
    uses_validation: ClassVar[bool] = True  # trust from held-out losses
    trust_every: int = Field(default=10, ge=1, description="rounds between trust updates")
    trust_temperature: float = Field(default=0.1, gt=0, description="softmax temperature")


@dataclass
class TrustState:
    X: torch.Tensor  # (n, d)
    W: torch.Tensor  # (n, n) trust weights, rows sum to 1


class ValidationBased:
    name = "validation_based"

    def __init__(self, cfg: ValidationConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> TrustState:
        n = ops.n_clients
        X = ops.initial_params().expand(n, -1).clone()
        return TrustState(X, torch.eye(n, device=X.device))

    def trust(self, X: torch.Tensor, ops: ClientOps, t: int) -> torch.Tensor:
        """w_i = softmax(-L_i / tau), L_ij the loss of model j on client i's validation
        minibatch (the same minibatch for every j). -> (n, n)"""
        n = ops.n_clients
        clients = all_clients(ops).repeat_interleave(n)  # client i, n times
        models = all_clients(ops).repeat(n)  # model j
        L = ops.losses(clients, X[models], t, rng.VAL, 0).view(n, n)
        return torch.softmax(-L / self.cfg.trust_temperature, dim=1)

    def round(self, state: TrustState, t: int, ops: ClientOps) -> tuple[TrustState, dict]:
        c = self.cfg
        W = state.W
        n, d = state.X.shape
        models = 0
        if t > 0 and t % c.trust_every == 0:
            W = self.trust(state.X, ops, t)
            models = n * (n - 1)  # every model to every other client, to be validated
        G, loss = ops.grads(all_clients(ops), state.X, t, rng.STEP, 0)
        X = state.X - c.lr * (W.to(G.dtype) @ G)  # trust-weighted gradient aggregation
        # and each client gets the gradient of every peer it trusts (float32)
        grads = int(W.ne(0).sum()) - int(W.diagonal().ne(0).sum())
        return TrustState(X, W), {
            "train_loss": float(loss.mean()),
            "bytes_sent": float((models + grads) * d * FLOAT),
        }

    def eval_params(self, state: TrustState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: TrustState) -> torch.Tensor:
        return state.W
