"""Edge samplers: empirical pair rates match p_t; `full` touches every pair."""

from __future__ import annotations

import pytest
import torch

from raycobo.algorithms.samplers import EdgeSampler, bernoulli_pairs, n_pairs, unrank_pairs


def test_unrank_enumerates_the_upper_triangle():
    for n in (2, 3, 7, 50):
        i, j = unrank_pairs(torch.arange(n_pairs(n)), n)
        ref = torch.triu_indices(n, n, offset=1)
        assert torch.equal(i, ref[0]) and torch.equal(j, ref[1])


def test_full_touches_every_pair_every_round():
    s = EdgeSampler("full", 9, 100, seed=0)
    for t in (0, 5, 99):
        e = s.sample(t)
        assert e.shape == (36, 2)
        assert set(map(tuple, e.tolist())) == {(i, j) for i in range(9) for j in range(i + 1, 9)}


@pytest.mark.parametrize("kind", ["constant", "time", "mixed"])
def test_empirical_pair_rates_match_probability(kind):
    n, rounds = 12, 3000
    s = EdgeSampler(kind, n, rounds, seed=1, sampling_c=2.0, time_c=5.0, mixed_switch=0.01)
    counts = torch.zeros(n, n)
    expected = 0.0
    for t in range(rounds):
        e = s.sample(t)
        counts[e[:, 0], e[:, 1]] += 1
        expected += s.probability(t)
        assert torch.all(e[:, 0] < e[:, 1])
    iu = torch.triu_indices(n, n, offset=1)
    per_pair = counts[iu[0], iu[1]]
    # mean over pairs: relative error well inside 5 standard errors
    total = float(per_pair.sum())
    se = (expected * n_pairs(n)) ** 0.5
    assert abs(total - expected * n_pairs(n)) < 5 * se
    if kind == "constant":  # every pair at the same rate p = c/n
        p = 2.0 / n
        assert abs(float(per_pair.mean()) / rounds - p) < 0.01
        assert float(per_pair.std()) < 4 * (rounds * p * (1 - p)) ** 0.5


def test_probability_schedules():
    s = EdgeSampler("mixed", 10, 1000, seed=0, sampling_c=1.0, time_c=1.0, mixed_switch=0.002)
    assert s.switch_round() == 2
    assert s.probability(0) == pytest.approx(0.1)
    assert s.probability(1) == pytest.approx(0.1)
    # after the switch the decaying rate, never above the constant one (1/3 > 1/10 here)
    assert s.probability(2) == pytest.approx(0.1)
    assert s.probability(99) == pytest.approx(0.01)
    # 10,000 clients switching at round 6: 1/7 of all 50 million pairs would be sampled
    big = EdgeSampler("mixed", 10_000, 12, 0, sampling_c=2.0, time_c=1.0, mixed_switch=0.5)
    assert big.probability(6) == pytest.approx(2 / 10_000)
    assert EdgeSampler("time", 10, 100, 0).probability(0) == 1.0
    assert EdgeSampler("constant", 4, 100, 0, sampling_c=10).probability(7) == 1.0


def test_geometric_skipping_path_has_the_right_rate():
    """Large n, small p: the O(pN) path (no n^2 draw) samples at rate p without repeats."""
    n, p = 3000, 1e-4
    g = torch.Generator().manual_seed(0)
    counts = []
    for _ in range(20):
        e = bernoulli_pairs(n, p, g)
        lin = e[:, 0] * n + e[:, 1]
        assert lin.unique().numel() == lin.numel()
        assert torch.all(e[:, 0] < e[:, 1]) and int(e.max()) < n
        counts.append(e.shape[0])
    mean = sum(counts) / len(counts)
    N = n_pairs(n)
    assert abs(mean - p * N) < 5 * (p * N / len(counts)) ** 0.5


def test_same_seed_same_edges_and_different_rounds_differ():
    a = EdgeSampler("constant", 40, 10, seed=3)
    b = EdgeSampler("constant", 40, 10, seed=3)
    assert torch.equal(a.sample(4), b.sample(4))
    assert not torch.equal(a.sample(4), a.sample(5))


