"""FedeRiCo: Federating with the Right Collaborators.

Sui, Wen, Lau, Ross, Cresswell, "Find Your Friends: Personalized Federated Learning with
the Right Collaborators" (FedeRiCo) -- Section 2 and Algorithm 1
(Appendix E).

Each client i keeps a model phi_i and weights w_i (its posterior over which client's
model explains its data), uniform at first. Each round t every client

1. samples M neighbours B_i by epsilon-greedy selection on w_i^{(t-1)}: with probability
   epsilon M others uniformly, else the M others with the highest weights;
2. E-step: evaluates the models phi_b, b in B_i and its own, on a fresh minibatch of its
   data (ell_ib), keeps the previous ell_ij for the others (line 11), updates the
   exponential moving averages L_ij <- (1 - beta) L_ij + beta ell_ij for every j (line 14)
   and sets w_i = softmax(-L_i) (line 15);
3. M-step: sends g_bi = w_ib * grad ell_i(phi_b) to every b in B_i (and uses its own);
   each model is updated with the sum of the gradients it received (SGD, or Adam as the
   paper's experiments use).

Client i predicts with the mixture sum_j w_ij p(y | x; phi_j) (restricted to its
``mixture_components`` largest weights, renormalised; with the default 8 and the paper's
client counts this is the full mixture up to weights below ~1e-3).

Readings chosen, where Algorithm 1 leaves room: ell_ib is a minibatch *mean* loss (the box
writes a sum over the local data; with EMA momentum 0.6 a sum over hundreds of samples
makes w one-hot after one round, unlike the paper's Figures 5 and 7); a client always
evaluates and updates its own model besides its M sampled neighbours; the random initial
models are independent per client (line 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps, Evaluation
from raycobo.algorithms.common import FLOAT, top_indices
from raycobo.algorithms.settings import MethodConfig


class FedeRiCoConfig(MethodConfig):
    """FedeRiCo (defaults from the paper: M = 3, epsilon = 0.3, beta = 0.6, Adam lr 0.01)."""

    name: Literal["federico"] = "federico"
    neighbors: int = Field(default=3, ge=1, description="M, neighbours sampled per round")
    epsilon: float = Field(default=0.3, ge=0, le=1, description="epsilon-greedy exploration")
    beta: float = Field(default=0.6, ge=0, lt=1, description="EMA momentum of losses")
    optimizer: Literal["sgd", "adam"] = Field(default="sgd", description="local optimizer")
    mixture_components: int = Field(default=8, ge=1, description="models in a prediction")


@dataclass
class FedeRiCoState:
    Phi: torch.Tensor  # (n, d) client models phi_j
    ell: torch.Tensor  # (n, n) last observed loss of model j on client i's data
    L: torch.Tensor  # (n, n) exponential moving average of ell
    m: torch.Tensor  # (n, d) Adam first moment (unused with SGD)
    v: torch.Tensor  # (n, d) Adam second moment
    steps: torch.Tensor  # (n,) optimizer steps taken by each model

    @property
    def W(self) -> torch.Tensor:
        return torch.softmax(-self.L, dim=1)  # w_ij, Algorithm 1 line 15


def select_neighbours(W: torch.Tensor, M: int, epsilon: float, seed: int, t: int) -> torch.Tensor:
    """epsilon-greedy choice of M neighbours per client (never the client itself).

    W: (n, n) -> (n, M) neighbour ids. With probability epsilon a client draws M others
    uniformly; otherwise it takes the M others with the largest w_ij."""
    n = W.shape[0]
    M = min(M, n - 1)
    ids = torch.arange(n)
    explore = rng.uniform(seed, rng.SAMPLER, t, ids, 0xFE) < epsilon  # (n,)
    noise = rng.uniform(seed, rng.SAMPLER, t, ids.view(-1, 1), ids.view(1, -1), 0xF1)  # (n, n)
    # greedy: highest weights (ties broken by the hash); exploring: uniform random order
    score = torch.where(explore[:, None], noise, W.cpu().double() + 1e-12 * noise)
    score.fill_diagonal_(-float("inf"))
    return score.topk(M, dim=1).indices.to(W.device)  # (n, M)


def adam_update(
    X: torch.Tensor,
    G: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    steps: torch.Tensor,
    rows: torch.Tensor,
    lr: float,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
) -> None:
    """In-place Adam step on the rows that received gradients. G: (len(rows), d)."""
    steps[rows] += 1
    m[rows] = b1 * m[rows] + (1 - b1) * G
    v[rows] = b2 * v[rows] + (1 - b2) * G * G
    k = steps[rows].to(X.dtype)[:, None]
    m_hat = m[rows] / (1 - b1**k)
    v_hat = v[rows] / (1 - b2**k)
    X[rows] -= lr * m_hat / (v_hat.sqrt() + eps)


class FedeRiCo:
    name = "federico"

    def __init__(self, cfg: FedeRiCoConfig, rounds: int, seed: int):
        self.cfg, self.seed = cfg, seed

    def init(self, ops: ClientOps) -> FedeRiCoState:
        n = ops.n_clients
        Phi = torch.stack([ops.random_params(2000 + i) for i in range(n)])  # line 1
        zeros = torch.zeros(n, n, dtype=Phi.dtype, device=Phi.device)  # lines 2-4
        return FedeRiCoState(
            Phi,
            zeros.clone(),
            zeros.clone(),
            torch.zeros_like(Phi),
            torch.zeros_like(Phi),
            torch.zeros(n, dtype=torch.int64, device=Phi.device),
        )

    def round(self, state: FedeRiCoState, t: int, ops: ClientOps) -> tuple[FedeRiCoState, dict]:
        c = self.cfg
        n = ops.n_clients
        dev = state.Phi.device
        B = select_neighbours(state.W, c.neighbors, c.epsilon, self.seed, t)  # (n, M)
        B = torch.cat([torch.arange(n, device=dev)[:, None], B], dim=1)  # own model first
        k = B.shape[1]
        clients = torch.arange(n, device=dev).repeat_interleave(k)  # (n*k,) client i
        models = B.reshape(-1)  # model b evaluated on client i's data
        # E-step loss and M-step gradient from the same fresh minibatch of client i
        G, loss = ops.grads(clients, state.Phi[models], t, rng.STEP, 0)  # (n*k, d), (n*k,)
        ell = state.ell.clone()
        ell[clients, models] = loss.to(ell.dtype)  # line 13; others keep theirs (line 11)
        L = (1 - c.beta) * state.L + c.beta * ell  # line 14
        W = torch.softmax(-L, dim=1)  # line 15
        g = W[clients, models][:, None] * G  # g_bi = w_ib grad ell_i(phi_b) (line 19)
        total = torch.zeros_like(state.Phi).index_add_(0, models, g)  # sum received (22)
        received = torch.unique(models)
        Phi, m, v, steps = state.Phi.clone(), state.m.clone(), state.v.clone(), state.steps.clone()
        if c.optimizer == "adam":
            adam_update(Phi, total[received], m, v, steps, received, c.lr)
        else:
            Phi[received] -= c.lr * total[received]  # line 24
            steps[received] += 1
        new = FedeRiCoState(Phi, ell, L, m, v, steps)
        own = loss.view(n, k)[:, 0]
        # each client gets its M neighbours' models and sends each its weighted gradient
        # (float32; its own model stays with it)
        sent = 2 * n * (k - 1) * Phi.shape[1] * FLOAT
        stats = {"train_loss": float(own.mean()), "model_evals": float(n * k)}
        return new, {**stats, "bytes_sent": float(sent)}

    def mixture(self, state: FedeRiCoState) -> tuple[torch.Tensor, torch.Tensor]:
        """Each client's largest mixture components: model ids (n, k), weights (n, k)."""
        W = state.W
        k = min(self.cfg.mixture_components, W.shape[1])
        idx = top_indices(W, k)
        w = W.gather(1, idx)
        return idx, w / w.sum(dim=1, keepdim=True)

    def evaluate(self, state: FedeRiCoState, ops: ClientOps) -> Evaluation:
        idx, w = self.mixture(state)
        clients = torch.arange(ops.n_clients, device=state.Phi.device)
        return ops.evaluate_mixture(clients, state.Phi[idx], w)  # Z: (n, k, d)

    def eval_params(self, state: FedeRiCoState) -> torch.Tensor:
        """Each client's most-weighted model (the mixture is what ``evaluate`` uses)."""
        return state.Phi[state.W.argmax(dim=1)]

    def collaboration(self, state: FedeRiCoState) -> torch.Tensor:
        return state.W
