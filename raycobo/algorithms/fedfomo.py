"""FedFomo: each client mixes in the peers' models that lower its validation loss.

Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with First Order
Model Optimization", ICLR 2021, https://arxiv.org/abs/2012.08565 -- Algorithm 1, Eq. 5-7.

The server keeps every client's latest model and an affinity matrix P (n x n, the
identity at first). Each round every sampled client i receives M peers' models, chosen
epsilon-greedily from its row of P: each of the M picks is, with probability
epsilon_t = max(epsilon - t * epsilon_decay, 0), a peer drawn uniformly from those not yet
picked, else the not yet picked peer of highest affinity. On a minibatch of its held-out
validation data it weighs each peer model theta_j against its own theta_i,

    w_j = (L(theta_i) - L(theta_j)) / (||theta_j - theta_i|| + 1e-5),

adds the raw w_j to P[i, j], and (where some w_j > 0) moves to

    theta_i + sum_j w+_j (theta_j - theta_i) / sum_j w+_j,   w+ = max(w, 0),

the mean of the helpful peers' models weighted by w+ (with no helpful peer it keeps
theta_i); then it takes ``local_steps`` SGD steps from there and uploads the end point.

Readings chosen: the M peers exclude the client itself (its own model is the baseline
every w is measured against, as in the official code; PFLlib's top-M includes it);
M = 5 (PFLlib's default; the official code's config has 8); epsilon 0.3 decayed by 0.05
a round (the official code's; PFLlib has no exploration: ``epsilon: 0``); P adds the raw
w (PFLlib's; the official code adds w divided by |sum_j w_j|); the validation loss is
one minibatch of the held-out share (the official code reads the whole held-out set).
P (rows of the clients sampled so far) is the method's collaboration matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from pydantic import Field, model_validator

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import FLOAT, local_sgd, sample_clients
from raycobo.algorithms.settings import ClientSampling, LocalTraining, MethodConfig

EPS_NORM = 1e-5  # added to ||theta_j - theta_i|| (the authors' codes')
DECAY = 0.05  # epsilon's decay a round in the official code


class FedFomoConfig(LocalTraining, ClientSampling, MethodConfig):
    """FedFomo (Zhang et al. 2021): each client moves toward the peers' models that
    lower its validation loss, weighted by the loss drop per unit of distance."""

    name: Literal["fedfomo"] = "fedfomo"
    uses_validation: ClassVar[bool] = True  # weighs the peers' models on held-out data
    peers: int = Field(default=5, ge=1, description="M: the peers' models a client receives")
    epsilon: float = Field(
        default=0.3, ge=0, le=1, description="epsilon: the chance a pick explores at round 0"
    )
    epsilon_decay: float | None = Field(
        default=None,
        ge=0,
        description="what epsilon loses each round, down to 0 (null: 0.05; only where epsilon > 0)",
    )

    @model_validator(mode="after")
    def _decay_of_some_exploration(self) -> FedFomoConfig:
        if self.epsilon == 0 and self.epsilon_decay is not None:
            raise ValueError(
                "epsilon_decay: with epsilon 0 nothing explores and it does nothing: drop it"
            )
        return self

    def effective(self) -> dict:
        """The settings with the decay's null written out where it applies."""
        out = self.model_dump(mode="json")
        out["epsilon_decay"] = decay(self)
        return out


def decay(cfg: FedFomoConfig) -> float | None:
    """epsilon's decay a round: the one set, the official code's 0.05, or (no
    exploration) none."""
    if cfg.epsilon == 0:
        return None
    return DECAY if cfg.epsilon_decay is None else cfg.epsilon_decay


@dataclass
class FedFomoState:
    X: torch.Tensor  # (n, d) every client's latest model
    P: torch.Tensor  # (n, n) affinity: the sum of each client's weights of each peer