def test_expected_samples_sum_the_probabilities():
    """k_t (the W step's decay) is the sum of the p_tau before t."""
    s = EdgeSampler("mixed", 40, 500, seed=3, sampling_c=2.0, time_c=1.0, mixed_switch=0.5)
    assert s.expected_samples(0) == 0.0
    for t in (1, 7, 250, 251, 499, 500):
        assert s.expected_samples(t) == pytest.approx(sum(s.probability(u) for u in range(t)))


def test_cobo_reads_mixed_switch_as_a_share_of_the_rounds():
    """mixed_switch is a share of the rounds; its {samples: K} form and the ``early``
    strategy were removed in raycobo 0.4.1 (no preset used them) and are refused."""
    from raycobo.algorithms.cobo import CoBo, CoBoConfig
    from raycobo.config import ConfigError, load_config

    assert CoBo(CoBoConfig(mixed_switch=0.25), 400, 0).sampler(8).switch_round() == 100
    assert CoBo(CoBoConfig(preset="paper"), 400, 0).sampler(8).switch_round() == 200
    with pytest.raises(ConfigError, match="algorithm.mixed_switch"):
        load_config(None, ["algorithm.mixed_switch={samples: 5}"])
    with pytest.raises(ConfigError, match="algorithm.sampling"):
        load_config(None, ["algorithm.sampling=early"])


def test_a_sampling_strategy_is_one_registered_function(monkeypatch):
    """CoBo's algorithm.sampling accepts exactly the registered strategies; a new one is
    a function registered in samplers.py (here a throwaway p_t = 1/2), and the sampler,
    its expected samples and an unknown name's one-line refusal follow from it."""
    from typing import get_args

    from raycobo.algorithms import samplers
    from raycobo.algorithms.cobo import Sampling

    assert set(get_args(Sampling)) == set(samplers.SAMPLINGS)
    monkeypatch.setitem(samplers.SAMPLINGS, "half", lambda s, t: 0.5)
    s = EdgeSampler("half", 30, 100, seed=0)
    assert s.probability(7) == 0.5 and s.expected_samples(10) == pytest.approx(5.0)
    assert s.sample(3).shape[1] == 2
    with pytest.raises(ValueError, match="unknown sampling 'halve' .*half"):
        EdgeSampler("halve", 30, 100, seed=0)


def test_least_samples_scales_a_short_runs_rates_up_to_its_cap():
    """least_samples K: where the strategy alone samples a pair S < K times over the run
    (many clients, a short run), every p_t is multiplied by K / S, at most max_scale and
    at most 1, so the run samples each pair K times in expectation and keeps the
    strategy's shape; where S >= K the draws are the strategy's, bit for bit."""
    plain = EdgeSampler("mixed", 80, 200, 3, 2.0, 1.0, 0.5)
    S = plain.expected_samples(200)
    assert 3.0 < S < 3.5  # 100 rounds at 2/80, then min(2/80, 1/(t+1))
    more = EdgeSampler("mixed", 80, 200, 3, 2.0, 1.0, 0.5, least_samples=12.0)
    assert more.scale == pytest.approx(12.0 / S)
    assert more.expected_samples(200) == pytest.approx(12.0)
    for t in (0, 99, 100, 150, 199):
        assert more.probability(t) == pytest.approx(plain.probability(t) * 12.0 / S)
    # the empirical rate follows the scaled p_t
    got = sum(len(more.sample(t)) for t in range(20)) / (20 * n_pairs(80))
    assert got == pytest.approx(more.probability(0), rel=0.1)
    capped = EdgeSampler("mixed", 80, 200, 3, 2.0, 1.0, 0.5, least_samples=12.0, max_scale=2.0)
    assert capped.scale == 2.0 and capped.expected_samples(200) == pytest.approx(2 * S)
    few = EdgeSampler("constant", 4, 10, 0, sampling_c=2.0, least_samples=100.0)
    assert few.probability(3) == 1.0  # never above 1
    # a pair sampled often enough: the same rates and the same edges
    long = EdgeSampler("mixed", 80, 3000, 3, 2.0, 1.0, 0.5, least_samples=12.0)
    base = EdgeSampler("mixed", 80, 3000, 3, 2.0, 1.0, 0.5)
    assert long.scale == 1.0
    for t in (0, 1500, 2999):
        assert long.probability(t) == base.probability(t)
        assert torch.equal(long.sample(t), base.sample(t))


