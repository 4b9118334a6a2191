"""Edge sampling for CoBo's client-selection step (CoBo Section 4.1, Table 1).

Each unordered pair (i, j), i < j, is updated in round t with probability p_t:

- ``constant``: p = min(1, c / n)  -- O(n) alignment gradients per round in expectation
  (Algorithm 1, line 11, with c = 1);
- ``time``:     p_t = min(1, c / (t + 1))  -- O(1/t);
- ``mixed``:    constant for the first ``mixed_switch`` share of rounds (0.2 % in the
  paper), then time-dependent but never above the constant rate: min(c / n, c_t / (t + 1))
  (at the paper's n = 8 and switch the same; with many clients and an early switch, 1/t
  alone would sample a share of all n^2 / 2 pairs each round);
- ``mixed_sqrt``: constant for the first ``mixed_switch`` share of rounds, then
  p_t = min(1, c / sqrt(t + 1)) -- the authors' code (github epfml/CoBo, grouping.py:
  p = 2/n for 800 steps, then 1/sqrt(t));
- ``full``:     every pair, every round (the paper's "no sampling" oracle).

With ``start_all`` round 0 samples every pair, whatever the strategy: where the models
start from one x^0, every pair's midpoint is x^0 there, so its score reads its two
clients' data alone, before either model has fit its own (CoBo's ``start_all_pairs``).
Every later round's rate is the run's own: a pair's expected samples count round 0's,
the scale-up below does not. Where the strategy samples a pair S < 1 times over the run
(a short run among very many clients), round 0 samples each pair with probability S
instead: it at most doubles the run's pairs.

Where a strategy samples a pair S < ``least_samples`` times over the run (in
expectation: many clients, a short run), all its p_t are multiplied by least_samples / S,
at most ``max_scale`` and at most 1 (CoBo's ``sampling_samples``, at most ``SCALE_MAX``);
the mixed switch stays where the strategy's own rates put it.

Each strategy is one function registered with ``@sampling_rule(name)`` (p_t from the
sampler's settings); CoBo's ``algorithm.sampling`` accepts the registered names. Draws
are seeded by (seed, round) only, so they are reproducible and cost O(expected edges) --
not O(n^2) -- by geometric skipping over the pair index.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from raycobo import rng

# the most CoBo's sampling_samples raises a strategy's rates: a round's pairs stay O(n)
SCALE_MAX = 4.0


def n_pairs(n: int) -> int:
    return n * (n - 1) // 2


def unrank_pairs(lin: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Map linear indices of the strict upper triangle (row-major) to (i, j), i < j."""
    lin = lin.to(torch.float64)
    total = n * (n - 1) / 2
    # row i holds n-1-i pairs; invert the cumulative count
    i = n - 2 - torch.floor(torch.sqrt(-8 * lin + 4 * n * (n - 1) - 7) / 2 - 0.5)
    j = lin + i + 1 - total + (n - i) * ((n - i) - 1) / 2
    return i.to(torch.int64), j.to(torch.int64)


def bernoulli_pairs(n: int, p: float, gen: torch.Generator) -> torch.Tensor:
    """Each pair independently with probability p; returns edges (E, 2), i < j, sorted."""
    N = n_pairs(n)
    if N == 0 or p <= 0:
        return torch.empty(0, 2, dtype=torch.int64)
    if p >= 1:
        lin = torch.arange(N, dtype=torch.int64)
    elif N <= 1 << 20 or p > 0.05:
        lin = torch.nonzero(torch.rand(N, generator=gen, dtype=torch.float64) < p).flatten()
    else:
        # geometric gaps between successes: O(pN) work
        mean, sd = N * p, math.sqrt(N * p * (1 - p))
        k = int(mean + 8 * sd + 16)
        u = torch.rand(k, generator=gen, dtype=torch.float64).clamp_min(1e-300)
        gaps = torch.floor(torch.log(u) / math.log1p(-p)).to(torch.int64) + 1
        lin = torch.cumsum(gaps, 0) - 1
        while int(lin[-1]) < N - 1:  # extremely unlikely: extend
            u = torch.rand(k, generator=gen, dtype=torch.float64).clamp_min(1e-300)
            more = torch.floor(torch.log(u) / math.log1p(-p)).to(torch.int64) + 1
            lin = torch.cat([lin, lin[-1] + torch.cumsum(more, 0)])
        lin = lin[lin < N]
    i, j = unrank_pairs(lin, n)
    return torch.stack([i, j], dim=1)