def pick_peers(
    P: torch.Tensor, rows: torch.Tensor, count: int, epsilon: float, seed: int, t: int
) -> torch.Tensor:
    """The peers each client of ``rows`` (m,) receives at round t: ``count`` distinct
    clients other than itself (all of them when fewer), each pick exploring (a uniform
    draw among the rest) with probability ``epsilon``, else the rest's highest in P
    (ties broken by a random order, as the official code's). -> (m, count) client ids"""
    m, n, ids = rows.numel(), P.shape[0], rows.cpu()
    count = min(count, n - 1)
    taken = torch.zeros(m, n, dtype=torch.bool)
    taken[torch.arange(m), ids] = True
    order = rng.uniform(seed, rng.SAMPLER, t, ids[:, None], torch.arange(n), 0xF0)
    explore = rng.uniform(seed, rng.SAMPLER, t, ids[:, None], torch.arange(count), 0xF1)
    affinity = P[rows].cpu().to(torch.float64)
    picks = []
    for k in range(count):
        rest = affinity.masked_fill(taken, float("-inf"))
        top = rest == rest.max(1, keepdim=True).values  # ties broken at random
        best = order.masked_fill(~top, -1.0).argmax(1)
        drawn = order.masked_fill(taken, -1.0).argmax(1)
        pick = torch.where(explore[:, k] < epsilon, drawn, best)
        taken[torch.arange(m), pick] = True
        picks.append(pick)
    return torch.stack(picks, 1).to(rows.device) if picks else rows.new_zeros(m, 0)


def fomo_weights(loss_own: torch.Tensor, loss_peers: torch.Tensor, dist: torch.Tensor):
    """w = (L(theta_i) - L(theta_j)) / (||theta_j - theta_i|| + 1e-5); loss_own: (m,),
    loss_peers and dist: (m, M) -> (m, M)"""
    return (loss_own[:, None] - loss_peers) / (dist + EPS_NORM)


def fomo_start(own: torch.Tensor, peers: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """theta_i + sum_j w+_j (theta_j - theta_i) / sum_j w+_j (theta_i where no w_j > 0).
    own: (m, d), peers: (m, M, d), w: (m, M) -> (m, d)"""
    pos = w.clamp(min=0).to(own.dtype)
    mass = pos.sum(1, keepdim=True)
    share = torch.where(mass > 0, pos / mass.clamp(min=torch.finfo(own.dtype).tiny), 0.0)
    return own + torch.einsum("mk,mkd->md", share, peers - own[:, None])


class FedFomo:
    name = "fedfomo"

    def __init__(self, cfg: FedFomoConfig, rounds: int, seed: int):
        self.cfg, self.seed = cfg, seed

    def init(self, ops: ClientOps) -> FedFomoState:
        x0 = ops.initial_params()
        n = ops.n_clients
        return FedFomoState(
            x0.expand(n, -1).clone(), torch.eye(n, dtype=x0.dtype, device=x0.device)
        )

    def round(self, state: FedFomoState, t: int, ops: ClientOps) -> tuple[FedFomoState, dict]:
        """The sampled clients' peers, their weights on validation data, the move toward
        the helpful ones, then local steps from there."""
        c, X = self.cfg, state.X
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(X.device)
        epsilon = max(c.epsilon - t * (decay(c) or 0.0), 0.0)
        peers = pick_peers(state.P, clients, c.peers, epsilon, self.seed, t)  # (m, M)
        m, k = peers.shape
        P = state.P.clone()
        start = X[clients]
        if k:
            # each client's own model and its peers' on the same validation minibatch
            asked = torch.cat([clients[:, None], peers], 1)  # (m, 1 + M)
            L = ops.losses(clients.repeat_interleave(k + 1), X[asked.reshape(-1)], t, rng.VAL)
            L = L.view(m, k + 1).to(X.dtype)
            dist = torch.linalg.vector_norm(X[peers] - start[:, None], dim=2)
            w = fomo_weights(L[:, 0], L[:, 1:], dist)
            P[clients[:, None], peers] += w.to(P.dtype)
            start = fomo_start(start, X[peers], w)
        ends, losses = local_sgd(ops, clients, start, c.lr, c.local_steps, t, rng.STEP)
        X = X.clone()
        X[clients] = ends
        # each sampled client's M peer models down and its model back, float32
        sent = clients.numel() * (k + 1) * X.shape[1] * FLOAT
        return FedFomoState(X, P), {"train_loss": float(losses.mean()), "bytes_sent": float(sent)}

    def eval_params(self, state: FedFomoState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: FedFomoState) -> torch.Tensor:
        return state.P
