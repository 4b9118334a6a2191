"""FedAMP: attentive message passing toward a personal cloud model.

Huang, Chu, Zhou, Wang, Liu, Pei, Zhang, "Personalized Cross-Silo Federated Learning on
Non-IID Data", AAAI 2021, https://arxiv.org/abs/2007.03797 -- Algorithm 1.

Each round the server forms for every sampled client i a cloud model
u_i = sum_j xi_ij w_j from every client's latest model, and the client takes
``local_steps`` SGD steps on its loss plus (lam / (2 alpha_k)) ||w - u_i||^2, starting
from u_i; its end point is its new model w_i. Two attention rules give xi:

- ``distance`` (the paper's, Eq. 6-7): xi_ij = alpha_k exp(-||w_i - w_j||^2 / sigma) /
  sigma for j != i and xi_ii = 1 - sum_{j != i} xi_ij, with the authors' code's (PFLlib
  serveramp.py) alpha_k = sigma = 1. With squared distances far from sigma it is unstable
  early (near 0: xi_ii well below 0, the cloud model overshoots) and Local later (large:
  xi near 0).
- ``cosine`` (the default; the port in CoPFL's code, alg/fedamp.py): xi_ij =
  (1 - self_weight) exp(sigma cos_ij) / sum_{k != i} exp(sigma cos_ik), xi_ii =
  self_weight (0.7), and the pull lam ||w - u_i||^2 / 2. Unlike the port, cos_ij is the
  cosine of the models' changes from the initial model, w - x^0 (pFedGraph's measure of
  similarity: the raw weights' cosines hardly differ between clusters), and sigma is 30
  (the port's 10 fell below Local on the quickstart's validation data).

Readings chosen: the pull is the squared norm of the paper (PFLlib's code writes the
unsquared norm of detached tensors, which gives no gradient, so its clients train
locally); the client's steps start from u_i, the pull's centre (the paper's argmin
leaves the start free). Xi (rows of the clients of the latest round) is the method's
collaboration matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field, model_validator

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import FLOAT, local_sgd, sample_clients
from raycobo.algorithms.settings import ClientSampling, LocalTraining, MethodConfig

# each rule's own keys and the values null stands for (the authors' code, the ports')
RULE_KEYS = {
    "distance": {"alpha_k": 1.0, "sigma": 1.0},
    "cosine": {"self_weight": 0.7, "sigma": 30.0},
}


class FedAMPConfig(LocalTraining, ClientSampling, MethodConfig):
    """FedAMP (Huang et al. 2021): each client pulled toward its own cloud model, a mean
    of every client's model weighted by their similarity to its own."""

    name: Literal["fedamp"] = "fedamp"
    lam: float = Field(default=1.0, ge=0, description="lambda: strength of the pull")
    attention: Literal["distance", "cosine"] = Field(
        default="cosine",
        description="xi: distance, the paper's alpha_k exp(-||w_i - w_j||^2 / sigma) / "
        "sigma; cosine, the ports' softmax of sigma cos(w_i, w_j) beside a fixed self weight",
    )
    sigma: float | None = Field(
        default=None,
        gt=0,
        description="distance: the squared distance's scale (null: 1); cosine: the "
        "softmax's temperature (null: 30)",
    )
    alpha_k: float | None = Field(
        default=None, gt=0, description="distance: alpha_K, the step of the attention (null: 1)"
    )
    self_weight: float | None = Field(
        default=None, ge=0, le=1, description="cosine: xi_ii, a client's own share (null: 0.7)"
    )

    @model_validator(mode="after")
    def _keys_of_its_rule(self) -> FedAMPConfig:
        for key in ("alpha_k", "self_weight"):
            if getattr(self, key) is not None and key not in RULE_KEYS[self.attention]:
                owner = next(r for r, keys in RULE_KEYS.items() if key in keys)
                raise ValueError(
                    f"{key}: applies to attention: {owner}, not {self.attention} (it would do "
                    f"nothing): drop it, or set algorithm.attention={owner}"
                )
        return self

    def effective(self) -> dict:
        """The settings with the chosen rule's nulls written out (a run's record)."""
        out = self.model_dump(mode="json")
        for key in RULE_KEYS[self.attention]:
            out[key] = rule_value(self, key)
        return out


