"""Eq. (1)'s step on W: the projection, rows against the whole matrix, dense against
sparse, the schedule and the fade."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from raycobo.algorithms.cobo import CoBo, CoBoConfig, CoBoState, update_weights
from raycobo.algorithms.cobo.sparse import SparseBoxWeights


def test_weight_update_is_clipped_to_the_box():
    W = torch.full((3, 3), 0.5)
    edges = torch.tensor([[0, 1], [1, 2]])
    out = update_weights(W, edges, torch.tensor([100.0, -100.0]), gamma=0.1, domain="box")
    assert out[0, 1] == 1.0 and out[1, 0] == 1.0
    assert out[1, 2] == 0.0 and out[2, 1] == 0.0
    assert out[0, 2] == 0.5  # not sampled: unchanged


def test_simplex_rows_stay_on_the_simplex():
    from raycobo.algorithms.cobo import initial_weights

    W = initial_weights(4, "simplex")
    assert_close(W.sum(1), torch.ones(4))
    assert torch.all(W.diagonal() == 0)
    edges = torch.tensor([[0, 1], [0, 2], [2, 3]])
    out = update_weights(W, edges, torch.tensor([3.0, -1.0, 0.5]), gamma=0.2, domain="simplex")
    assert torch.all(out >= 0)
    assert_close(out.sum(1), torch.ones(4))
    assert torch.all(out.diagonal() == 0)
    assert out[0, 1] > out[0, 2]  # the aligned partner gains weight


@pytest.mark.parametrize("domain", ["box", "simplex"])
def test_weight_rows_update_like_the_whole_matrix(domain):
    """A host updates only its clients' W rows (engine.rounds: resident); each row must get
    exactly what updating the whole W gives it, edges across hosts included."""
    from raycobo.algorithms.cobo import initial_weights, update_weight_rows, update_weights

    n = 9
    g = torch.Generator().manual_seed(3)
    W = initial_weights(n, domain)
    for t in range(5):  # a few rounds so the rows differ from W^0
        pairs = torch.combinations(torch.arange(n), 2)
        edges = pairs[torch.randperm(pairs.shape[0], generator=g)[:7]]
        scores = torch.randn(7, generator=g)
        full = update_weights(W, edges, scores, 0.3, domain)
        for rows in (torch.tensor([0, 1, 2]), torch.tensor([5, 8]), torch.arange(n)):
            part = update_weight_rows(W[rows], rows, edges, scores, 0.3, domain)
            assert torch.equal(part, full[rows]), (t, rows)
        W = full
    if domain == "simplex":
        assert torch.allclose(W.sum(dim=1), torch.ones(n))
        assert torch.all(W.diagonal() == 0)


def test_a_pulled_pair_steps_as_often_as_recheck_samples_it_dense_and_sparse():
    """Where recheck samples the pairs the pull reads more often than the sampler, their
    gamma decays by those samples: gamma / sqrt(1 + sum_tau<t max(p_tau, recheck)); other
    pairs keep gamma_at. Dense and sparse W take the same step; without recheck (or
    where the sampler's rate is never below it) every pair steps with gamma_at."""

    from raycobo.algorithms.cobo import update_weight_rows

    n, t = 200, 60  # mixed sampling: p = 2/200 = 0.01 < recheck 0.02 from round 0
    own = CoBoConfig(sampling_samples=0.0, start_all_pairs=False)
    algo = CoBo(own, rounds=100, seed=0)
    step = algo.w_step(t, n)
    assert step.gamma == pytest.approx(3.0 / math.sqrt(1 + 0.01 * t))
    assert step.pulled == pytest.approx(3.0 / math.sqrt(1 + 0.02 * t)) and step.cut == 0.5
    edges = torch.tensor([[0, 1], [2, 3], [4, 5]])
    before = torch.tensor([0.7, 0.3, 0.5])  # pulled, not pulled, pulled (at the threshold)
    sparse = update_weights(SparseBoxWeights.initial(n, 0.0), edges, before, 1.0, "box")
    dense = sparse.to_dense()
    scores = torch.tensor([-0.2, 0.1, 0.05])
    want = before + torch.tensor([step.pulled, step.gamma, step.pulled]) * scores
    got = update_weights(dense, edges, scores, step, "box")
    assert_close(got[edges[:, 0], edges[:, 1]], want)
    assert_close(update_weights(sparse, edges, scores, step, "box").to_dense(), got)
    rows = torch.tensor([1, 2, 5])  # a host holding some of the rows: the same numbers
    assert_close(update_weight_rows(dense[rows], rows, edges, scores, step, "box"), got[rows])
    assert algo.w_step(40, 50).pulled is None  # p = 0.04 >= 0.02 in mixed's first half
    assert CoBo(CoBoConfig(pull_threshold=0.0), 100, 0).w_step(t, n).pulled is None
    assert CoBo(CoBoConfig(preset="paper"), 100, 0).w_step(t, n).pulled is None


def test_fade_returns_the_weights_below_the_threshold_to_zero():
    """fade f: every round each weight in (0, threshold) falls by f * threshold * p_t
    (at least to 0), whether or not its pair is sampled; weights at or above the
    threshold, the diagonal and zeros stay. Dense, sparse and a host's rows agree; a
    pair never sampled again is gone after w / (f * threshold * p) rounds of rate p; in a
    run of two clusters whose cross pairs score low but positive, the whole W ends with
    every row's mass inside its cluster, as the pull reads it, where without fade it does
    not. Refused without a threshold or off the box domain."""
    from raycobo.algorithms.cobo import RowStep
    from raycobo.algorithms.cobo.weights import faded as fade_weights
    from raycobo.algorithms.cobo.wstep import Schedule
    from raycobo.config import ConfigError, load_config

    W = torch.tensor(
        [
            [1.0, 0.2, 0.45, 0.0],
            [0.2, 1.0, 0.5, 0.8],
            [0.45, 0.5, 1.0, 0.05],
            [0.0, 0.8, 0.05, 1.0],
        ]
    )
    faded = fade_weights(W, 0.5, 0.1)
    want = W.clone()
    want[0, 1] = want[1, 0] = 0.1  # 0.2 - 0.1
    want[0, 2] = want[2, 0] = 0.35
    want[2, 3] = want[3, 2] = 0.0  # 0.05 - 0.1, held at 0
    assert_close(faded, want)
    assert fade_weights(W, 0.5, 0.0) is W and fade_weights(W, 0.0, 0.1) is W
    keys = torch.tensor([0 * 4 + 1, 0 * 4 + 2, 1 * 4 + 2, 1 * 4 + 3, 2 * 4 + 3])
    sparse = SparseBoxWeights(4, keys, W[keys // 4, keys % 4], base=0.0, diag=1.0)
    out = fade_weights(sparse, 0.5, 0.1)
    assert_close(out.to_dense(), want)
    assert out.nnz == 4  # the entry that reached 0 (the base) is no longer stored
    lifted = SparseBoxWeights(4, keys[:1], torch.tensor([0.9]), base=0.3, diag=1.0)
    assert fade_weights(lifted, 0.5, 0.1).base == pytest.approx(0.2)  # W^0 below the cut
    rows = RowStep(0.1, 1.0, None, "box", "bounded", 0.0, "mean", 0.5, "stepped", fade=0.1)
    none = torch.zeros(0, 2, dtype=torch.int64)  # a round that samples no pair fades too
    assert_close(rows.update_rows(W[1:3], torch.tensor([1, 2]), none, torch.zeros(0)), want[1:3])

    n, rounds = 10, 400
    plain = {"sampling": "constant", "start_all_pairs": False}  # p_t = c / n from round 0
    algo = CoBo(CoBoConfig(**plain), rounds, seed=0)
    p = algo.sampler(n).probability(0)
    # with a threshold: 1 x threshold x p_t, not decayed (grown only past 160 clients)
    assert algo.fade_at(7, n) == pytest.approx(1.0 * 0.5 * p)
    lower = CoBoConfig(pull_threshold=0.2, **plain)
    assert CoBo(lower, rounds, 0).fade_at(7, n) == pytest.approx(1.0 * 0.2 * p)
    # without one (Algorithm 1, or no threshold) nothing fades
    assert CoBo(CoBoConfig(preset="paper"), rounds, 0).fade_at(7, n) == 0.0
    assert CoBo(CoBoConfig(pull_threshold=0, **plain), rounds, 0).fade_at(7, n) == 0.0
    # the part itself takes any rate (the Python API)
    half = Schedule(3.0, True, 0.5, fade=0.5)
    assert half.fade_at(algo.sampler(n), 7) == pytest.approx(0.5 * 0.5 * p)
    state = CoBoState(torch.zeros(n, 1), torch.eye(n))
    state.W[0, 1] = state.W[1, 0] = 0.4
    state.W[2, 3] = state.W[3, 2] = 0.6  # pulled: stays
    need = 0.4 / (1.0 * 0.5 * p)
    for t in range(int(need) - 1):
        state = algo.faded(state, t)
    assert 0 < float(state.W[0, 1]) < 0.4 and state.W[2, 3] == W.new_tensor(0.6)
    state = algo.faded(algo.faded(state, 0), 0)
    assert float(state.W[0, 1]) == 0.0 and state.W[2, 3] == W.new_tensor(0.6)

    with pytest.raises(ConfigError, match="algorithm.fade.*removed in raycobo 0.8.0.*threshold"):
        load_config(None, ["algorithm.fade=0.5"])
    with pytest.raises(ConfigError, match="algorithm.fade_decay.*removed in raycobo 0.5.0"):
        load_config(None, ["algorithm.fade_decay=none"])


def test_the_fade_grows_with_the_clients_present_past_160():
    """Past FADE_CLIENTS (160) present clients the fade grows as n / 160 (the same per
    expected sample at 160 and below); a client away does not count."""
    from raycobo.algorithms.cobo.wstep import FADE_CLIENTS

    rounds, t = 400, 7
    assert FADE_CLIENTS == 160

    def per_sample(n: int, present: int | None = None) -> float:
        algo = CoBo(CoBoConfig(), rounds, 0)
        state = CoBoState(torch.zeros(n, 1), torch.eye(n))
        if present is not None:
            state.active = torch.arange(n) < present
        amount = algo.fade_at(t, algo.present(state))
        return amount / algo.sampler(algo.present(state)).probability(t)

    assert per_sample(8) == pytest.approx(0.5)  # fade * threshold
    assert per_sample(160) == pytest.approx(0.5)
    assert per_sample(400) == pytest.approx(0.5 * 400 / 160)
    assert per_sample(400, present=200) == pytest.approx(0.5 * 200 / 160)