# The sampling strategies by name: p_t for one pair in round t, from the sampler's
# settings. A new strategy is one decorated function here (CoBo's ``algorithm.sampling``
# accepts every registered name). A rule's p_t may step up only at the switch round and
# must not grow within a phase: the memory check reads the run's highest rate there.
SamplingRule = Callable[["EdgeSampler", int], float]
SAMPLINGS: dict[str, SamplingRule] = {}


def sampling_rule(name: str) -> Callable[[SamplingRule], SamplingRule]:
    def register(rule: SamplingRule) -> SamplingRule:
        SAMPLINGS[name] = rule
        return rule

    return register


@dataclass(frozen=True)
class EdgeSampler:
    kind: str  # a name in SAMPLINGS
    n: int
    rounds: int
    seed: int
    sampling_c: float = 1.0
    time_c: float = 1.0
    mixed_switch: float = 0.002  # the share of the rounds before mixed's switch
    least_samples: float = 0.0  # p_t scaled where a pair would have fewer (``scale``)
    max_scale: float = math.inf  # ... by at most this
    start_all: bool = False  # round 0: every pair (``start_rate``)

    def __post_init__(self):
        if self.kind not in SAMPLINGS:
            raise ValueError(f"unknown sampling '{self.kind}' (one of {', '.join(SAMPLINGS)})")

    @classmethod
    def for_cobo(cls, cfg, n: int, rounds: int, seed: int) -> EdgeSampler:
        """The sampler of CoBo's settings (``sampling``, ``sampling_c``, ``time_c``,
        ``mixed_switch``, ``sampling_samples``, ``start_all_pairs``)."""
        least = float(getattr(cfg, "sampling_samples", 0.0) or 0.0)
        return cls(
            cfg.sampling, n, rounds, seed, cfg.sampling_c, cfg.time_c,
            float(cfg.mixed_switch), least, SCALE_MAX,
            bool(getattr(cfg, "start_all_pairs", False)),
        )  # fmt: skip

    def constant_rate(self) -> float:
        return min(1.0, self.sampling_c / max(self.n, 1))

    def switch_round(self) -> int:
        return int(math.ceil(self.mixed_switch * self.rounds))

    def probability(self, t: int) -> float:
        p = SAMPLINGS[self.kind](self, t)
        if t == 0 and self.start_all:
            p = max(p, self.start_rate)
        return p if self.scale == 1.0 else min(1.0, p * self.scale)

    @functools.cached_property
    def start_rate(self) -> float:
        """Round 0's rate with ``start_all``: 1, or S where the sampler without it samples
        a pair S < 1 times over the run (its scale-up included)."""
        have = dataclasses.replace(self, start_all=False).samples_below(1.0)
        return 1.0 if have is None else have

    @functools.cached_property
    def scale(self) -> float:
        """``least_samples`` K over S, the samples of a pair the strategy alone expects
        over the run, where S < K, at most ``max_scale`` (1 elsewhere, and with K = 0):
        every p_t is multiplied by it (at most 1), so that a pair is sampled about K times
        even in a short run among many clients, the strategy's shape over the rounds
        kept, and a round's pairs stay within max_scale times the strategy's (O(n))."""
        return min(self.max_scale, self.strategy().shortfall(self.least_samples))

    def expected_samples(self, t: int, floor: float = 0.0) -> float:
        """How often a pair has been sampled before round t, in expectation: the sum of
        p_tau over tau < t (of max(p_tau, ``floor``): a pair also drawn at that rate)."""
        if t <= 0:
            return 0.0
        return _cumulative(self, t, floor)

    def strategy(self) -> EdgeSampler:
        """This sampler without ``least_samples`` and ``start_all``: the strategy's own
        rates."""
        return dataclasses.replace(
            self, least_samples=0.0, max_scale=math.inf, seed=0, start_all=False
        )

    def shortfall(self, k: float) -> float:
        """k over S, this sampler's samples of a pair over the run, where S < k (1 where
        S >= k, and with k = 0)."""
        if not k:
            return 1.0
        have = self.samples_below(k)
        if have is None:
            return 1.0
        return k / have if have > 0 else math.inf

    def samples_below(self, k: float) -> float | None:
        """The samples a pair has over the whole run, in expectation (the sum of p_t over
        the rounds), where that is below ``k``; None where it reaches ``k`` (the sum
        stops there: a run of millions of rounds costs only the rounds up to k)."""
        return _samples_below(dataclasses.replace(self, seed=0), float(k))

    def highest_probability(self) -> float:
        """The largest p_t of the run: the larger of the rates where a phase begins
        (round 0 and the switch round), since every rule's p_t does not grow within a
        phase; O(1) for any number of rounds."""
        starts = [t for t in (0, self.switch_round()) if t < self.rounds]
        return max((self.probability(t) for t in starts), default=0.0)

    def sample(self, t: int) -> torch.Tensor:
        """Edges (E, 2) with i < j for round t."""
        gen = rng.generator(self.seed, rng.SAMPLER, t)
        return bernoulli_pairs(self.n, self.probability(t), gen)


