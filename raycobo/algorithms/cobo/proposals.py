"""Pairs a round scores besides the sampler's own: re-checks of the pairs the pull reads
(``recheck``: a pair that one early sample made a collaborator is measured again, and
Eq. (1) takes it back out if it is not aligned) and a collaborator's collaborator
(``closure``: a cluster's pairs whose few early samples scored low are measured again
while the scores still tell). Both read W^t, so a round that has them is sampled only
once the round before it has updated W."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raycobo import rng
from raycobo.algorithms.cobo import weights
from raycobo.algorithms.samplers import EdgeSampler


@dataclass(frozen=True)
class Rechecks:
    """Each pair the pull reads is sampled with probability at least ``rate`` a round,
    raised by ``samples`` / S where the sampling strategy alone samples a pair S <
    ``samples`` times in the run (0 for either: as set)."""

    rate: float
    samples: float = 0.0

    def floor(self, sampler: EdgeSampler) -> float:
        """The sampling rate a pulled pair has at least (for the W step's k_t): ``rate``
        times ``samples`` / S, at most 1 (0 without re-checks)."""
        if not self.rate:
            return 0.0
        return min(1.0, self.rate * sampler.strategy().shortfall(float(self.samples)))

    def rate_at(self, sampler: EdgeSampler, t: int) -> float:
        """The probability that a pulled pair is drawn again in round t besides the
        sampler's own draw (p_t): (r - p_t) / (1 - p_t), so that it is sampled with
        probability r = ``floor`` in all; 0 where p_t is already at least r."""
        if not self.rate:
            return 0.0
        r, p = self.floor(sampler), sampler.probability(t)
        return max(0.0, (r - p) / (1.0 - p)) if p < 1 else 0.0


@dataclass(frozen=True)
class Closure:
    """Each present client with a pulled pair, with probability ``rate`` a round,
    proposes a client two pulled steps away that the pull does not read yet (``cut``:
    the pull's threshold)."""

    rate: float
    cut: float
    seed: int

    def pairs(self, W: weights.Weights, pulled: torch.Tensor, t: int) -> torch.Tensor:
        """Round t's proposals: each client i with a pulled pair (``pulled``, the pairs
        the pull reads among the present clients, on the CPU), with probability
        ``rate``, picks a pulled partner j uniformly, then j's pulled partner k uniformly
        (draws seeded by (seed, round), one triple per client of W whoever is present);
        the pair (i, k) is kept where k != i and the pull does not read it yet. -> (C, 2),
        i < k (possibly repeated)"""
        if self.rate <= 0 or pulled.numel() == 0:
            return pulled.new_zeros((0, 2))
        size = W.shape[0]
        src = torch.cat([pulled[:, 0], pulled[:, 1]])
        dst = torch.cat([pulled[:, 1], pulled[:, 0]])
        order = torch.argsort(src * size + dst)  # each client's partners, ascending
        src, dst = src[order], dst[order]
        degree = torch.bincount(src, minlength=size)
        first = torch.cumsum(degree, 0) - degree
        draw = torch.rand(size, 3, generator=rng.generator(self.seed, rng.CLOSURE, t))
        who = torch.nonzero(draw[:, 0].lt(self.rate) & degree.gt(0)).flatten()

        def partner(of: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            d = degree[of]
            return dst[first[of] + (u * d).long().clamp_max(d - 1)]

        mid = partner(who, draw[who, 1])
        far = partner(mid, draw[who, 2])
        keep = far.ne(who)
        i, k = who[keep], far[keep]
        unread = weights.weights_at(W, i, k).lt(self.cut)
        i, k = i[unread], k[unread]
        return torch.stack([torch.minimum(i, k), torch.maximum(i, k)], dim=1)


@dataclass(frozen=True)
class Proposals:
    """The pairs a round adds to the sampler's: ``rechecks`` and ``closure`` (the pulled
    pairs read at ``cut``), drawn with ``seed``."""

    rechecks: Rechecks
    closure: Closure
    cut: float
    seed: int

    def reads_w(self, sampler: EdgeSampler, t: int) -> bool:
        """Whether round t's pairs depend on W^t."""
        return self.rechecks.rate_at(sampler, t) > 0 or self.closure.rate > 0

    def added(
        self,
        edges: torch.Tensor,
        W: weights.Weights,
        active: torch.Tensor | None,
        sampler: EdgeSampler,
        t: int,
    ) -> torch.Tensor:
        """``edges`` and, each with probability ``Rechecks.rate_at`` (seeded by (seed,
        round)), the pairs the pull reads in W^t, and the closure's proposals. -> (E',
        2), i < j, sorted, distinct"""
        rate = self.rechecks.rate_at(sampler, t)
        if rate <= 0 and self.closure.rate <= 0:
            return edges
        size = W.shape[0]
        pulled = weights.read_pairs(W, self.cut, active).cpu()
        if pulled.numel() == 0:
            return edges
        chosen = self.closure.pairs(W, pulled, t)
        if rate > 0:  # the re-checks' own draw (closure alone: none)
            draw = torch.rand(pulled.shape[0], generator=rng.generator(self.seed, rng.RECHECK, t))
            chosen = torch.cat([pulled[draw < rate], chosen])
        keys = torch.cat(
            [
                edges[:, 0] * size + edges[:, 1],
                (chosen[:, 0] * size + chosen[:, 1]).to(edges.device),
            ]
        )
        keys = torch.unique(keys)  # sorted: the order of the sampler's own edges
        return torch.stack([keys // size, keys % size], dim=1)
