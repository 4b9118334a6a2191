"""Eq. (2)-(3)'s pull: each model's gradient step plus rho times its pull toward the
collaborators W weighs, summed on the current models (Algorithm 1) or toward their
W-weighted mean on the stepped ones, leaving out the weights below a threshold."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raycobo.algorithms.cobo import weights
from raycobo.settings import ConfigError

# rho auto = AUTO_RHO_SCALE / (lr n) at large n: 1.0 (a one-step contraction) left W
# within clusters fading on the cross-device twin; 0.4 kept it (FIDELITY.md)
AUTO_RHO_SCALE = 0.4


def penalty(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """sum_k w_ik (x_i - x_k) for every i: (diag(W 1) - W) X. X: (n, d), W: (n, n)."""
    return W.sum(dim=1, keepdim=True) * X - W @ X


def mean_rows(W: torch.Tensor) -> torch.Tensor:
    """W's rows divided by max(1, their sum): the pull toward the W-weighted mean of x_i
    and its collaborators (``pull: mean``; the box domain's w_ii = 1 counts, so a client
    whose collaborators' weights have faded is pulled little); rows of mass below 1
    (the simplex domain's) are left as they are."""
    return W / W.sum(dim=1, keepdim=True).clamp_min(1.0)


def pull_weights(W: torch.Tensor, pull: str, threshold: float = 0.0) -> torch.Tensor:
    """The weights Eq. (3) pulls with: W's entries below ``threshold`` set to 0 (the
    box domain's weak edges), then, for ``pull='mean'``, its rows divided by max(1, their
    sum). W: dense rows (m, n) or SparseBoxWeights (sparse: the thresholding only; the
    mean pull's scaling is applied by ``penalized_step``)."""
    W = weights.thresholded(W, threshold)
    if pull == "mean" and not weights.is_sparse(W):
        return mean_rows(W)
    return W


def on_stepped(pull: str) -> bool:
    """Whether the pull acts on the stepped models x - lr g (the mean pull: adapt then
    combine) rather than on the current ones, beside the gradient step (the summed pull,
    Eq. 3 as printed)."""
    return pull == "mean"


def stepped_models(X: torch.Tensor, G: torch.Tensor, lr: float) -> torch.Tensor:
    """y = x - lr g: the models the mean pull acts on."""
    return torch.add(X, G, alpha=-lr)


def penalized_step(
    X: torch.Tensor,
    G: torch.Tensor,
    W: torch.Tensor,
    lr: float,
    rho: float,
    pull: str = "sum",
    threshold: float = 0.0,
) -> torch.Tensor:
    """Eq. (3) in three passes over (n, d):
    X - lr (G + rho (diag(W 1) - W) X) = (1 - lr rho deg) X + lr rho W X - lr G.
    ``pull='mean'``: W's rows divided by max(1, their sum), and the pull acts on
    Y = X - lr G instead of X (adapt then combine): (1 - lr rho deg) Y + lr rho W Y;
    ``threshold``: W's entries below it count as 0 (``pull_weights``)."""
    W = pull_weights(W, pull, threshold)
    if on_stepped(pull):
        X, G = stepped_models(X, G, lr), None
    if weights.is_sparse(W):
        deg = W.degree()[:, None].to(X.dtype)
        scale = 1.0 / deg.clamp_min(1.0) if pull == "mean" else torch.ones_like(deg)
        keep = 1.0 - lr * rho * deg * scale
        out = (X * keep).add_(W.matmul(X) * scale, alpha=lr * rho)
        return out if G is None else out.add_(G, alpha=-lr)
    return penalized_rows(X, X, G, W, lr, rho)


def penalized_rows(
    X_rows: torch.Tensor,
    X_all: torch.Tensor,
    G: torch.Tensor | None,
    W_rows: torch.Tensor,
    lr: float,
    rho: float,
) -> torch.Tensor:
    """Eq. (3) for some clients: X_rows (m, d) with their W rows (m, n) over all models
    X_all (n, d) -- what a host holding those clients computes (G None: the pull alone,
    of models already stepped)."""
    return penalized_rows_blocks(X_rows, G, W_rows, [(slice(None), X_all)], lr, rho)


def penalized_rows_blocks(
    X_rows: torch.Tensor,
    G: torch.Tensor | None,
    W_rows: torch.Tensor,
    blocks: list[tuple[torch.Tensor | slice, torch.Tensor]],
    lr: float,
    rho: float,
) -> torch.Tensor:
    """Eq. (3) for some clients when the other models come in blocks (cols, X_block):
    x_i (1 - lr rho sum_k w_ik) + lr rho sum_k w_ik x_k - lr g_i, the sum over the
    blocks' columns only (a resident host reads just the hosts its clients weigh; the
    columns left out must have w_ik = 0 there; G None: no gradient term)."""
    keep = 1.0 - lr * rho * W_rows.sum(dim=1, keepdim=True)  # (m, 1)
    out = X_rows * keep
    for cols, Xb in blocks:
        add_weighted(out, W_rows[:, cols].to(Xb.dtype), Xb, lr * rho)
    return out if G is None else out.add_(G, alpha=-lr)


# a block of pull weights with at most this share of nonzero entries is multiplied as a
# sparse matrix: with W^0 = 0 and the threshold a row holds about its cluster's clients
SPARSE_PULL_SHARE = 0.1


def add_weighted(out: torch.Tensor, W: torch.Tensor, X: torch.Tensor, alpha: float) -> None:
    """out += alpha * W @ X, W (m, k) dense; as a sparse product where at most
    ``SPARSE_PULL_SHARE`` of W's entries are nonzero (the product's cost then follows the
    nonzeros, not m * k), skipped where none are."""
    nonzero = int(torch.count_nonzero(W))
    if nonzero == 0:
        return
    if nonzero > SPARSE_PULL_SHARE * W.numel() or W.device.type != "cpu":
        out.addmm_(W, X, alpha=alpha)
        return
    out.add_(torch.sparse.mm(W.to_sparse(), X), alpha=alpha)


@dataclass(frozen=True)
class Pull:
    """Eq. (3) as the settings give it: ``kind`` sum (rho sum_k w_ik (x_i - x_k), on the
    current models x^t) or mean (toward the W-weighted mean, on the stepped models x^t -
    lr g), the entries below ``threshold`` left out; ``rho`` a number or "auto"
    (``strength``: the mean pull's lr * rho)."""

    kind: str
    lr: float
    rho: float | str
    domain: str
    threshold: float = 0.0
    strength: float | None = None

    @property
    def at(self) -> str:
        """Where the pull acts: on the "stepped" models (mean) or the "current" ones (sum)."""
        return "stepped" if on_stepped(self.kind) else "current"

    def rho_for(self, n: int) -> float:
        """rho for n clients. Eq. (2) sums rho * w_ij (x_i - x_j) over all j, and with the
        box domain's W^0 = 1 the penalty step alone is x <- (I - lr rho L) x with L the
        complete graph's Laplacian (eigenvalue n): it diverges once lr * rho * n >= 2.
        ``auto`` keeps the paper's rho = 0.3 for small n and lowers it to 0.4 / (lr n) (a
        contraction to 60 % per step, without oscillation) as n grows; the simplex
        domain's rows sum to 1, so there rho needs no scaling; the mean pull's rows of
        mass >= 1 sum to 1, so it contracts by lr rho (auto: ``strength``). An explicit
        rho beyond the bound is refused."""
        lr, rho = self.lr, self.rho
        if self.domain == "simplex":
            return 0.3 if rho == "auto" else float(rho)
        if self.kind == "mean":
            if rho == "auto":
                return self.strength / lr
            if lr * rho >= 1.0:
                raise ConfigError(
                    f"invalid config key 'algorithm.rho': algorithm.lr * algorithm.rho = "
                    f"{lr * rho:.3g} >= 1 overshoots the collaborators' mean "
                    "(pull: mean); lower them, or use rho: auto"
                )
            return float(rho)
        if rho == "auto":
            return min(0.3, AUTO_RHO_SCALE / (lr * max(n, 1)))
        if lr * rho * n >= 2.0:
            raise ConfigError(
                f"invalid config key 'algorithm.rho': algorithm.lr * algorithm.rho * n = "
                f"{lr:g} * {rho:g} * {n} = {lr * rho * n:.3g} >= 2, so the penalty "
                "step diverges while W = 1 (box domain); lower them, or use rho: auto "
                f"(here {min(0.3, AUTO_RHO_SCALE / (lr * n)):.3g})"
            )
        return float(rho)

    def step(self, X: torch.Tensor, G: torch.Tensor, W: weights.Weights, n: int) -> torch.Tensor:
        """Eq. (3) for the models X (m, d) with their gradients G and W (m, m), rho that
        of n clients."""
        rho = self.rho_for(n)
        return penalized_step(X, G, W, self.lr, rho, self.kind, self.threshold)

    def read(self, W: weights.Weights) -> weights.Weights:
        """The entries the pull reads (those below the threshold set to 0)."""
        return weights.thresholded(W, self.threshold)
