"""The pairs a round scores besides the sampler's: re-checks and closure."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from raycobo.algorithms.cobo import CoBo, CoBoConfig, update_weights
from raycobo.algorithms.cobo.sparse import SparseBoxWeights
from raycobo.config import with_overrides
from tests.helpers import at_rates, build, run_rounds


def recheck_rate(algo: CoBo, t: int, n: int) -> float:
    return algo.proposals.rechecks.rate_at(algo.sampler(n), t)


def recheck_floor(algo: CoBo, n: int) -> float:
    return algo.proposals.rechecks.floor(algo.sampler(n))


def test_recheck_resamples_the_pulled_pairs_dense_and_sparse():
    """recheck: each pair the pull reads (w_ij >= the threshold, both present) is
    sampled with probability at least recheck (drawn again where the sampler's p_t is
    lower); the same pairs from a dense and a sparse W; recheck 1 takes every pulled
    pair, 0 the sampler's alone."""
    from raycobo.algorithms.cobo.weights import read_pairs as pulled_pairs

    n = 12
    edges = torch.tensor([[0, 1], [0, 5], [2, 3], [4, 6], [1, 6], [7, 9], [8, 11]])
    scores = torch.tensor([0.9, 0.2, 0.6, -0.5, 0.7, 0.55, 0.1])
    sparse = update_weights(SparseBoxWeights.initial(n, 0.0), edges, scores, 1.0, "box")
    dense = sparse.to_dense()
    want = torch.tensor([[0, 1], [1, 6], [2, 3], [7, 9]])  # w >= 0.5
    assert torch.equal(pulled_pairs(dense, 0.5), want)
    assert torch.equal(pulled_pairs(sparse, 0.5), want)
    positive = torch.tensor([[0, 1], [0, 5], [1, 6], [2, 3], [7, 9], [8, 11]])  # w > 0
    assert torch.equal(pulled_pairs(dense, 0.0), positive)
    active = torch.ones(n, dtype=torch.bool)
    active[6] = False  # a client that left: its pairs are not re-sampled
    assert torch.equal(pulled_pairs(dense, 0.5, active), want[[0, 2, 3]])

    def sampled(recheck, W, t=3):  # the rates as set (S < 8 here)
        keys = {"sampling_c": 1.0, "sampling_samples": 0.0}
        algo = at_rates(CoBo(CoBoConfig(**keys), rounds=50, seed=0), recheck=recheck)
        return algo.sample_edges(None, t, n, W=W)[0]

    plain = CoBo(CoBoConfig(sampling_c=1.0, sampling_samples=0.0), rounds=50, seed=0)
    plain = plain.sample_edges(None, 3, n)[0]
    assert torch.equal(sampled(0.0, dense), plain)
    every = sampled(1.0, dense)
    keys = {(int(i), int(j)) for i, j in every}
    assert keys == {(int(i), int(j)) for i, j in plain} | {(int(i), int(j)) for i, j in want}
    assert torch.equal(every, torch.tensor(sorted(keys)))  # sorted, distinct, i < j
    assert torch.equal(sampled(1.0, sparse), every)

    # over many rounds a pulled pair is sampled at the rate asked for in all (the
    # sampler's p = 1/12 topped up to 0.3); where p is at least the rate, never again
    want_keys = {tuple(e) for e in want.tolist()}
    hits = sum(
        len(want_keys & {tuple(e) for e in sampled(0.3, dense, t).tolist()}) for t in range(200)
    )
    assert 0.24 < hits / (200 * len(want)) < 0.36
    assert torch.equal(sampled(1 / 12, dense), plain)
    with pytest.raises(ValueError, match="W\\^0 = 1"):  # W^0 = 1 pulls all n^2 pairs
        pulled_pairs(SparseBoxWeights.initial(n, 1.0), 0.5)


