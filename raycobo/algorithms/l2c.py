"""L2C and meta-L2C: learning to collaborate through the validation loss after aggregation.

Li, Zhou, Wang, Sun, Zhang, "Learning to Collaborate in Decentralized Learning of
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
from typing import Any

import torch
from torch import nn

from raycobo import rng
from raycobo.algorithms.base import ClientOps, all_clients
from raycobo.algorithms.common import local_sgd
from raycobo.config import AlgorithmConfig


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


class ChannelEncoder(nn.Module):
    """meta-L2C's E: per layer l a two-layer network E_l applied to every channel of the
    layer, outputs concatenated (Eq. 7-8). ``layout``: (offset, channels, size) blocks."""

    def __init__(self, layout: list[tuple[int, int, int]], hidden: int = 10, out: int = 5):
        super().__init__()
        self.layout = [tuple(int(v) for v in b) for b in layout]
        self.sizes = [size for _, _, size in self.layout]
        self.nets = nn.ModuleList(
            nn.Sequential(nn.Linear(size, hidden), nn.ReLU(), nn.Linear(hidden, out))
            for size in self.sizes
        )

    def forward(self, V: torch.Tensor) -> torch.Tensor:
        """V: (m, d) flat parameter vectors -> (m, sum_l channels_l * out)."""
        m = V.shape[0]
        parts = []
        for (offset, channels, size), net in zip(self.layout, self.nets, strict=True):
            block = V[:, offset : offset + channels * size].reshape(m, channels, size)
            parts.append(net(block).reshape(m, -1))
        return torch.cat(parts, dim=1)


@dataclass
class L2CState:
    X: torch.Tensor  # (n, d) models theta_i^t
    X0: torch.Tensor  # (n, d) initial models theta_i^0
    mask: torch.Tensor  # (n, n) bool: j in i u N(i)
    params: Any  # alpha (n, n) for L2C, the ChannelEncoder for meta-L2C
    opt: torch.optim.Optimizer | None
    W: torch.Tensor  # (n, n) the last mixing weights (0 outside the mask)


class L2C:
    """L2C: free mixing logits alpha_ij per client pair."""

    name = "l2c"
    transfers_per_edge = 1  # Delta theta_j

    def __init__(self, cfg: AlgorithmConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    # -- what differs between L2C and meta-L2C ---------------------------------------------
    def make_params(self, ops: ClientOps, n: int) -> Any:
        return torch.zeros(n, n, device=ops.device, requires_grad=True)

    def trainable(self, params: Any) -> list[torch.Tensor]:
        return [params]

    def logits(self, params: Any, Dhat: torch.Tensor) -> torch.Tensor:
        return params

    def objective_scale(self, n: int) -> float:
        return 1.0  # each alpha_i minimises its own client's validation loss (Eq. 3)

    # -- the shared round ------------------------------------------------------------------
    def init(self, ops: ClientOps) -> L2CState:
        n = ops.n_clients
        X = ops.initial_params().unsqueeze(0).repeat(n, 1)
        params = self.make_params(ops, n)
        trainable = self.trainable(params)
        opt = None
        if trainable:
            opt = torch.optim.Adam(
                trainable, lr=self.cfg.mix_lr, weight_decay=self.cfg.mix_weight_decay
            )
        mask = torch.ones(n, n, dtype=torch.bool, device=X.device)
        W = torch.full((n, n), 1.0 / n, device=X.device)
        return L2CState(X, X.clone(), mask, params, opt, W)

    def round(self, state: L2CState, t: int, ops: ClientOps) -> tuple[L2CState, dict]:
        c = self.cfg
        n = ops.n_clients
        clients = all_clients(ops)
        Y, train_loss = local_sgd(ops, clients, state.X, c.lr, c.local_steps, t, rng.STEP)
        D = state.X - Y  # Delta theta^t (line 11)
        Dhat = Y - state.X0  # Delta hat theta^t
        with torch.enable_grad():
            W = masked_softmax(self.logits(state.params, Dhat), state.mask)  # lines 13-14
            A, X_new, val_loss = validation_signal(ops, state.X, D, W.detach(), t)  # line 16
            if state.opt is not None:  # line 18
                state.opt.zero_grad(set_to_none=True)
                W.backward(A.to(W.dtype) / self.objective_scale(n))
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
            "bytes_sent": float(edges * ops.dim * 4 * self.transfers_per_edge),
        }

    def eval_params(self, state: L2CState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: L2CState) -> torch.Tensor:
        return state.W


class MetaL2C(L2C):
    """meta-L2C: mixing weights from a shared encoder of the clients' model changes."""

    name = "meta_l2c"
    transfers_per_edge = 2  # Delta theta_j and Delta hat theta_j

    def make_params(self, ops: ClientOps, n: int) -> ChannelEncoder:
        c = self.cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(rng.hash_ints(self.seed, rng.INIT, 0xE2C)))
            enc = ChannelEncoder(ops.param_layout(), c.encoder_hidden, c.encoder_out)
        if c.encoder_path is not None:
            load_encoder(enc, c.encoder_path)
        return enc.to(ops.device)

    def trainable(self, params: ChannelEncoder) -> list[torch.Tensor]:
        return list(params.parameters()) if self.cfg.train_encoder else []

    def logits(self, params: ChannelEncoder, Dhat: torch.Tensor) -> torch.Tensor:
        E = params(Dhat)  # (n, e)
        return E @ E.T  # f(theta_i, theta_j) = <E_i, E_j> (Eq. 5)

    def objective_scale(self, n: int) -> float:
        return float(n)  # the encoder minimises the mean validation loss (Eq. 6)

    def artifacts(self, state: L2CState) -> dict[str, Any]:
        """The trained encoder, loadable with ``algorithm.encoder_path`` (transfer)."""
        enc: ChannelEncoder = state.params
        return {"encoder": encoder_payload(enc)}


def encoder_payload(enc: ChannelEncoder) -> dict[str, Any]:
    return {
        "sizes": list(enc.sizes),
        "state_dict": {k: v.detach().cpu() for k, v in enc.state_dict().items()},
    }


def load_encoder(enc: ChannelEncoder, path: str) -> None:
    """Load a pre-trained encoder; its per-layer channel sizes must match this model's
    (the channel counts may differ: E_l is shared across a layer's channels)."""
    from pathlib import Path

    from raycobo.config import ConfigError

    if not Path(path).is_file():
        raise ConfigError(f"invalid config key 'algorithm.encoder_path': no file {path}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or "state_dict" not in payload:
        raise ConfigError(
            f"invalid config key 'algorithm.encoder_path': {path} is not a meta-L2C encoder"
        )
    if list(payload["sizes"]) != list(enc.sizes):
        raise ConfigError(
            f"invalid config key 'algorithm.encoder_path': {path} encodes layers of channel "
            f"sizes {list(payload['sizes'])}, this model has {enc.sizes}"
        )
    try:
        enc.load_state_dict(payload["state_dict"])
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise ConfigError(f"invalid config key 'algorithm.encoder_path': {first}") from None
