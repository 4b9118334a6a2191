"""pFedGraph: a collaboration graph from the similarity of the clients' model changes.

Ye, Ni, Wu, Wang, Chen, Wang, "Personalized Federated Learning with Inferred
Collaboration Graphs", ICML 2023, https://proceedings.mlr.press/v202/ye23b.html -- Eq. 3-5,
and the authors' code (MediaBrain-SJTU/pFedGraph, pytorch/pfedgraph_cosine.py and
pytorch/pfedgraph_cosine/utils.py).

After the sampled clients' local training the server takes each one's change from the
initial model, Delta_i = theta_i - theta^0, the dissimilarities D_ij = -cos(Delta_i,
Delta_j) (those below -0.9 set to -1, as in the code), and for each client the graph row

    a_i = argmin over the probability simplex of  sum_j D_ij a_j + alpha ||a - p||^2,

p the participants' shares of the training samples: the Euclidean projection of
p - D_i / (2 alpha) onto the simplex (``projections.project_simplex``). Client i's next model is
sum_j a_ij theta_j and its next local training adds a term in a_i = sum_j a_ij theta_j /
||theta_j||, the direction of its neighbours' models:

- ``graph_term: paper`` (the default; the paper's Eq. 5): -lam cos(a_i, theta), which
  draws the model toward its neighbours' direction;
- ``graph_term: code`` (the authors' code): +lam a_i . theta / ||theta||, which as
  written pushes it away (that code minimises it).

Readings chosen: ``local_steps`` defaults to 5, not the other methods' 1 (the code takes
200 iterations a round): after a single step from the shared start the clusters' changes
are alike, the graph joins them, their models become one, and a joined group's cosine of
1 keeps it joined. Plain SGD on the minibatch loss (the code's momentum is not carried);
the graph term's gradient is taken in closed form, so each local step is one gradient
request to the engine; the term starts at a client's second participation (no a_i yet
at its first). A (rows of each client's latest participation; (1 - I) / (n - 1) at first)
is the method's collaboration matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import FLOAT, sample_clients
from raycobo.algorithms.projections import project_simplex
from raycobo.algorithms.settings import ClientSampling, EpochLocalTraining, MethodConfig

SATURATED = -0.9  # dissimilarities below it count as -1 (the code's)


class PFedGraphConfig(EpochLocalTraining, ClientSampling, MethodConfig):
    """pFedGraph (Ye et al. 2023): each client's model a mix of the others' over a graph
    learned from the similarity of their changes."""

    name: Literal["pfedgraph"] = "pfedgraph"
    alpha: float = Field(
        default=0.8, gt=0, description="alpha: how near each graph row stays to the sample shares"
    )
    lam: float = Field(
        default=0.01, ge=0, description="lambda: the graph term's weight in local training"
    )
    graph_term: Literal["paper", "code"] = Field(
        default="paper",
        description="paper: -lam cos(a_i, theta) (toward the neighbours); code: +lam a_i . "
        "theta / ||theta|| as the authors' code has it (away from them)",
    )


@dataclass
class PFedGraphState:
    X: torch.Tensor  # (n, d) each client's model (after its latest aggregation)
    x0: torch.Tensor  # (d,) the initial model
    A: torch.Tensor  # (n, n) the graph
    direction: torch.Tensor  # (n, d) a_i, the neighbours' direction (zeros: none yet)


def graph_rows(Y: torch.Tensor, x0: torch.Tensor, shares: torch.Tensor, alpha: float):
    """The participants' graph rows from their trained models Y (m, d). -> (m, m)"""
    unit = torch.nn.functional.normalize(Y - x0, dim=1)
    D = -(unit @ unit.T)
    D = torch.where(D < SATURATED, torch.full_like(D, -1.0), D)
    return project_simplex(shares[None, :].to(Y.dtype) - D / (2.0 * alpha))


def graph_term_grad(theta: torch.Tensor, a: torch.Tensor, cfg: PFedGraphConfig):
    """The gradient in theta (m, d) of the graph term toward directions a (m, d): of
    -lam cos(a, theta) (paper) or +lam a . theta / ||theta|| (code); zero where a is 0."""
    norm = torch.linalg.vector_norm(theta, dim=1, keepdim=True).clamp(min=1e-12)
    dot = (a * theta).sum(1, keepdim=True)
    g = a / norm - dot * theta / norm**3  # the gradient of a . theta / ||theta||
    if cfg.graph_term == "code":
        return cfg.lam * g
    a_norm = torch.linalg.vector_norm(a, dim=1, keepdim=True)
    return torch.where(a_norm > 0, -cfg.lam * g / a_norm.clamp(min=1e-12), 0.0)


class PFedGraph:
    name = "pfedgraph"

    def __init__(self, cfg: PFedGraphConfig, rounds: int, seed: int):
        self.cfg, self.seed = cfg, seed

    def init(self, ops: ClientOps) -> PFedGraphState:
        x0 = ops.initial_params()
        n = ops.n_clients
        A = (1.0 - torch.eye(n, dtype=x0.dtype, device=x0.device)) / max(n - 1, 1)
        X = x0.expand(n, -1).clone()
        return PFedGraphState(X, x0.clone(), A, torch.zeros_like(X))

    def round(self, state: PFedGraphState, t: int, ops: ClientOps) -> tuple[PFedGraphState, dict]:
        """Local steps with the graph term, then the graph rows and the aggregation."""
        c = self.cfg
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(state.X.device)
        Y, a, first = state.X[clients].clone(), state.direction[clients], None
        for s in range(c.local_steps):
            G, losses = ops.grads(clients, Y, t, rng.STEP, s)
            Y = Y - c.lr * (G.to(Y.dtype) + graph_term_grad(Y, a, c))
            first = losses if first is None else first
        shares = ops.data_sizes()[clients]
        rows = graph_rows(Y, state.x0, shares / shares.sum(), c.alpha)
        X, A, direction = state.X.clone(), state.A.clone(), state.direction.clone()
        A[clients] = 0.0
        A[clients[:, None], clients] = rows
        X[clients] = rows @ Y
        direction[clients] = rows @ torch.nn.functional.normalize(Y, dim=1)
        # each sampled client's model up, its aggregate and its direction down, float32
        sent = 3 * clients.numel() * Y.shape[1] * FLOAT
        return PFedGraphState(X, state.x0, A, direction), {
            "train_loss": float(first.mean()),
            "bytes_sent": float(sent),
        }

    def eval_params(self, state: PFedGraphState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: PFedGraphState) -> torch.Tensor:
        return state.A