def test_closure_proposes_a_collaborators_collaborator_dense_and_sparse():
    """closure: each client with a pulled pair proposes, with probability closure a
    round, a client two pulled steps away; only such pairs are added, never one the
    pull reads already nor one through a client that left; dense and sparse W give the
    same pairs; the rate of a proposal is the two uniform steps' (here 1 - (1 - 1/2)(1 -
    1/4) for (0, 2): 0 reaches 2 through 1 half the time, 2 reaches 0 a quarter)."""
    n = 12
    edges = torch.tensor([[0, 1], [1, 2], [2, 3], [7, 9], [4, 5]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.2])  # (4, 5) below the threshold
    sparse = update_weights(SparseBoxWeights.initial(n, 0.0), edges, scores, 1.0, "box")
    dense = sparse.to_dense()
    keys = {"sampling_c": 1.0, "sampling_samples": 0.0}

    def sampled(W, t, active=None, closure=0.0):  # no re-checks: the closure's pairs alone
        algo = at_rates(CoBo(CoBoConfig(**keys), rounds=300, seed=0), 0.0, closure)
        return {tuple(e) for e in algo.sample_edges(active, t, n, W=W)[0].tolist()}

    two_steps = {(0, 2), (1, 3)}
    seen = {p: 0 for p in two_steps}
    for t in range(300):
        plain = sampled(None, t)
        got = sampled(dense, t, closure=1.0)
        assert got == sampled(sparse, t, closure=1.0)
        assert plain <= got and got - plain <= two_steps
        for p in got - plain:
            seen[p] += 1
        assert sampled(dense, t, closure=0.0) == plain
    # 0.625 of the rounds, less those whose sampler draws the pair itself: 0.57
    assert 0.5 < seen[(0, 2)] / 300 < 0.65
    assert 0.5 < seen[(1, 3)] / 300 < 0.65
    gone = torch.ones(n, dtype=torch.bool)
    gone[1] = False  # 0 and 2 share only client 1, who left
    for t in range(50):
        # (1, 3) has client 1 too, and 2 and 3 reach only each other: nothing is proposed
        assert sampled(dense, t, gone, closure=1.0) == sampled(None, t, gone)
    algo = at_rates(CoBo(CoBoConfig(**keys), 10, 0), 0.0, 0.2)
    algo_off = at_rates(CoBo(CoBoConfig(**keys), 10, 0), 0.0, 0.0)
    assert algo.samples_from_w(0, n) and not algo_off.samples_from_w(0, n)
    # the rate the settings give it (0.1 with a threshold, none without one or under full
    # sampling) and the refused key: test_settings.py, the threshold's test


def test_recheck_scales_up_with_sampling_samples_where_the_sampler_sees_each_pair_rarely():
    """sampling_samples K (rule raycobo: 12) raises the re-checks too: where the sampler
    alone samples a pair S < K times over the run (in expectation), the pulled pairs'
    rate is recheck * K / S (at most 1), and their W step's k_t counts that rate; where
    S >= K nothing changes (the same rounds, the same draws); with K = 0 the rate is
    recheck's own."""

    def made(n, rounds, **kw):  # round 0 at the strategy's rate
        return CoBo(CoBoConfig(start_all_pairs=False, **kw), rounds=rounds, seed=0)

    n, R = 800, 1000  # mixed: p = 2/800 in the first half, far less after the switch
    plain = made(n, R, sampling_samples=0.0)  # the strategy's and recheck's own rates
    S = plain.sampler(n).expected_samples(R)
    assert 1.5 < S < 2.5
    algo = made(n, R)  # rule raycobo: K = 12
    assert algo.cfg.sampling_samples == 12
    rate = 0.02 * 12 / S
    assert recheck_floor(algo, n) == pytest.approx(rate)
    p = algo.sampler(n).probability(10)  # the sampler's own rate, scaled up (at most 4x)
    assert p == pytest.approx(4 * plain.sampler(n).probability(10))
    assert recheck_rate(algo, 10, n) == pytest.approx((rate - p) / (1 - p))
    p_own = plain.sampler(n).probability(10)
    assert recheck_rate(plain, 10, n) == pytest.approx((0.02 - p_own) / (1 - p_own))
    t = 300
    k = algo.sampler(n).expected_samples(t, rate)
    assert k == pytest.approx(t * rate)  # the rate is above p_tau throughout
    assert algo.w_step(t, n).pulled == pytest.approx(3.0 / (1 + k) ** 0.5)
    assert recheck_floor(made(4, 100, sampling_samples=1e6), 4) == 1.0  # at most 1
    # S is summed only until it reaches K: a run of ten million rounds starts at once
    assert made(4, 10_000_000).sampler(4).samples_below(12) is None
    assert recheck_floor(made(4, 10_000_000), 4) == pytest.approx(0.02)  # S >= K: as set
    # many samples a pair (80 clients, 3,000 rounds): the defaults' numbers
    rich, own = made(80, 3000), made(80, 3000, sampling_samples=0.0)
    assert rich.sampler(80).strategy().samples_below(12) is None
    for t in (0, 100, 2999):
        assert recheck_rate(rich, t, 80) == recheck_rate(own, t, 80)
        assert rich.w_step(t, 80) == own.w_step(t, 80)
    assert recheck_floor(made(n, R, preset="paper"), n) == 0.0  # no re-checks there


