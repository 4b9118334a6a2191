"""Eq. (1)'s step on W: projected gradient ascent on the sampled pairs' scores, with
the step size's schedule (``gamma_decay``, each pair on its own clock where clients
joined late) and the fade of the weights the pull does not read."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from raycobo.algorithms.cobo import weights
from raycobo.algorithms.projections import project_box, project_simplex
from raycobo.algorithms.samplers import EdgeSampler


def _decay(k: torch.Tensor | float):
    """gamma_decay sqrt's divisor after k expected samples: sqrt(1 + k)."""
    return torch.sqrt(1.0 + k) if isinstance(k, torch.Tensor) else math.sqrt(1.0 + k)


@dataclass(frozen=True)
class PairClock:
    """gamma_decay counted on each pair's own clock where clients joined late: a pair's
    k_t is the expected samples it has had since the later of its two clients (last)
    joined, so a newcomer's pairs step as a pair does at the start of a run (the round's
    gamma, from the run's k_t, times ``boost``), not with the small gamma of a pair
    sampled for hundreds of rounds. The recheck's pulled-pair step is raised by the same
    ratio."""

    now: float  # k_t: the expected samples before this round since the run started
    born: torch.Tensor  # (n,) the expected samples before each client's (last) join

    def boost(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """(E,) the pairs (i, j)'s gamma over the round's: decay(k_t) / decay(k_t - b),
        b the pair's expected samples before its later client joined (1 for a pair
        present from the start)."""
        born = self.born.to(i.device)
        since = (self.now - torch.maximum(born[i], born[j])).clamp_min(0.0)
        return _decay(self.now) / _decay(since)


@dataclass(frozen=True)
class WStep:
    """Eq. (1)'s step in one round: ``gamma``, and ``pulled`` for the pairs the pull
    reads (w_ij >= ``cut``; > 0 with no cut), which re-checks sample more often than the
    sampler does (``Schedule.w_step``); ``pulled`` None: ``gamma`` for every pair.
    ``clock``: pairs whose clients joined late step on their own clock (``PairClock``;
    None: every pair on the run's)."""

    gamma: float
    pulled: float | None = None
    cut: float = 0.0
    clock: PairClock | None = None

    def move(
        self, current: torch.Tensor, scores: torch.Tensor, i: torch.Tensor, j: torch.Tensor
    ) -> torch.Tensor:
        """Each sampled pair (i, j)'s change before the projection, from its weight
        before the step and its score."""
        if self.pulled is None:
            move = self.gamma * scores
        else:
            read = current.ge(self.cut) if self.cut > 0 else current.gt(0)
            step = torch.where(
                read, current.new_tensor(self.pulled), current.new_tensor(self.gamma)
            )
            move = step * scores
        if self.clock is not None:
            move = move * self.clock.boost(i, j).to(move.dtype)
        return move


def update_weights(
    W: torch.Tensor, edges: torch.Tensor, scores: torch.Tensor, gamma: float | WStep, domain: str
) -> torch.Tensor:
    """Projected gradient ascent step on the sampled entries (Eq. 1).

    W: (n, n); edges: (E, 2) with i < j; scores: (E,) = <g_i(z_ij), g_j(z_ij)>."""
    if edges.numel() == 0:
        return W
    if weights.is_sparse(W):
        i, j = edges[:, 0], edges[:, 1]
        current = W.get(i, j)
        move = _w_step(gamma).move(current, scores.to(current.dtype), i, j)
        return W.update(i, j, project_box(current + move))
    rows = torch.arange(W.shape[0], device=W.device)
    return update_weight_rows(W, rows, edges, scores, gamma, domain)


def update_weight_rows(
    W_rows: torch.Tensor,
    row_ids: torch.Tensor,
    edges: torch.Tensor,
    scores: torch.Tensor,
    gamma: float | WStep,
    domain: str,
) -> torch.Tensor:
    """Eq. (1) on some rows of W: ``W_rows`` (r, n) are the rows ``row_ids`` (r,), as a
    host holding those clients keeps them. Every row gets the numbers that updating the
    whole W would give it (``update_weights`` is this with all rows). Edges that touch
    none of the rows are ignored."""
    gamma = _w_step(gamma)
    n = W_rows.shape[1]
    pos = torch.full((n,), -1, dtype=torch.int64, device=W_rows.device)
    pos[row_ids] = torch.arange(row_ids.numel(), device=W_rows.device)
    i, j = edges[:, 0].to(W_rows.device), edges[:, 1].to(W_rows.device)
    pi, pj = pos[i], pos[j]
    a, b = pi >= 0, pj >= 0  # the edge's row w_i. / w_j. is held here
    scores = scores.to(W_rows.device, W_rows.dtype)  # (E,)
    W = W_rows.clone()
    if domain == "box":  # W stays symmetric: w_ij = w_ji, updated together
        current = torch.where(a, W[pi.clamp_min(0), j], W[pj.clamp_min(0), i])
        w = project_box(current + gamma.move(current, scores, i, j))
        W[pi[a], j[a]] = w[a]
        W[pj[b], i[b]] = w[b]
        return W
    step = gamma.gamma * scores  # the simplex domain has no pulled-pair step
    if gamma.clock is not None:
        step = step * gamma.clock.boost(i, j).to(step.dtype)
    W[pi[a], j[a]] += step[a]
    W[pj[b], i[b]] += step[b]
    touched = torch.unique(torch.cat([pi[a], pj[b]]))
    mask = torch.ones(touched.numel(), n, dtype=torch.bool, device=W.device)
    mask[torch.arange(touched.numel(), device=W.device), row_ids[touched]] = False  # w_ii
    W[touched] = project_simplex(W[touched], mask)
    return W


def _w_step(gamma: float | WStep) -> WStep:
    return gamma if isinstance(gamma, WStep) else WStep(float(gamma))


# past this many present clients the fade grows as n / it: a row's pairs across the
# clusters, and so the residue their small late gains leave below the threshold, grow as
# n: whole-W mass inside 0.85-0.88 -> 0.91 at 400 clients (benchmarks/regimes/LOG.md, the
# twentieth and twenty-first rounds)
FADE_CLIENTS = 160


@dataclass(frozen=True)
class Schedule:
    """Eq. (1)'s step sizes and fade, round by round, among n present clients (the
    sampler ``EdgeSampler`` of those n): gamma divided by sqrt(1 + k_t) (``decays``;
    k_t = the samples a pair has had in expectation before round t), so that
    W is learned early and its late samples, noisy once the models fit their data, move
    it little; and what each weight below the pull's threshold loses a round."""

    gamma: float
    decays: bool  # gamma / sqrt(1 + k_t) (gamma_decay sqrt), or a constant gamma
    cut: float  # the pull's threshold (0: none)
    fade: float = 0.0  # fade (0: off)

    def gamma_at(self, sampler: EdgeSampler, t: int, floor: float = 0.0) -> float:
        """Round t's gamma, k_t counting a sampling rate of at least ``floor``."""
        if not self.decays:
            return self.gamma
        return self.gamma / _decay(sampler.expected_samples(t, floor))

    def w_step(self, sampler: EdgeSampler, t: int, recheck_floor: float = 0.0) -> WStep:
        """Round t's Eq. (1) step. Where re-checks sample the pairs the pull reads at
        ``recheck_floor`` (more often than the sampler), their decay counts those samples
        too (k_t = sum over tau < t of max(p_tau, floor), as if pulled all along), so the
        late re-samples of a cluster's pairs, whose scores are then about 0, move their
        weights as little as a pair sampled that often should."""
        gamma = self.gamma_at(sampler, t)
        if not self.decays or not recheck_floor:
            return WStep(gamma, cut=self.cut)
        pulled = min(gamma, self.gamma_at(sampler, t, recheck_floor))
        if pulled >= gamma:  # the sampler's rate was never below the floor
            return WStep(gamma, cut=self.cut)
        return WStep(gamma, pulled, self.cut)

    def clock(self, sampler: EdgeSampler, joined: torch.Tensor | None, t: int) -> PairClock | None:
        """Round t's clocks of the pairs whose later client joined after the start
        (``joined``: (n,) the round before which each client last joined); None where
        every pair's is the run's (no late joiner, or gamma not decayed)."""
        if joined is None or not self.decays or not bool(joined.gt(0).any()):
            return None
        rounds = joined.cpu()
        born = torch.zeros(rounds.shape, dtype=torch.float64)
        for r in torch.unique(rounds).tolist():  # the few rounds clients joined at
            born[rounds == r] = sampler.expected_samples(int(r))
        return PairClock(sampler.expected_samples(t), born)

    def fade_at(self, sampler: EdgeSampler, t: int) -> float:
        """What each weight below the pull's threshold loses in round t: fade * threshold
        * p_t, the same all run long (a pair below the threshold climbs where its mean
        score exceeds fade * threshold / gamma_t, more as gamma_t shrinks, so what early
        samples left there returns to 0 within the run); past ``FADE_CLIENTS`` present
        clients grown as n / FADE_CLIENTS (a row's pairs across the clusters grow as n)."""
        fade = self.fade
        if not fade or self.cut <= 0:
            return 0.0
        if sampler.n > FADE_CLIENTS:
            fade *= sampler.n / FADE_CLIENTS
        return fade * self.cut * sampler.probability(t)
