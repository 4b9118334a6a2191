"""FedALA: FedAvg whose clients each learn how much of the global model to take in.

Zhang, Hua, Wang, Song, Xue, Ma, Guan, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning", AAAI 2023, https://arxiv.org/abs/2212.01197 -- Algorithm 1
and the authors' code (TsingZ0/FedALA, utils/ALA.py; the same in PFLlib).

The server averages the sampled clients' models (weighted by their data sizes) into a
global model theta_g. Before its local training, each sampled client i starts from

    theta_hat = theta_i + (theta_g - theta_i) * W_i

on its top ``ala_layers`` parameter tensors (the head's weight and bias; the lower ones
take theta_g as they are), W_i element-wise in [0, 1], all ones at first and kept across
rounds. W_i is learned on minibatches of the client's training data by

    W_i <- clip(W_i - ala_lr * grad_theta_hat L * (theta_g - theta_i), 0, 1),

theta_hat following each step: at the client's first adaptation until the (population)
standard deviation of its last 10 passes' losses falls below 0.1 (at most 100 passes),
afterwards one pass a round. Then ``local_steps`` SGD steps from theta_hat give theta_i,
which the client uploads. A client whose model still equals theta_g (the first round)
skips the adaptation, as the authors' code does.

Readings chosen: ``local_steps`` defaults to 5, not the other methods' 1: about the
authors' one local epoch on the quickstart's clients (120 training samples, batches of
32); after a single step theta_g - theta_i is so small that W's gradient hardly moves
it, and FedALA stays near FedAvg. A pass is ``max(1, round(ala_share * local_steps))``
minibatch steps: the authors' one pass over a random 80 % (``ala_share``) of the data
beside local training's epochs over all of it, in the units in which raycobo counts
local training (minibatch steps); its minibatches are drawn from all the client's
training data rather than one contiguous slice of it; a pass's loss is its last
minibatch's, as in the code. FedALA has no collaboration matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import FLOAT, local_sgd, sample_clients, weighted_average
from raycobo.algorithms.settings import ClientSampling, EpochLocalTraining, MethodConfig

# the first adaptation's end (the authors' code's threshold and window), and a bound
CONVERGED_STD, WINDOW, FIRST_PASSES_MAX = 0.1, 10, 100


class FedALAConfig(EpochLocalTraining, ClientSampling, MethodConfig):
    """FedALA (Zhang et al. 2023): FedAvg, each client taking in the global model's top
    layers element-wise as much as its own data says."""

    name: Literal["fedala"] = "fedala"
    ala_layers: int = Field(
        default=2, ge=1, description="p: the top parameter tensors the weights adapt"
    )
    ala_lr: float = Field(default=1.0, gt=0, description="eta: the weights' step size")
    ala_share: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="s: a pass of the weights' learning, as a share of local training's "
        "steps (the authors' random 80 % of the data)",
    )


@dataclass
class FedALAState:
    g: torch.Tensor  # (d,) the global model
    X: torch.Tensor  # (n, d) each client's model after its latest local training
    W: torch.Tensor  # (n, h) each client's weights on the head (its last h entries)
    adapted: torch.Tensor  # (n,) bool: whether the client's first adaptation is done


def pass_steps(cfg: FedALAConfig) -> int:
    """The minibatch steps of one pass of the weights' learning."""
    return max(1, round(cfg.ala_share * cfg.local_steps))


def head_start(layout: list[tuple[int, int, int]], layers: int) -> int:
    """Where the top ``layers`` parameter tensors begin in the flat vector."""
    return layout[-min(layers, len(layout))][0]


def blend(X: torch.Tensor, g: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """theta_g below the head, theta_i + (theta_g - theta_i) * W on it (its last
    W.shape[1] entries). X: (m, d), g: (d,), W: (m, h) -> (m, d)"""
    h = W.shape[1]
    Z = g.expand(X.shape[0], -1).clone()
    Z[:, Z.shape[1] - h :] = X[:, -h:] + (g[-h:] - X[:, -h:]) * W
    return Z


def adapt_pass(ops, rows, X, g, W, steps: int, lr: float, t: int, salt: int):
    """One pass of the weights' learning for the clients ``rows``: ``steps`` projected
    gradient steps on W, the blended model following. -> (W, the last step's losses)"""
    h = W.shape[1]
    delta = g[-h:] - X[:, -h:]
    for k in range(steps):
        G, losses = ops.grads(rows, blend(X, g, W), t, rng.ADAPT, salt + k)
        W = (W - lr * G[:, -h:] * delta).clamp(0.0, 1.0)
    return W, losses


def adapt(ops, cfg: FedALAConfig, rows, X, g, W, first, t: int) -> torch.Tensor:
    """The weights of the clients ``rows`` after this round's learning: one pass, or
    where ``first`` (m,) passes until their losses settle. -> W (m, h)"""
    steps, W = pass_steps(cfg), W.clone()
    todo = torch.ones_like(first)
    history: list[torch.Tensor] = []  # each pass's losses, NaN where a row did not run
    for p in range(FIRST_PASSES_MAX if bool(first.any()) else 1):
        idx = todo.nonzero().flatten()
        W[idx], losses = adapt_pass(
            ops, rows[idx], X[idx], g, W[idx], steps, cfg.ala_lr, t, p * steps
        )
        row = torch.full(first.shape, float("nan"), dtype=torch.float64)
        row[idx.cpu()] = losses.cpu().to(torch.float64)
        history.append(row)
        todo &= first  # the others take one pass
        if len(history) > WINDOW:
            recent = torch.stack(history[-WINDOW:], 1)
            todo &= ~(recent.std(1, unbiased=False) < CONVERGED_STD).to(todo.device)
        if not bool(todo.any()):
            break
    return W


class FedALA:
    name = "fedala"

    def __init__(self, cfg: FedALAConfig, rounds: int, seed: int):
        self.cfg, self.seed = cfg, seed

    def init(self, ops: ClientOps) -> FedALAState:
        x0 = ops.initial_params()
        n, d = ops.n_clients, x0.numel()
        h = d - head_start(ops.param_layout(), self.cfg.ala_layers)
        W = torch.ones(n, h, dtype=x0.dtype, device=x0.device)
        adapted = torch.zeros(n, dtype=torch.bool, device=x0.device)
        return FedALAState(x0.clone(), x0.expand(n, -1).clone(), W, adapted)

    def round(self, state: FedALAState, t: int, ops: ClientOps) -> tuple[FedALAState, dict]:
        """The sampled clients' adaptive local aggregation, local steps, and FedAvg."""
        c, g = self.cfg, state.g
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(g.device)
        X, W, adapted = state.X[clients], state.W.clone(), state.adapted.clone()
        start = g.expand(clients.numel(), -1).clone()
        runs = ~(g == X).all(1)  # the first round's clients hold theta_g already
        if bool(runs.any()):
            rows = clients[runs]
            W[rows] = adapt(ops, c, rows, X[runs], g, W[rows], ~adapted[rows], t)
            adapted[rows] = True
            start[runs] = blend(X[runs], g, W[rows])
        ends, losses = local_sgd(ops, clients, start, c.lr, c.local_steps, t, rng.STEP)
        Xn = state.X.clone()
        Xn[clients] = ends
        g = weighted_average(ends, ops.data_sizes()[clients])
        # each sampled client's global model down and its model back, float32
        sent = 2 * clients.numel() * ends.shape[1] * FLOAT
        return FedALAState(g, Xn, W, adapted), {
            "train_loss": float(losses.mean()),
            "bytes_sent": float(sent),
        }

    def eval_params(self, state: FedALAState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: FedALAState) -> None:
        return None
