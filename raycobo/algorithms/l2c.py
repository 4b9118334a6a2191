"""L2C: learning to collaborate through the validation loss after aggregation.

Li, Zhou, Tian, Tao, "Learning to Collaborate in Decentralized Learning of
Personalized Models" (CVPR 2022) -- Section 3 and Algorithm 1.

Every round t each client i

1. runs S local SGD steps on its training part, theta_i^{t+1/2}, and sets
   Delta theta_i = theta_i^t - theta_i^{t+1/2} (line 11);
2. mixes over itself and its neighbours N(i):
   w_i = softmax(alpha_i) over i u N(i) (L2C, line 13), or
   w_ij = softmax_j <E(Delta hat theta_i), E(Delta hat theta_j)> with
   Delta hat theta_i = theta_i^{t+1/2} - theta_i^0 and a learned encoder E (meta-L2C,
   line 14, Eq. 4-8);
3. aggregates theta_i^{t+1} = theta_i^t - sum_j w_ij Delta theta_j (line 16);
4. takes an Adam step on the mixing parameters along the gradient of its validation
   loss L(theta_i^{t+1}; D_i^val) (line 18). The gradient flows through the aggregation
   only (the Delta theta_j are this round's constants): with g_i the validation gradient
   at theta_i^{t+1}, dL_i / dw_ij = -<g_i, Delta theta_j>, and autograd carries that
   through the softmax (and, for meta-L2C, through the encoder);
5. at t = T0 removes the K0 neighbours with the smallest w_ij (line 21), which makes
   the topology sparse for the rest of training.

Readings chosen, where the paper leaves room:

- The validation loss is a minibatch of the held-out 20 % (stream VAL), a stochastic
  gradient as the paper's "(stochastic) gradient descent" allows.
- N(i) starts as all other clients (the paper's experiments: K0 = 90 of 99 removed).
- meta-L2C's encoder is shared by all clients (line 24's AllReduce): its objective is
  the mean validation loss (Eq. 6). E_l is one two-layer network per layer applied to
  every channel (output unit / filter) of that layer (Eq. 7); a vector parameter (a
  bias) is one channel.
- All clients start from the same theta^0 (decentralised-learning convention).
- Communication per round counts the Delta theta_j each client receives from its
  neighbours (meta-L2C also receives the Delta hat theta_j: twice as much), in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps, all_clients
from raycobo.algorithms.common import local_sgd
from raycobo.algorithms.settings import LocalTraining, MethodConfig


class L2CConfig(LocalTraining, MethodConfig):
    """L2C (defaults from the paper: Adam lr 0.1, weight decay 0.01, T0 = 10, 90 % of the
    neighbours removed)."""

    name: Literal["l2c"] = "l2c"
    uses_validation: ClassVar[bool] = True  # learns its mixing from a validation loss
    mix_lr: float = Field(default=0.1, gt=0, description="Adam lr of the mixing parameters")
    mix_weight_decay: float = Field(default=0.01, ge=0, description="Adam weight decay")
    prune_round: int | None = Field(default=10, ge=0, description="T0; null: never prune")
    prune_fraction: float = Field(default=0.9, ge=0, lt=1, description="K0 / |N(i)|")


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax over the entries where ``mask`` is True; zero elsewhere."""
    z = logits.masked_fill(~mask, -float("inf"))
    return torch.softmax(z, dim=1)


def validation_signal(
    ops: ClientOps, X: torch.Tensor, D: torch.Tensor, W: torch.Tensor, t: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Aggregate and measure: X_new = X - W D; returns (dL_i/dw_ij (n, n), X_new, the
    validation minibatch losses at X_new (n,)).

    Each client's validation gradient comes from its own held-out data only."""
    X_new = X - W @ D
    G, loss = ops.grads(all_clients(ops), X_new, t, rng.VAL, 0)
    return -(G @ D.T), X_new, loss


def prune(W: torch.Tensor, mask: torch.Tensor, fraction: float) -> torch.Tensor:
    """Remove from each client's neighbourhood the floor(fraction * |N(i)|) neighbours
    with the smallest weights (never the client itself)."""
    n = W.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=W.device)
    new = mask.clone()
    for i in range(n):
        nbrs = torch.nonzero(mask[i] & ~eye[i]).flatten()
        k0 = int(fraction * nbrs.numel())
        if k0 > 0:
            drop = nbrs[W[i, nbrs].argsort()[:k0]]
            new[i, drop] = False
    return new


