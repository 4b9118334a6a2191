"""The pair-score request: for each pair (i, j), a score of the two clients' gradients at
the pair's point z_ij (CoBo's Eq. 1: its midpoint), each end's gradient taken on a fresh
minibatch of its own client's data, or the mean over ``batches`` of them.

A method asks for it (``PairScores``); ``answer`` computes it over any ``ClientOps``
from ``grads``: one request of all the rows, or, for an ops that takes ``SharedPoints``,
each point once for its 2k rows and one gradient per pair end (the mean of its k
minibatches, which that ops may compute as one gradient of their samples together),
``ops.shared_part_rows`` rows at a time. An ops that holds at most ``ops.request_rows``
gradient rows at once (the local engine: its memory budget) gets a larger request in
parts of the pairs, each part reduced to its scores before the next. Every layout asks
each row for the same minibatch and gives each pair the same score, the shared points'
to float rounding (tested). A score is a function (G_i, G_j, floor) -> (E,) registered
by name (``register_score``); ``floor`` is the least denominator a bounded score divides
by. The built-in scores read only the ends' inner products and norms, so an ops that
computes those without writing the gradients (``scores_by_grams``: the local engine's
MLP, for ends of several minibatches, where its layers are wide enough for that to be
cheaper) is asked for them instead, to float rounding the same scores (tested).

The draws: end i of pair (i, j) is client i's stream ALIGN salted by j (and end j by
i), minibatch b > 0 by that salt + b * ALIGN_SALT_STRIDE, a salt no client id reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from raycobo import rng

ScoreFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
SCORES: dict[str, ScoreFn] = {}
# a score as a function of its ends' inner products (``GRAM_FORMS``, below)
GramFn = Callable[[torch.Tensor, float], torch.Tensor]
GRAM_FORMS: dict[str, GramFn] = {}
ALIGN_SALT_STRIDE = 1 << 24
ALIGN_BATCHES_MAX = 64
# what a round holds per pair scored besides its gradients: the pair, its key, its score
# and the W step's temporaries
PAIR_BYTES = 64


def register_score(name: str) -> Callable[[ScoreFn], ScoreFn]:
    """Register a pair score under ``name`` (CoBo's ``algorithm.alignment``)."""

    def add(fn: ScoreFn) -> ScoreFn:
        SCORES[name] = fn
        GRAM_FORMS.pop(name, None)  # a score registered again is read from its gradients
        return fn

    return add


@register_score("inner")
def inner(G_i: torch.Tensor, G_j: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """<g_i(z_ij), g_j(z_ij)>, as CoBo's Eq. (1) prints it."""
    return torch.linalg.vecdot(G_i, G_j)


@register_score("cosine")
def cosine(G_i: torch.Tensor, G_j: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """The inner product over ||g_i|| ||g_j|| (in [-1, 1], whatever the gradients' scale)."""
    return _over_norms(G_i, G_j, 0.0)


@register_score("bounded")
def bounded(G_i: torch.Tensor, G_j: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """The inner product over max(||g_i|| ||g_j||, floor): the cosine while the gradients
    are large, and below the floor the inner product in units of the floor."""
    return _over_norms(G_i, G_j, floor)


def _over_norms(G_i: torch.Tensor, G_j: torch.Tensor, floor: float) -> torch.Tensor:
    dot = torch.linalg.vecdot(G_i, G_j)
    norms = torch.linalg.vector_norm(G_i, dim=1) * torch.linalg.vector_norm(G_j, dim=1)
    return _over(dot, norms, floor)


def _over(dot: torch.Tensor, norms: torch.Tensor, floor: float) -> torch.Tensor:
    return dot / norms.clamp_min(max(floor, 1e-12))


def _norms(grams: torch.Tensor) -> torch.Tensor:
    """||g_i|| ||g_j|| from (E, 3) inner products (<g_i, g_j>, ||g_i||^2, ||g_j||^2)."""
    return grams[:, 1].clamp_min(0).sqrt() * grams[:, 2].clamp_min(0).sqrt()


# the built-in scores as functions of the ends' inner products (<g_i, g_j>, ||g_i||^2,
# ||g_j||^2), (E, 3), for an ops that computes those without the gradients
# (``scores_by_grams``); a score registered without one is computed from the gradients
GRAM_FORMS.update(
    inner=lambda grams, floor: grams[:, 0],
    cosine=lambda grams, floor: _over(grams[:, 0], _norms(grams), 0.0),
    bounded=lambda grams, floor: _over(grams[:, 0], _norms(grams), floor),
)


def alignment_scores(
    G_i: torch.Tensor, G_j: torch.Tensor, kind: str = "inner", floor: float = 0.0
) -> torch.Tensor:
    """The score ``kind`` of each pair. G_i, G_j: (E, d) -> (E,)"""
    return SCORES[kind](G_i, G_j, floor)


@dataclass(frozen=True)
class PairScores:
    """A request: the score ``score`` (a name in ``SCORES``, with ``floor``) of each pair
    (i, j) of ``pairs`` (E, 2) from both ends' gradients at the pair's midpoint of
    ``models`` (n, d), each the mean of ``batches`` minibatches -> (scores (E,), no
    losses (0,)). The midpoints are made a part of the pairs at a time (``points``), so
    a round of many pairs holds the points and gradients of one part."""

    pairs: torch.Tensor
    models: torch.Tensor
    batches: int = 1
    score: str = "inner"
    floor: float = 0.0

    @property
    def rows(self) -> int:
        return 2 * self.batches * int(self.pairs.shape[0])

    def points(self, a: int = 0, b: int | None = None) -> torch.Tensor:
        """The midpoints z_ij = (x_i + x_j) / 2 of pairs [a, b), (b - a, d)."""
        ends = self.pairs[a:b]
        return midpoints(self.models, ends[:, 0], ends[:, 1])


@dataclass(frozen=True)
class SharedPoints:
    """The points of a gradient request whose rows share them: ``segments`` is a tuple of
    (values (U, d), R), each point of a segment asked R times in a row (point-major:
    rows u R .. u R + R - 1 are at values[u]), the segments one after another. Each run
    of ``means`` rows (R a multiple of it) asks for one gradient, the mean of its rows'
    minibatch gradients: the answer has ``gradient_rows`` gradients and ``rows`` losses.
    A client ops that sets ``shares_points`` takes it as ``grads``' Z and may compute a
    point's R rows together (the local engine's MLP: one GEMM of R minibatches on one
    copy of the point, where ``materialize`` would write R copies, and each run of
    ``means`` rows as one gradient of their samples); its answer is that of
    ``materialize()``'s rows averaged in runs (``mean_of_runs``), to float rounding (the
    same bits for means = 1); pair scores are asked of it in parts of its
    ``shared_part_rows`` rows (``answer``)."""

    segments: tuple[tuple[torch.Tensor, int], ...]
    means: int = 1

    def __post_init__(self):
        for _, R in self.segments:
            if R % self.means:
                raise ValueError(f"{R} rows a point do not split in runs of {self.means}")

    @property
    def rows(self) -> int:
        return sum(v.shape[0] * r for v, r in self.segments)

    @property
    def gradient_rows(self) -> int:
        return self.rows // self.means

    @property
    def dtype(self) -> torch.dtype:
        return self.segments[0][0].dtype

    def materialize(self) -> torch.Tensor:
        """The (rows, d) points, one copy per row."""
        return torch.cat([v.repeat_interleave(r, dim=0) for v, r in self.segments])


def midpoints(
    X: torch.Tensor, i: torch.Tensor, j: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """z_ij = (x_i + x_j) / 2 for each pair, (E, d) (into ``out`` if given)."""
    mid = torch.index_select(X, 0, i, out=out) if out is not None else X.index_select(0, i)
    return mid.add_(X.index_select(0, j)).mul_(0.5)


def batch_salts(salts: torch.Tensor, k: int) -> torch.Tensor:
    """The salts of ``k`` minibatches per gradient: batch 0 keeps the pair's own salt,
    batch b adds b * ALIGN_SALT_STRIDE. (m,) -> (k m,), batch-major."""
    if k == 1:
        return salts
    if salts.numel() and int(salts.max()) >= ALIGN_SALT_STRIDE:
        raise ValueError(
            f"algorithm.alignment_batches > 1 supports fewer than {ALIGN_SALT_STRIDE:,} clients"
        )
    return torch.cat([salts + b * ALIGN_SALT_STRIDE for b in range(k)])


def end_rows(
    ends: torch.Tensor,
    points: torch.Tensor,
    partners: torch.Tensor,
    k: int,
    copies: int = 1,
    extra: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradient rows of pair ends, batch-major (every end for minibatch 0, then for
    1, ...): ends (m,) at ``points`` (m / copies, d) -- each point the point of
    ``copies`` ends, one block of them after another --, each end salted by its partner
    (m,) -> (clients (k m,), points (k m + e, d), salts (k m,)), the points written
    once, followed by ``extra`` (e, d) where given (rows of another request)."""
    if k * copies == 1 and extra is None:
        return ends, points, partners
    U, R = points.shape[0], k * copies
    Z = points.new_empty(R * U + (0 if extra is None else extra.shape[0]), points.shape[1])
    at = torch.arange(U, device=points.device).repeat(R)
    torch.index_select(points, 0, at, out=Z[: R * U])
    if extra is not None:
        Z[R * U :] = extra
    return ends.repeat(k), Z, batch_salts(partners, k)


def rows_of(
    req: PairScores, extra: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The request's gradient rows batch-major (for each minibatch all i-ends, then all
    j-ends): (clients (2kE,), points (2kE, d), salts (2kE,)); ``extra`` (e, d): points
    of e more rows after them (``end_rows``)."""
    i, j = req.pairs[:, 0], req.pairs[:, 1]
    both = torch.cat([i, j])
    return end_rows(both, req.points(), torch.cat([j, i]), req.batches, 2, extra)


def shared_rows(req: PairScores, a: int, b: int):
    """Pairs [a, b)'s rows as ``SharedPoints``, pair by pair and end by end (i's k
    minibatches, then j's), each point once and one gradient per end (its minibatches'
    mean): (clients (2kP,), points, salts (2kP,))."""
    k = req.batches
    ends = req.pairs[a:b]  # (P, 2)
    clients = ends.repeat_interleave(k, dim=1).flatten()  # i, i, j, j for k = 2
    salts = run_salts(ends.flip(1).flatten(), k)
    return clients, SharedPoints(((req.points(a, b), 2 * k),), means=k), salts


def run_salts(salts: torch.Tensor, k: int) -> torch.Tensor:
    """``batch_salts`` end-major: each end's k minibatches in a run. (m,) -> (k m,)"""
    return batch_salts(salts, k).view(k, -1).transpose(0, 1).flatten()


def scores_from(req: PairScores, G: torch.Tensor, by_pair: bool = False) -> torch.Tensor:
    """The scores of the request's pairs (or of a part's) from their gradient rows:
    ``rows_of``' layout (2kE, d), or with ``by_pair`` one gradient per end, pair by pair
    (2E, d), ``shared_rows``' answer."""
    if by_pair:
        G = G.view(G.shape[0] // 2, 2, -1)
        G_i, G_j = G[:, 0], G[:, 1]
    else:
        E = G.shape[0] // (2 * req.batches)
        G = mean_of_batches(G, req.batches)
        G_i, G_j = G[:E], G[E:]
    return alignment_scores(G_i, G_j, req.score, req.floor)


def mean_of_batches(G: torch.Tensor, k: int) -> torch.Tensor:
    """The gradients of ``k`` batch-major minibatch groups, averaged: (k m, d) -> (m, d)
    (``G`` itself for k = 1)."""
    if k == 1:
        return G
    return mean_over(G.view(k, G.shape[0] // k, G.shape[1]), 0)


def mean_of_runs(G: torch.Tensor, k: int) -> torch.Tensor:
    """The gradients of runs of ``k`` consecutive rows, averaged: (k m, d) -> (m, d)
    (``G`` itself for k = 1)."""
    if k == 1:
        return G
    return mean_over(G.view(G.shape[0] // k, k, G.shape[1]), 1)


def mean_over(G: torch.Tensor, dim: int) -> torch.Tensor:
    """``G.mean(dim)``, its floats; over two entries one addition and a halving: torch's
    mean sums from 0 (0 + a + b is the float a + b, but for the sign of an exact zero)
    and divides by the count, so this is its value without its output's zero fill and
    strided reduction (a pass over the alignment gradients, tested)."""
    if G.shape[dim] != 2:
        return G.mean(dim=dim)
    return torch.add(G.select(dim, 0), G.select(dim, 1)).div_(2)


def pair_parts(E: int, per: int) -> list[tuple[int, int]]:
    """[a, b) ranges over E pairs of ``per`` pairs each (at least 2), the last taking a
    single leftover pair: no part but a lone pair's own has one pair (a reduction over
    one row splits its sum between threads, over several it does not)."""
    per = max(2, per)
    bounds = list(range(0, E, per)) + [E]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def shares_points(ops) -> bool:
    """Whether ``ops`` takes ``SharedPoints`` (an optional attribute of a ClientOps)."""
    return bool(getattr(ops, "shares_points", False))


def held_rows(ops) -> int | None:
    """The gradient rows ``ops`` holds at once (its optional ``request_rows``; None: any)."""
    return getattr(ops, "request_rows", None)


def round_bytes(pairs: int, batches: int, d: int) -> int:
    """What a round of ``pairs`` pair scores holds at least: the pairs, and the least part
    of their gradients (2 pairs: 4k rows, each with its point and a temporary)."""
    return pairs * PAIR_BYTES + 4 * 2 * 2 * batches * 3 * d


def part(req: PairScores, a: int, b: int) -> PairScores:
    """Pairs [a, b) of ``req`` as a request of their own."""
    return replace(req, pairs=req.pairs[a:b])


def answer(ops, req: PairScores, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``req`` of round t over ``ops.grads``: as shared points, in parts, for an ops that
    takes them; else ``answer_rows``. -> (scores (E,), no losses (0,))"""
    E = int(req.pairs.shape[0])
    if E == 0 or not shares_points(ops):
        return answer_rows(ops, req, t)
    per = min(r for r in (getattr(ops, "shared_part_rows", None), held_rows(ops), req.rows) if r)
    # one output made before the parts, and nothing of a part kept past it: a tensor
    # that outlives its part splits the free block the next part needs in a heap that
    # is never trimmed (``engine.memory.keep_freed_memory``)
    scores = req.models.new_empty(E)
    gram = GRAM_FORMS.get(req.score) if by_grams(ops, req.batches) else None
    for a, b in pair_parts(E, per // (2 * req.batches)):
        clients, Z, salts = shared_rows(req, a, b)
        if gram is not None:
            scores[a:b] = gram(ops.pair_grams(clients, Z, t, rng.ALIGN, salts), req.floor)
        else:
            G, _ = ops.grads(clients, Z, t, rng.ALIGN, salts)
            scores[a:b] = scores_from(req, G, by_pair=True)
            del G
        del clients, Z, salts
    return scores, req.models.new_zeros(0)


def by_grams(ops, batches: int) -> bool:
    """Whether ``ops`` answers pair scores of ends of ``batches`` minibatches from their
    inner products (its optional ``scores_by_grams`` and ``pair_grams``)."""
    pays = getattr(ops, "scores_by_grams", None)
    return pays is not None and bool(pays(batches))


def answer_rows(ops, req: PairScores, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``req`` of round t as plain rows (``rows_of``): one ``grads`` request, or, beyond
    the rows ``ops`` holds at once, one per part of the pairs, each reduced to its scores
    before the next."""
    none = req.models.new_zeros(0)
    E, held = int(req.pairs.shape[0]), held_rows(ops)
    if E == 0:
        return none.clone(), none
    if held is None or req.rows <= held:
        return _plain_scores(ops, req, t), none
    scores = req.models.new_empty(E)
    for a, b in pair_parts(E, held // (2 * req.batches)):
        scores[a:b] = _plain_scores(ops, part(req, a, b), t)
    return scores, none


def _plain_scores(ops, req: PairScores, t: int) -> torch.Tensor:
    clients, Z, salts = rows_of(req)
    G, _ = ops.grads(clients, Z, t, rng.ALIGN, salts)
    del Z  # the points go before the scores' minibatch mean is made
    return scores_from(req, G)
