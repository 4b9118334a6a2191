"""Decentralized SGD on a fixed ring as a raycobo plugin that steps in rows.

Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms? A Case
Study for Decentralized Parallel Stochastic Gradient Descent", NeurIPS 2017,
https://arxiv.org/abs/1705.09056 -- every client takes a local SGD step and averages
the result with its ring neighbours: x_i <- sum_j M_ij (x_j - lr g_j(x_j)), M_ij =
1 / (2k + 1) for |i - j| <= k around the ring (adapt, then combine).

Named as ``algorithm.name: gossip:Gossip`` (this file on the plugin path); its setting is
``algorithm.neighbors`` (k). It runs every Ray schedule:

- ``engine.rounds: sync`` -- its own ``round``;
- ``stale`` -- the round as plan -> apply (``PlansRounds``; nothing is sent ahead, so a
  stale round is the synchronous one);
- ``resident`` -- it steps in rows (``StepsInRows``): the hosts keep their clients'
  models and rows of M, take the local step and combine over the published models of
  the hosts their rows read. M is fixed: no pairs are scored (it is not
  ``ScoresPairsInRows``), so phase 1 computes only the clients' gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field

from raycobo import ClientOps, Gradients, MethodConfig, Plan, run_plan

STEP = 1  # the model step's minibatch stream (raycobo.rng.STEP)


class GossipConfig(MethodConfig):
    """Decentralized SGD: a local step, then the mean over the ring neighbourhood."""

    neighbors: int = Field(default=1, ge=0, description="ring neighbours on each side (k)")


@dataclass
class GossipState:
    X: torch.Tensor  # (n, d) the clients' models (empty (n, 0) in a resident coordinator)
    W: torch.Tensor  # (n, n) the mixing matrix M
    active: torch.Tensor | None = None  # every client takes part


def ring(n: int, k: int) -> torch.Tensor:
    """M: 1 / |N_i| over the ring neighbourhood N_i = {i - k, ..., i + k} (mod n)."""
    M = torch.zeros(n, n)
    for i in range(n):
        near = {(i + o) % n for o in range(-k, k + 1)}
        M[i, sorted(near)] = 1.0 / len(near)
    return M


@dataclass(frozen=True)
class GossipStep:
    """One round on some clients' rows, what a resident host computes."""

    lr: float
    reads_published = True  # the combination reads the stepped models

    def published(self, X: torch.Tensor, members: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        """y = x - lr g: what the other hosts combine with."""
        Y = X.clone()
        Y[members] = X[members] - self.lr * G
        return Y

    @staticmethod
    def step(X_rows, G, Y_rows, W_rows, blocks) -> torch.Tensor:
        """x_i <- sum_j M_ij y_j over the blocks' columns (the others are 0 in M)."""
        out = torch.zeros_like(Y_rows)
        for cols, Yb in blocks:
            out += W_rows[:, cols] @ Yb
        return out


class Gossip:
    name = "gossip"
    Settings = GossipConfig

    def __init__(self, cfg: GossipConfig, rounds: int, seed: int):
        self.cfg = cfg

    def init(self, ops: ClientOps) -> GossipState:
        n = ops.n_clients
        return GossipState(ops.initial_params().expand(n, -1).clone(), ring(n, self.cfg.neighbors))

    def round(self, state: GossipState, t: int, ops: ClientOps):
        return run_plan(self, state, t, ops)

    # -- plan -> apply (PlansRounds) ------------------------------------------------------
    def plan_round(self, state: GossipState, t: int, ops: ClientOps) -> Plan:
        clients = torch.arange(ops.n_clients)
        return Plan(t, now=Gradients(clients, state.X, STEP, 0))

    def apply_round(self, state: GossipState, plan: Plan, now, arrived):
        G, loss = now
        X = state.W @ (state.X - self.cfg.lr * G)  # adapt, then combine
        return GossipState(X, state.W), self.stats(loss, 0, plan.now.clients, state, X.shape[1])

    def plan_refusal(self) -> None:
        return None

    # -- in rows, on resident hosts (StepsInRows) -----------------------------------------
    def rows_start(self, ops: ClientOps):
        return ring(ops.n_clients, self.cfg.neighbors), {}

    def rows_state(self, W, active, extras) -> GossipState:
        return GossipState(torch.empty(W.shape[0], 0), W, active)

    @staticmethod
    def rows_extras(state: GossipState) -> dict:
        return {}

    def row_step(self, t: int, state: GossipState) -> GossipStep:
        return GossipStep(self.cfg.lr)

    def rows_read(self, W: torch.Tensor) -> torch.Tensor:
        return W > 0

    def updates_whole_rows(self) -> bool:
        return False

    @staticmethod
    def stats(step_loss: torch.Tensor, E: int, members, state: GossipState, d: int) -> dict:
        """The round's loss and communication: each client sends its model to each
        neighbour it averages with (float32)."""
        sent = int((state.W[members] > 0).sum()) - members.numel()  # w_ii is no message
        return {"train_loss": float(step_loss.mean()), "bytes_sent": float(4 * sent * d)}

    @staticmethod
    def present(state: GossipState) -> int:
        return state.W.shape[0]

    def rows_refusal(self) -> None:
        return None

    # -- what every method has ------------------------------------------------------------
    def eval_params(self, state: GossipState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: GossipState) -> torch.Tensor:
        return state.W