def test_sampling_samples_samples_each_pair_k_times_in_a_short_run():
    """sampling_samples K (rule raycobo: 12, at most 4 times the rates): where the
    strategy alone samples a pair S < K times over the run, all its p_t are scaled by
    K / S (at most 4), and the W step's k_t counts the scaled rates; where S >= K, the
    same rounds draw for draw; the re-checks' scale-up reads the S of the strategy alone.
    Off in the paper preset; refused where it would do nothing."""
    from raycobo.config import ConfigError, load_config

    own = CoBoConfig(start_all_pairs=False)  # round 0 at the strategy's rate
    rates = own.model_copy(update={"sampling_samples": 0.0})  # the strategy's alone
    algo, plain = CoBo(own, 200, 0), CoBo(rates, 200, 0)
    S = plain.sampler(80).expected_samples(200)
    assert 3 < S < 3.5 and algo.cfg.sampling_samples == 12.0
    assert algo.sampler(80).expected_samples(200) == pytest.approx(12.0)
    assert algo.sampler(80).probability(5) == pytest.approx(
        plain.sampler(80).probability(5) * 12 / S
    )
    assert recheck_floor(algo, 80) == pytest.approx(0.02 * 12 / S)  # the strategy's S
    k = algo.sampler(80).expected_samples(50)  # the scaled rates, above recheck's 0.02
    assert k == pytest.approx(plain.sampler(80).expected_samples(50) * 12 / S)
    assert algo.w_step(50, 80).gamma == pytest.approx(3.0 / (1 + k) ** 0.5)
    many = CoBo(own, 1000, 0)  # 800 clients: S = 1.9, the factor capped at 4
    assert many.sampler(800).scale == 4.0
    S800 = CoBo(rates, 1000, 0).sampler(800).expected_samples(1000)
    assert many.sampler(800).expected_samples(1000) == pytest.approx(4 * S800)
    assert recheck_floor(many, 800) == pytest.approx(0.02 * 12 / S800)
    rich, base = CoBo(own, 3000, 0), CoBo(rates, 3000, 0)
    assert rich.sampler(80).scale == 1.0  # S = 38
    for t in (0, 100, 2999):
        assert torch.equal(rich.sample_edges(None, t, 80)[0], base.sample_edges(None, t, 80)[0])
        assert rich.w_step(t, 80) == base.w_step(t, 80)
    assert CoBo(CoBoConfig(preset="paper"), 200, 0).sampler(80).scale == 1.0
    paper_k = CoBo(CoBoConfig(preset="paper", sampling_samples=12.0), 200, 0)
    assert paper_k.sampler(80).scale == pytest.approx(12.0 / S)  # set, it acts there too
    pinned = CoBoConfig().pinned().model_dump(mode="json")
    assert pinned["sampling_samples"] == 12.0
    with pytest.raises(ConfigError, match="algorithm.sampling_samples.*full"):
        load_config(None, ["algorithm.sampling=full", "algorithm.sampling_samples=8"])
    for gone in ("sampling_scale_max", "recheck_samples"):  # removed in raycobo 0.5.0
        with pytest.raises(ConfigError, match=f"algorithm.{gone}.*removed in raycobo 0.5.0"):
            load_config(None, [f"algorithm.{gone}=2"])


def test_recheck_takes_back_a_pair_that_one_early_sample_made_a_collaborator(quad_cfg):
    """Two clusters of two quadratics; W starts with the cross pair (0, 2) at 1, as if a
    first sample had called it aligned. The sampler alone (p = 0.01 / 4 a pair) does not
    meet it again in a few rounds and it keeps pulling the clusters together; with
    recheck it is measured again (its gradients at the midpoint oppose) and falls below
    the pull's threshold."""
    from raycobo.algorithms.cobo import PRESETS

    cfg = quad_cfg("data.partition.clients_per_cluster=[2,2]", "data.dim=10")

    def w02(recheck, rounds=10):
        over = ["algorithm.sampling=constant", "algorithm.sampling_c=0.01"]
        _, ops, algo = build(with_overrides(cfg, over))
        at_rates(algo, recheck=recheck)
        state = algo.init(ops)
        W = state.W.clone()
        W[0, 2] = W[2, 0] = 1.0
        state = run_rounds(algo, ops, rounds, replace(state, W=W))
        return float(state.W[0, 2])

    assert w02(0.0) == 1.0
    assert w02(1.0) < PRESETS["raycobo"]["pull_threshold"]


def test_closure_completes_the_clusters_the_sampler_leaves_half_measured(digits_cfg):
    """Digits in two label-permutation clusters of 8, each pair sampled about 6 times in
    100 rounds: without closure the pull reads 38 of the 56 pairs inside the clusters
    at the end (those whose few early samples scored low stay out); with each client
    proposing a collaborator's collaborator every round 49, and still none across the
    clusters (40 without closure at the eighteenth round's fade of 0.5). Round 0 samples
    at the strategy's rate: scoring every pair there measures them all once (47 pulled
    without closure, 53 with)."""
    pulled = {}
    for closure in (0.0, 1.0):
        cfg = digits_cfg(
            "data.partition.clients_per_cluster=8",
            "rounds=100",
            "algorithm.sampling=constant",
            "algorithm.sampling_c=1",
            "algorithm.start_all_pairs=false",
        )
        data, ops, algo = build(cfg)
        at_rates(algo, closure=closure)
        W = run_rounds(algo, ops, 100).W
        cl = torch.as_tensor(data.clusters)
        same = cl[:, None] == cl[None, :]
        off = ~torch.eye(len(cl), dtype=torch.bool)
        read = W.ge(algo.pull.threshold)
        pulled[closure] = (int((read & same & off).sum()) // 2, int((read & ~same).sum()) // 2)
    assert pulled[1.0][0] >= pulled[0.0][0] + 8, pulled
    assert pulled[1.0][0] >= 48 and pulled[1.0][1] == 0 and pulled[0.0][1] == 0, pulled