def test_start_all_samples_every_pair_in_round_0_and_nothing_else_changes():
    """start_all: round 0 draws every pair (where every midpoint is the shared x^0);
    every later round's rate and draws are the strategy's own; a pair's expected samples
    count round 0's, least_samples' S does not (a short run's later rates are the
    run's own, scaled as without it). Where the strategy samples a pair
    S < 1 times over the run, round 0's rate is S (at most twice the run's pairs)."""
    plain = EdgeSampler("mixed", 80, 1000, 3, 2.0, 1.0, 0.5)
    start = EdgeSampler("mixed", 80, 1000, 3, 2.0, 1.0, 0.5, start_all=True)
    assert start.probability(0) == 1.0 and len(start.sample(0)) == n_pairs(80)
    for t in (1, 2, 499, 500, 999):
        assert start.probability(t) == plain.probability(t)
        assert torch.equal(start.sample(t), plain.sample(t))
    assert start.expected_samples(1) == 1.0
    assert start.expected_samples(1000) == pytest.approx(plain.expected_samples(1000) + 0.975)
    assert start.highest_probability() == 1.0
    short = EdgeSampler("mixed", 80, 200, 3, 2.0, 1.0, 0.5, least_samples=12.0)
    both = EdgeSampler("mixed", 80, 200, 3, 2.0, 1.0, 0.5, least_samples=12.0, start_all=True)
    S = short.strategy().expected_samples(200)
    assert both.scale == short.scale == pytest.approx(12.0 / S)
    assert both.probability(0) == 1.0
    assert all(both.probability(t) == short.probability(t) for t in range(1, 200))
    # 10,000 clients for 10 rounds: a pair's S = 10 * 2 / 10,000 = 0.002
    big = EdgeSampler("constant", 10_000, 10, 0, 2.0, start_all=True)
    assert big.start_rate == pytest.approx(0.002)
    got = len(big.sample(0)) / n_pairs(10_000)
    assert got == pytest.approx(0.002, rel=0.05)


@pytest.mark.parametrize("kind", ["constant", "time", "mixed", "mixed_sqrt", "full"])
def test_the_highest_rate_is_a_scans_without_one(kind, monkeypatch):
    """highest_probability reads the rates where a phase begins (round 0, the switch):
    for every built-in rule, with a scale-up and without, the largest p_t a scan over the
    run finds; a run of 10**12 rounds reads two rounds' rates."""
    from raycobo.algorithms import samplers

    for n, rounds, switch, least in [(8, 50, 0.2, 0.0), (80, 200, 0.5, 12.0), (4, 1, 0.5, 0.0)]:
        for c, tc, first in [(1.0, 1.0, False), (2.0, 3.0, False), (2.0, 1.0, True)]:
            s = EdgeSampler(kind, n, rounds, 0, c, tc, switch, least_samples=least, start_all=first)
            scan = max(s.probability(t) for t in range(rounds))
            assert s.highest_probability() == scan, (n, rounds, c, tc)
    assert set(samplers.SAMPLINGS) == {"constant", "time", "mixed", "mixed_sqrt", "full"}
    asked = []
    rule = samplers.SAMPLINGS[kind]
    monkeypatch.setitem(samplers.SAMPLINGS, kind, lambda s, t: asked.append(t) or rule(s, t))
    EdgeSampler(kind, 1000, 10**12, 0).highest_probability()
    assert 1 <= len(asked) <= 2, asked[:10]