@sampling_rule("constant")
def _constant(s: EdgeSampler, t: int) -> float:
    return s.constant_rate()


@sampling_rule("time")
def _time(s: EdgeSampler, t: int) -> float:
    return min(1.0, s.time_c / (t + 1))


@sampling_rule("mixed")
def _mixed(s: EdgeSampler, t: int) -> float:
    return s.constant_rate() if t < s.switch_round() else min(s.constant_rate(), _time(s, t))


@sampling_rule("mixed_sqrt")
def _mixed_sqrt(s: EdgeSampler, t: int) -> float:  # the authors' code: 2/n, then 1/sqrt(t)
    if t < s.switch_round():
        return s.constant_rate()
    return min(1.0, s.time_c / math.sqrt(t + 1))


@sampling_rule("full")
def _full(s: EdgeSampler, t: int) -> float:
    return 1.0


_TABLES: collections.OrderedDict = collections.OrderedDict()  # (sampler, floor) -> sums
_KEPT_TABLES = 64


def _probabilities(sampler: EdgeSampler, upto: int, floor: float) -> list[float]:
    """The prefix sums of max(p_t, floor) for t < upto, grown as rounds are asked for
    (the same additions in the same order as one pass: the same floats), so that a run
    holds a table as long as the rounds it has reached, not as ``rounds`` (which may be
    large); the 64 most recently used tables are kept."""
    key = (sampler, floor)
    out = _TABLES.get(key)
    if out is None:
        out = _TABLES[key] = [0.0]
        while len(_TABLES) > _KEPT_TABLES:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(key)
    total = out[-1]
    for t in range(len(out) - 1, upto):
        total += max(sampler.probability(t), floor)
        out.append(total)
    return out


@functools.lru_cache(maxsize=64)
def _samples_below(sampler: EdgeSampler, k: float) -> float | None:
    total = 0.0
    for t in range(sampler.rounds):
        total += sampler.probability(t)
        if total >= k:
            return None
    return total


def _cumulative(sampler: EdgeSampler, t: int, floor: float = 0.0) -> float:
    """sum_{tau < t} max(p_tau, floor), from a table grown up to round t (cached per
    sampler, the seed aside: it does not change the probabilities)."""
    key = dataclasses.replace(sampler, seed=0)
    return _probabilities(key, t, floor)[t]
