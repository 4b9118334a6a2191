"""W, dense (n, n) or sparse (``SparseBoxWeights``): the one module that tells the two
apart. The other parts read and write W through these functions."""

from __future__ import annotations

import torch

from raycobo.algorithms.base import cluster_agreement
from raycobo.algorithms.cobo.sparse import SparseBoxWeights, fade_below
from raycobo.settings import ConfigError

Weights = torch.Tensor | SparseBoxWeights

# a sparse W is handed out whole (collaboration(), plots, summary) up to this many clients
DENSE_EXPORT_LIMIT = 4096


def is_sparse(W: Weights) -> bool:
    return isinstance(W, SparseBoxWeights)


def initial_weights(
    n: int, domain: str, device: torch.device | None = None, value: float = 1.0
) -> torch.Tensor:
    """A dense W^0. box: ``value`` between clients (Algorithm 1's Input: 1), 1 on the
    diagonal; simplex: each row uniform over the other clients."""
    if domain == "box":
        W = torch.full((n, n), float(value), device=device)
        return W.fill_diagonal_(1.0)
    W = torch.full((n, n), 1.0 / max(n - 1, 1), device=device)  # uniform over the others
    W.fill_diagonal_(0.0)
    return W


def initial(n: int, domain: str, value: float, sparse: bool, device=None) -> Weights:
    """W^0, sparse (box domain only) or dense."""
    if sparse:
        if domain != "box":
            raise ConfigError(
                "invalid config key 'algorithm.weights': sparse W needs algorithm.domain=box "
                "(a simplex projection rewrites whole rows)"
            )
        return SparseBoxWeights.initial(n, value, device)
    return initial_weights(n, domain, device, value)


def entries(W: Weights, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """w_ij for each pair (i[p], j[p]), on W's device (sparse: i < j)."""
    return W.get(i, j) if is_sparse(W) else W[i, j]


def weights_at(W: Weights, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """w_ij for each pair (i[p], j[p]) of a dense or sparse W, on the CPU."""
    return entries(W, i, j).cpu()


def faded(W: Weights, cut: float, amount: float) -> Weights:
    """W with every entry in (0, ``cut``) lowered by ``amount``, at least 0 (those at or
    above the cut, the diagonal among them, and those at 0 stay)."""
    if amount <= 0 or cut <= 0:
        return W
    if is_sparse(W):
        return W.faded(cut, amount)
    return fade_below(W, cut, amount)


def thresholded(W: Weights, threshold: float) -> Weights:
    """W with its entries below ``threshold`` set to 0 (W itself for a threshold of 0)."""
    if threshold <= 0:
        return W
    if is_sparse(W):
        return W.thresholded(threshold)
    return torch.where(W.ge(threshold), W, torch.zeros((), dtype=W.dtype, device=W.device))


def read_pairs(W: Weights, threshold: float, active: torch.Tensor | None = None) -> torch.Tensor:
    """The pairs (P, 2), i < j, sorted, whose w_ij is not 0 and at least ``threshold``,
    both clients present (``active``)."""
    read = thresholded(W, threshold)
    if not is_sparse(read):
        pairs = torch.nonzero(torch.triu(read, diagonal=1))
    elif read.base == 0:
        pairs = read.nonzero_pairs()
    else:  # every pair never sampled is read too
        raise ValueError(
            f"read_pairs: every pair of a sparse W at W^0 = {read.base:g} is read, so all "
            "n^2 / 2 would be listed (the re-checks and closure come with a threshold, "
            "under which W^0 = 0)"
        )
    if active is not None:
        present = active.to(pairs.device)
        pairs = pairs[present[pairs[:, 0]] & present[pairs[:, 1]]]
    return pairs


def count_read(
    W: Weights, cut: float | None, members: torch.Tensor, active: torch.Tensor | None
) -> int:
    """Ordered pairs (i, j), i among ``members`` and j another client (present, where
    ``active`` is given), whose w_ij is not 0 and at least ``cut`` (None: any)."""
    if is_sparse(W):
        return int(W.read_per_row(cut)[members].sum())
    ok = W.ne(0) & W.ge(cut) if cut is not None else W.ne(0)
    ok = ok & ~torch.eye(W.shape[0], dtype=torch.bool, device=W.device)
    rows = ok.index_select(0, members)
    if active is not None:  # pulled only toward each other
        rows = rows.index_select(1, members)
    return int(rows.sum())


def require_dense(W: Weights, why: str) -> None:
    if is_sparse(W):
        raise ConfigError(
            f"invalid config key 'algorithm.weights': {why} need a dense W (set "
            "algorithm.weights=dense)"
        )


def dense(W: Weights, active: torch.Tensor | None = None) -> torch.Tensor | None:
    """W as an (n, n) matrix over the present clients (absent ones 0); None for a sparse
    W too large to hand out (``DENSE_EXPORT_LIMIT``)."""
    if is_sparse(W):
        return W.to_dense() if W.n <= DENSE_EXPORT_LIMIT else None
    if active is not None:
        present = active.to(W.dtype)
        return W * present[:, None] * present[None, :]
    return W


def agreement(W: Weights, clusters: list[int | None]) -> dict[str, float]:
    """``base.cluster_agreement``'s figures of W (a sparse W without forming it)."""
    return W.cluster_agreement(clusters) if is_sparse(W) else cluster_agreement(W, clusters)


def artifacts(W: Weights) -> dict:
    """A sparse W's stored entries (saved as collaboration_sparse.pt); {} for a dense W."""
    return {"collaboration_sparse": W.export()} if is_sparse(W) else {}
