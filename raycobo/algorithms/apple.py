"""APPLE: each client learns a directed mixture of every client's core model.

Luo, Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated
Learning", IJCAI 2022, https://arxiv.org/abs/2110.08394 -- Algorithm 1, and the authors'
code (ljaiverson/pFL-APPLE, train_APPLE.py, utils/apple.py, utils/losses.py).

Every client i keeps a core model c_i (on the server, shared) and a directed relationship
vector p_i in R^n (its own). Its personal model is theta_i = sum_j p_ij c_j. Each round a
sampled client downloads the cores and takes ``local_steps`` SGD steps on

    L_i(theta_i) + mu(t) ||p_i - p^0||^2

in its own core c_i and in p_i (the other cores frozen): with g the minibatch gradient at
theta_i, c_i moves along p_ii g (step ``lr``) and p_ij along <g, c_j> + 2 mu(t)(p_ij -
p^0_j) (step ``p_lr``); it uploads c_i. p^0 are the clients' shares of the training
samples (every p_i starts there); mu(t) decays from ``mu`` to 0 over the first
``mu_rounds`` share of the rounds: exponentially (mu 0.001^(t / T_mu), the code's default)
or along a half cosine, and is 0 afterwards.

Readings chosen: the cores start from independent initialisations, as the code's (one
network built per client); the steps are plain SGD where the code uses momentum 0.9 with
step sizes 0.01 (cores) and 0.001 (p): ``lr`` 0.1 and ``p_lr`` 0.01 are those steps'
size with the momentum's 1 / (1 - 0.9) folded in; a client's personal model (what it
evaluates) mixes the latest cores. Every client downloads every core (the code's default;
its limited-bandwidth mode is not offered). P (the rows p_i) is the method's
collaboration matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import FLOAT, sample_clients
from raycobo.algorithms.settings import ClientSampling, LocalTraining, MethodConfig

FLOOR = 0.001  # the exponential schedule's mu(T_mu) / mu (the code's epsilon)


class APPLEConfig(LocalTraining, ClientSampling, MethodConfig):
    """APPLE (Luo and Wu 2022): personal models as learned mixtures of all clients'
    core models."""

    name: Literal["apple"] = "apple"
    p_lr: float = Field(default=0.01, gt=0, description="the relationship vectors' step size")
    mu: float = Field(default=0.1, ge=0, description="mu: the pull of p_i toward p^0 at round 0")
    mu_rounds: float = Field(
        default=0.1, gt=0, le=1, description="the share of the rounds over which mu decays to 0"
    )
    mu_schedule: Literal["exponential", "cosine"] = Field(
        default="exponential", description="how mu decays: mu 0.001^(t / T_mu), or a half cosine"
    )


def mu_at(cfg: APPLEConfig, rounds: int, t: int) -> float:
    """mu(t): from ``mu`` at round 0 down to 0 over the first ``mu_rounds`` share."""
    span = int(rounds * cfg.mu_rounds)
    if cfg.mu == 0 or t >= span:
        return 0.0
    if cfg.mu_schedule == "cosine":
        return (math.cos(math.pi * t / span) + 1.0) / 2.0 * cfg.mu
    return FLOOR ** (t / span) * cfg.mu


@dataclass
class APPLEState:
    C: torch.Tensor  # (n, d) the clients' core models
    P: torch.Tensor  # (n, n) the directed relationship vectors, row i client i's
    p0: torch.Tensor  # (n,) the clients' sample shares


def local_steps(
    ops, clients, C, P, p0, cfg: APPLEConfig, mu: float, t: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled clients' steps on their own cores and relationship vectors, the other
    cores frozen. -> (cores (m, d), rows of P (m, n), the first step's losses (m,))"""
    m = clients.numel()
    own = torch.arange(m, device=C.device)
    c, p = C[clients].clone(), P[clients].clone()
    first = None
    for s in range(cfg.local_steps):
        theta = p @ C + p[own, clients, None] * (c - C[clients])  # own core as it now is
        G, losses = ops.grads(clients, theta, t, rng.STEP, s)
        G = G.to(C.dtype)
        grad_p = G @ C.T  # <g, c_j>, the own column corrected below
        grad_p[own, clients] = (G * c).sum(1)
        grad_p += 2.0 * mu * (p - p0)
        c = c - cfg.lr * p[own, clients, None] * G
        p = p - cfg.p_lr * grad_p
        first = losses if first is None else first
    return c, p, first


class APPLE:
    name = "apple"

    def __init__(self, cfg: APPLEConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> APPLEState:
        n = ops.n_clients
        C = torch.stack([ops.random_params(i) for i in range(n)])  # one network per client
        sizes = ops.data_sizes().to(C.dtype)
        p0 = sizes / sizes.sum()
        return APPLEState(C, p0.expand(n, -1).clone(), p0)

    def round(self, state: APPLEState, t: int, ops: ClientOps) -> tuple[APPLEState, dict]:
        c = self.cfg
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(state.C.device)
        mu = mu_at(c, self.rounds, t)
        cores, rows, losses = local_steps(ops, clients, state.C, state.P, state.p0, c, mu, t)
        C, P = state.C.clone(), state.P.clone()
        C[clients], P[clients] = cores, rows
        # each sampled client downloads the others' cores and uploads its own, float32
        n, d = C.shape
        sent = clients.numel() * n * d * FLOAT
        return APPLEState(C, P, state.p0), {
            "train_loss": float(losses.mean()),
            "bytes_sent": float(sent),
        }

    def eval_params(self, state: APPLEState) -> torch.Tensor:
        return state.P @ state.C

    def collaboration(self, state: APPLEState) -> torch.Tensor:
        return state.P
