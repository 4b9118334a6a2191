"""The rows of CoBo's alignment requests: each sampled pair's midpoint z_ij, asked for
both ends' gradients (each on its own client's data, salted by the partner), for each of
``alignment_batches`` minibatches; and the averaging of those rows back to one gradient
per end."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raycobo.algorithms.base import SharedPoints

# alignment_batches: batch b > 0 of a pair's gradient is drawn with the pair's salt (the
# partner's global id) + b * ALIGN_SALT_STRIDE, a salt no partner id reaches
ALIGN_SALT_STRIDE = 1 << 24
ALIGN_BATCHES_MAX = 64


def midpoints(
    X: torch.Tensor, i: torch.Tensor, j: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """z_ij = (x_i + x_j) / 2 for each sampled pair, (E, d) (into ``out`` if given)."""
    mid = torch.index_select(X, 0, i, out=out) if out is not None else X.index_select(0, i)
    return mid.add_(X.index_select(0, j)).mul_(0.5)


def pair_requests(
    X: torch.Tensor, edges: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The alignment requests of ``edges`` (E, 2) as shared points: their midpoints (E,
    d), each asked 2k times pair by pair (i then j, for each of the k minibatches), with
    those rows' clients and salts (2kE,) (each end's draw salted by its partner)."""
    i, j = edges[:, 0], edges[:, 1]
    ends = torch.stack([i, j], dim=1)  # (E, 2)
    clients = ends.repeat(1, k).flatten()  # (E 2k,): i, j, i, j, ...
    salts = batch_salts(ends.flip(1).flatten(), k).view(k, -1, 2).transpose(0, 1).flatten()
    return midpoints(X, i, j), clients, salts


def pair_parts(E: int, per: int) -> list[tuple[int, int]]:
    """[a, b) ranges over E pairs of ``per`` pairs each (at least 2), the last taking a
    single leftover pair: no part but a lone pair's own has one pair (a reduction over
    one row splits its sum between threads, over several it does not)."""
    per = max(2, per)
    bounds = list(range(0, E, per)) + [E]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def batch_salts(salts: torch.Tensor, k: int) -> torch.Tensor:
    """The salts of ``k`` minibatches per alignment gradient (``alignment_batches``):
    batch 0 keeps the pair's own salt (k = 1 draws what Algorithm 1's round draws), batch
    b adds b * ALIGN_SALT_STRIDE. (m,) -> (k m,), batch-major."""
    if k == 1:
        return salts
    if salts.numel() and int(salts.max()) >= ALIGN_SALT_STRIDE:
        raise ValueError(
            f"algorithm.alignment_batches > 1 supports fewer than {ALIGN_SALT_STRIDE:,} clients"
        )
    return torch.cat([salts + b * ALIGN_SALT_STRIDE for b in range(k)])


def mean_of_batches(G: torch.Tensor, k: int) -> torch.Tensor:
    """The alignment gradients of ``k`` batch-major minibatch groups, averaged: (k m, d)
    -> (m, d) (``G`` itself for k = 1)."""
    if k == 1:
        return G
    return mean_over(G.view(k, G.shape[0] // k, G.shape[1]), 0)


def mean_over(G: torch.Tensor, dim: int) -> torch.Tensor:
    """``G.mean(dim)``, its floats; over two entries one addition and a halving: torch's
    mean sums from 0 (0 + a + b is the float a + b, but for the sign of an exact zero)
    and divides by the count, so this is its value without its output's zero fill and
    strided reduction (a pass over the alignment gradients, tested)."""
    if G.shape[dim] != 2:
        return G.mean(dim=dim)
    return torch.add(G.select(dim, 0), G.select(dim, 1)).div_(2)


@dataclass
class RoundPlan:
    edges: torch.Tensor  # (E, 2) sampled pairs, i < j
    align_clients: torch.Tensor  # (2kE,) the alignment rows' clients
    # (2kE, d) their midpoints z_ij [then (m, d) the members' x_i], or SharedPoints
    points: torch.Tensor | SharedPoints
    align_salts: torch.Tensor  # (2kE,)
    members: torch.Tensor  # (n_present,) clients taking the model step
    # the alignment rows pair by pair (i, j for each minibatch: ``SharedPoints``' order)
    # instead of all i-endpoints, then all j, for each minibatch
    by_pair: bool = False

    @property
    def align_points(self) -> torch.Tensor:
        return self.points[: self.align_clients.numel()]


def round_rows(
    X: torch.Tensor,
    edges: torch.Tensor,
    members: torch.Tensor,
    k: int,
    with_models: bool,
    everyone: bool,
) -> RoundPlan:
    """The rows of a round's requests as one tensor: for each of the k minibatches both
    endpoints' gradients at z_ij (all i-endpoints, then all j, each on a fresh batch of
    its own client's data, salted by the partner so that the pair's draws differ from
    the step's); ``with_models``: the members' models x_i follow (one request for the
    round), written into one buffer instead of gathered and concatenated (``everyone``:
    the members are all of X's rows)."""
    i, j = edges[:, 0], edges[:, 1]
    E = i.numel()
    A = 2 * E * k  # alignment rows: k minibatches of both endpoints
    Z = X.new_empty(A + (members.numel() if with_models else 0), X.shape[1])
    mid = midpoints(X, i, j, out=Z[:E])
    Z[E : 2 * E].copy_(mid)
    for b in range(1, k):  # the further minibatches of alignment_batches
        Z[2 * E * b : 2 * E * (b + 1)].copy_(Z[: 2 * E])
    if with_models and everyone:
        Z[A:].copy_(X)
    elif with_models:
        torch.index_select(X, 0, members, out=Z[A:])
    salts = batch_salts(torch.cat([j, i]), k)
    return RoundPlan(edges, torch.cat([i, j]).repeat(k), Z, salts, members)


def shared_rows(
    X: torch.Tensor, edges: torch.Tensor, members: torch.Tensor, k: int, everyone: bool
) -> RoundPlan:
    """``round_rows(with_models=True)`` as ``SharedPoints``: each midpoint once, asked 2k
    times pair by pair (i then j, for each of the k minibatches), then the members'
    models once each; the rows draw what ``round_rows``' rows draw (the same clients,
    streams and salts, in another order)."""
    mid, clients, salts = pair_requests(X, edges, k)
    models = X if everyone else X.index_select(0, members)
    points = SharedPoints(((mid, 2 * k), (models, 1)))
    return RoundPlan(edges, clients, points, salts, members, by_pair=True)


def end_gradients(
    G_align: torch.Tensor, E: int, k: int, by_pair: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The E pairs' two ends' gradients (E, d) each, from their rows (``round_rows``'
    layout, or ``shared_rows``' with ``by_pair``), the k minibatches averaged."""
    if by_pair:  # (E, k, 2, d): the minibatches' mean of each end, as mean_of_batches
        G = G_align.view(E, k, 2, -1)
        G = G[:, 0] if k == 1 else mean_over(G, 1)  # (E, 2, d)
        return G[:, 0], G[:, 1]
    G_align = mean_of_batches(G_align, k)
    return G_align[:E], G_align[E:]