def rule_value(cfg: FedAMPConfig, key: str) -> float:
    """A rule key's value: the one set, or its rule's default."""
    set_to = getattr(cfg, key)
    return RULE_KEYS[cfg.attention][key] if set_to is None else set_to


def prox(cfg: FedAMPConfig) -> float:
    """The pull's weight in each local step: lam / alpha_k (distance), lam (cosine)."""
    return cfg.lam / rule_value(cfg, "alpha_k") if cfg.attention == "distance" else cfg.lam


@dataclass
class FedAMPState:
    X: torch.Tensor  # (n, d) every client's latest model
    x0: torch.Tensor  # (d,) the initial model
    Xi: torch.Tensor  # (n, n) the attention rows of each client's latest round (I at first)


def attention(
    X: torch.Tensor, x0: torch.Tensor, rows: torch.Tensor, cfg: FedAMPConfig
) -> torch.Tensor:
    """xi for the clients ``rows`` (m,) over every client's model X (n, d), the cosine
    rule's similarities those of the models' changes from x0 (d,) -> (m, n), each row
    summing to 1."""
    m, n = rows.numel(), X.shape[0]
    own = torch.zeros(m, n, dtype=torch.bool, device=X.device)
    own[torch.arange(m), rows] = True
    sigma = rule_value(cfg, "sigma")
    if cfg.attention == "distance":
        D = torch.cdist(X[rows], X).square()
        xi = (rule_value(cfg, "alpha_k") * torch.exp(-D / sigma) / sigma).masked_fill(own, 0.0)
        return xi + own * (1.0 - xi.sum(1, keepdim=True))
    unit = torch.nn.functional.normalize(X - x0, dim=1)
    logits = (sigma * (unit[rows] @ unit.T)).masked_fill(own, float("-inf"))
    others = torch.softmax(logits, dim=1) if n > 1 else torch.zeros(m, n, dtype=X.dtype)
    w = rule_value(cfg, "self_weight")
    return (1.0 - w) * others + own * w


class FedAMP:
    name = "fedamp"

    def __init__(self, cfg: FedAMPConfig, rounds: int, seed: int):
        self.cfg, self.seed = cfg, seed

    def init(self, ops: ClientOps) -> FedAMPState:
        x0 = ops.initial_params()
        n = ops.n_clients
        eye = torch.eye(n, dtype=x0.dtype, device=x0.device)
        return FedAMPState(x0.expand(n, -1).clone(), x0.clone(), eye)

    def round(self, state: FedAMPState, t: int, ops: ClientOps) -> tuple[FedAMPState, dict]:
        """The sampled clients' cloud models u = xi X, then their local steps from u with
        the pull toward it."""
        c = self.cfg
        clients = sample_clients(ops.n_clients, c.client_rate, self.seed, t).to(state.X.device)
        xi = attention(state.X, state.x0, clients, c)
        U = xi @ state.X
        ends, losses = local_sgd(ops, clients, U, c.lr, c.local_steps, t, rng.STEP, prox(c), U)
        X, Xi = state.X.clone(), state.Xi.clone()
        X[clients], Xi[clients] = ends, xi
        # each sampled client's cloud model down and its model back, float32
        sent = 2 * clients.numel() * X.shape[1] * FLOAT
        return FedAMPState(X, state.x0, Xi), {
            "train_loss": float(losses.mean()),
            "bytes_sent": float(sent),
        }

    def eval_params(self, state: FedAMPState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: FedAMPState) -> torch.Tensor:
        return state.Xi
