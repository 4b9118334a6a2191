"""Averaging with the clients whose gradients agree: a plugin method that learns W from
pair scores and steps in rows, with no CoBo code.

Each round a share of the pairs is scored by the cosine of the two clients' gradients at
their midpoint (raycobo's ``PairScores`` request); a pair is a neighbour while its last
score was positive (w_ij = w_ji = 1, else 0; w_ii = 1). Every client then takes a local
SGD step and averages the result with its neighbours: x_i <- mean over {i} and N_i of
(x_j - lr g_j(x_j)) (adapt, then combine).

Named as ``algorithm.name: pair_average:PairAverage`` (this file on the plugin path),
with ``algorithm.pairs_c`` (each pair scored with probability c / n a round). It runs
every Ray schedule: ``sync`` (its own round), ``stale`` (the scores sent ahead,
``PlansRounds``) and ``resident`` (``StepsInRows`` and ``ScoresPairsInRows``: the hosts
keep their clients' models and rows of W, score the pairs that touch them and average
over the hosts their rows read).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field

from raycobo import ClientOps, Gradients, MethodConfig, PairScores, Plan, run_plan
from raycobo.algorithms.samplers import EdgeSampler

STEP = 1  # the model step's minibatch stream (raycobo.rng.STEP)


class PairAverageConfig(MethodConfig):
    """Local SGD, then the mean over the clients whose gradients agree."""

    pairs_c: float = Field(default=2.0, gt=0, description="each pair scored with p = c / n")


@dataclass
class PairAverageState:
    X: torch.Tensor  # (n, d) the models (empty (n, 0) in a resident coordinator)
    W: torch.Tensor  # (n, n) 0/1 neighbours, w_ii = 1
    active: torch.Tensor | None = None  # every client takes part


def set_rows(W_rows: torch.Tensor, ids: torch.Tensor, edges: torch.Tensor, scores) -> torch.Tensor:
    """Rows ``ids`` of W with w_ij = w_ji = [score > 0] for the pairs that touch them."""
    W_rows = W_rows.clone()
    pos = torch.full((W_rows.shape[1],), -1, dtype=torch.int64)
    pos[ids] = torch.arange(ids.numel())
    near = scores.gt(0).to(W_rows.dtype)
    for a, b in ((0, 1), (1, 0)):  # the row of each end that is held here
        mine = pos[edges[:, a]] >= 0
        W_rows[pos[edges[mine, a]], edges[mine, b]] = near[mine]
    return W_rows


@dataclass(frozen=True)
class PairAverageStep:
    """One round on some clients' rows: what a resident host computes."""

    lr: float
    batches = 1  # each end's gradient on one minibatch
    score = "cosine"
    floor = 0.0
    reads_published = True  # the average reads the stepped models

    @staticmethod
    def points(X_own: torch.Tensor, X_partners: torch.Tensor) -> torch.Tensor:
        return 0.5 * (X_own + X_partners)

    def published(self, X: torch.Tensor, members: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        Y = X.clone()
        Y[members] = X[members] - self.lr * G
        return Y

    @staticmethod
    def update_rows(W_rows, ids, edges, scores) -> torch.Tensor:
        return set_rows(W_rows, ids.cpu(), edges.cpu(), scores.cpu()).to(W_rows.device)

    @staticmethod
    def step(X_rows, G, Y_rows, W_rows, blocks) -> torch.Tensor:
        """x_i <- sum_j w_ij y_j / sum_j w_ij over the blocks' columns (the others 0)."""
        out = torch.zeros_like(Y_rows)
        for cols, Yb in blocks:
            out += W_rows[:, cols] @ Yb
        return out / W_rows.sum(dim=1, keepdim=True)


class PairAverage:
    name = "pair_average"
    Settings = PairAverageConfig

    def __init__(self, cfg: PairAverageConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> PairAverageState:
        n = ops.n_clients
        return PairAverageState(ops.initial_params().expand(n, -1).clone(), torch.eye(n))

    def round(self, state: PairAverageState, t: int, ops: ClientOps):
        return run_plan(self, state, t, ops)

    def round_pairs(self, active, t: int, n: int, W=None) -> torch.Tensor:
        """Round t's pairs (E, 2), i < j: each with probability c / n."""
        return EdgeSampler("constant", n, self.rounds, self.seed, self.cfg.pairs_c).sample(t)

    # -- plan -> apply (PlansRounds) ------------------------------------------------------
    def plan_round(self, state: PairAverageState, t: int, ops: ClientOps) -> Plan:
        X, n = state.X, ops.n_clients
        edges = self.round_pairs(None, t, n)
        ahead = None
        if edges.shape[0]:
            ahead = PairScores(edges, X, 1, "cosine")  # at the pairs' midpoints
        now = Gradients(torch.arange(n), X, STEP, 0)
        return Plan(t, ahead, now, {"edges": edges})

    def apply_round(self, state: PairAverageState, plan: Plan, now, arrived):
        W = state.W
        for p, (scores, _) in arrived:
            W = set_rows(W, torch.arange(W.shape[0]), p.keep["edges"], scores)
        G, loss = now
        Y = state.X - self.cfg.lr * G  # adapt, then combine
        X = (W @ Y) / W.sum(dim=1, keepdim=True)
        new = PairAverageState(X, W)
        return new, self.stats(loss, plan.keep["edges"].shape[0], plan.now.clients, new, X.shape[1])

    def plan_refusal(self) -> None:
        return None

    # -- in rows, on resident hosts (StepsInRows, ScoresPairsInRows) ----------------------
    def rows_start(self, ops: ClientOps):
        return torch.eye(ops.n_clients), {}

    def rows_state(self, W, active, extras) -> PairAverageState:
        return PairAverageState(torch.empty(W.shape[0], 0), W, active)

    @staticmethod
    def rows_extras(state: PairAverageState) -> dict:
        return {}

    def row_step(self, t: int, state: PairAverageState) -> PairAverageStep:
        return PairAverageStep(self.cfg.lr)

    def samples_from_w(self, t: int, n: int) -> bool:
        return False

    def rows_update(self, state: PairAverageState, edges, scores, t: int) -> PairAverageState:
        W = set_rows(state.W, torch.arange(state.W.shape[0]), edges, scores)
        return PairAverageState(state.X, W, state.active)

    def rows_read(self, W: torch.Tensor) -> torch.Tensor:
        return W > 0

    def updates_whole_rows(self) -> bool:
        return False

    @staticmethod
    def stats(step_loss: torch.Tensor, E: int, members, state: PairAverageState, d: int) -> dict:
        """The round's loss and communication: per scored pair two models for the
        midpoint and a gradient and a score back; each client's model to each neighbour."""
        sent = int((state.W[members] > 0).sum()) - members.numel()
        return {
            "train_loss": float(step_loss.mean()),
            "edges": float(E),
            "bytes_sent": float(4 * (E * (3 * d + 1) + sent * d)),
        }

    @staticmethod
    def present(state: PairAverageState) -> int:
        return state.W.shape[0]

    def rows_refusal(self) -> None:
        return None

    # -- what every method has ------------------------------------------------------------
    def eval_params(self, state: PairAverageState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: PairAverageState) -> torch.Tensor:
        return state.W