@dataclass
class L2CState:
    X: torch.Tensor  # (n, d) models theta_i^t
    X0: torch.Tensor  # (n, d) initial models theta_i^0
    mask: torch.Tensor  # (n, n) bool: j in i u N(i)
    params: Any  # the mixing parameters: alpha (n, n), or meta-L2C's encoder
    opt: torch.optim.Optimizer | None
    W: torch.Tensor  # (n, n) the last mixing weights (0 outside the mask)


class FreeLogits:
    """L2C's mixing parameters: free logits alpha_ij per client pair (line 13)."""

    transfers_per_edge = 1  # Delta theta_j

    def make_params(self, ops: ClientOps, n: int) -> torch.Tensor:
        return torch.zeros(n, n, device=ops.device, requires_grad=True)

    def trainable(self, params: torch.Tensor) -> list[torch.Tensor]:
        return [params]

    def logits(self, params: torch.Tensor, Dhat: torch.Tensor) -> torch.Tensor:
        return params

    def objective_scale(self, n: int) -> float:
        return 1.0  # each alpha_i minimises its own client's validation loss (Eq. 3)

    def artifacts(self, params: torch.Tensor) -> dict[str, Any]:
        return {}


class L2C:
    """The learning-to-collaborate round (Algorithm 1) over a mixing parameterisation:
    ``FreeLogits`` here, meta-L2C's encoder in ``meta_l2c.py``."""

    def __init__(
        self, cfg: L2CConfig, rounds: int, seed: int, mixing: Any = None, name: str = "l2c"
    ):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed
        self.mixing = mixing if mixing is not None else FreeLogits()
        self.name = name

    def init(self, ops: ClientOps) -> L2CState:
        n = ops.n_clients
        X = ops.initial_params().unsqueeze(0).repeat(n, 1)
        params = self.mixing.make_params(ops, n)
        trainable = self.mixing.trainable(params)
        opt = None
        if trainable:
            opt = torch.optim.Adam(
                trainable, lr=self.cfg.mix_lr, weight_decay=self.cfg.mix_weight_decay
            )
        mask = torch.ones(n, n, dtype=torch.bool, device=X.device)
        W = torch.full((n, n), 1.0 / n, device=X.device)
        return L2CState(X, X.clone(), mask, params, opt, W)

    def round(self, state: L2CState, t: int, ops: ClientOps) -> tuple[L2CState, dict]:
        c, mix = self.cfg, self.mixing
        n = ops.n_clients
        clients = all_clients(ops)
        Y, train_loss = local_sgd(ops, clients, state.X, c.lr, c.local_steps, t, rng.STEP)
        D = state.X - Y  # Delta theta^t (line 11)
        Dhat = Y - state.X0  # Delta hat theta^t
        with torch.enable_grad():
            W = masked_softmax(mix.logits(state.params, Dhat), state.mask)  # lines 13-14
            A, X_new, val_loss = validation_signal(ops, state.X, D, W.detach(), t)  # line 16
            if state.opt is not None:  # line 18
                state.opt.zero_grad(set_to_none=True)
                W.backward(A.to(W.dtype) / mix.objective_scale(n))
                state.opt.step()
        W = W.detach()
        mask = state.mask
        if c.prune_round is not None and t == c.prune_round:  # lines 20-21
            mask = prune(W, mask, c.prune_fraction)
        edges = int(mask.sum()) - n  # directed neighbour links in use
        new = L2CState(X_new, state.X0, mask, state.params, state.opt, W)
        return new, {
            "train_loss": float(train_loss.mean()),
            "val_loss": float(val_loss.mean()),
            "edges": float(edges),
            "bytes_sent": float(edges * ops.dim * 4 * mix.transfers_per_edge),
        }

    def eval_params(self, state: L2CState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: L2CState) -> torch.Tensor:
        return state.W

    def artifacts(self, state: L2CState) -> dict[str, Any]:
        """What the mixing parameterisation exports (meta-L2C: its trained encoder)."""
        return self.mixing.artifacts(state.params)
