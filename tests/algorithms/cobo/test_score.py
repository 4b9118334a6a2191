"""Eq. (1)'s scores and the rows of the alignment requests, by hand."""

from __future__ import annotations

import pytest
import torch

from raycobo.algorithms.pairs import mean_over
from tests.helpers import build


@pytest.mark.parametrize("k", [2, 3])
def test_the_minibatches_mean_is_torchs_mean_bit_for_bit(k):
    """mean_over replaces torch's mean of two minibatches' gradients by an addition and a
    halving: the same bits, on every layout it is used on (by pair, batch-major)."""
    G = torch.randn(9, k, 2, 301, generator=torch.Generator().manual_seed(k)) * 1e-3
    for dim, T in ((1, G), (0, G.transpose(0, 1).reshape(k, 18, 301))):
        got, want = mean_over(T, dim), T.mean(dim=dim)
        assert got.shape == want.shape
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_the_scores_by_hand():
    """inner: <g_i, g_j>; cosine: that over ||g_i|| ||g_j||; bounded: over max(||g_i||
    ||g_j||, floor), the cosine above the floor and the inner product in units of the
    floor below it."""
    from raycobo.algorithms.cobo import alignment_scores

    G_i = torch.tensor([[3.0, 4.0], [0.3, 0.4], [1.0, 0.0]])
    G_j = torch.tensor([[4.0, 3.0], [0.4, 0.3], [-2.0, 0.0]])
    dots, norms = torch.tensor([24.0, 0.24, -2.0]), torch.tensor([25.0, 0.25, 2.0])
    assert torch.allclose(alignment_scores(G_i, G_j, "inner"), dots)
    assert torch.allclose(alignment_scores(G_i, G_j, "cosine"), dots / norms)
    bounded = alignment_scores(G_i, G_j, "bounded", floor=1.0)
    assert torch.allclose(bounded, torch.tensor([24 / 25, 0.24 / 1.0, -1.0]))


def test_a_pair_request_asks_for_the_rows_its_scores_read():
    """A PairScores request's rows as one tensor (all i-ends, then all j-ends, per
    minibatch) and as shared points (pair by pair, end by end, one gradient per end)
    ask for the same (client, salt) rows at the same points (the pairs' midpoints), and
    each layout's answer reduces to the same scores; answered in parts of at least two
    pairs, shared or plain (an ops that holds fewer rows than the request), the same
    scores as in one."""
    from raycobo.algorithms.pairs import (
        ALIGN_SALT_STRIDE,
        PairScores,
        answer,
        mean_of_runs,
        rows_of,
        scores_from,
        shared_rows,
    )

    g = torch.Generator().manual_seed(0)
    pairs, k = torch.tensor([[0, 1], [1, 4], [2, 3], [0, 4], [1, 2]]), 2
    req = PairScores(pairs, torch.randn(5, 3, generator=g), k, "cosine")
    assert torch.equal(req.points(1, 3), (req.models[[1, 2]] + req.models[[4, 3]]) / 2)
    clients, Z, salts = rows_of(req)
    s_clients, shared, s_salts = shared_rows(req, 0, 5)
    rows = lambda c, s, Z: sorted(zip(c.tolist(), s.tolist(), Z.tolist(), strict=True))  # noqa: E731
    assert rows(clients, salts, Z) == rows(s_clients, s_salts, shared.materialize())
    assert int(salts.max()) == 4 + ALIGN_SALT_STRIDE  # the second minibatch's salt
    # end by end: pair (1, 4)'s rows are client 1's two minibatches, then client 4's
    assert s_clients[4:8].tolist() == [1, 1, 4, 4]
    assert s_salts[4:8].tolist() == [4, 4 + ALIGN_SALT_STRIDE, 1, 1 + ALIGN_SALT_STRIDE]
    assert shared.means == k and shared.gradient_rows == 2 * 5
    # an answer that is a function of (client, salt, point) reduces alike in both layouts
    grad = lambda c, s, Z: torch.stack([c.float(), s.float() % 7, Z.sum(1)], dim=1)  # noqa: E731
    flat = scores_from(req, grad(clients, salts, Z))
    ends = mean_of_runs(grad(s_clients, s_salts, shared.materialize()), k)  # (2E, 3)
    assert torch.equal(flat, scores_from(req, ends, by_pair=True))

    class Ops:  # an ops that takes shared points, in parts of at most 8 rows
        shares_points, shared_part_rows, calls = True, 8, 0

        def grads(self, c, Z, t, stream, salt):
            Ops.calls += 1
            G = grad(c, torch.as_tensor(salt), Z.materialize())
            return mean_of_runs(G, Z.means), torch.zeros(c.numel())

    got, losses = answer(Ops(), req, 0)
    assert Ops.calls == 2 and losses.numel() == 0  # pairs [0, 2) and [2, 5): 8 + 12 rows
    assert torch.equal(got, flat)

    class Held:  # plain rows, at most 12 held at once: pairs [0, 3) and [3, 5)
        request_rows, asked = 12, []

        def grads(self, c, Z, t, stream, salt):
            Held.asked.append(c.numel())
            return grad(c, torch.as_tensor(salt), Z), torch.zeros(c.numel())

    got, _ = answer(Held(), req, 0)
    assert Held.asked == [12, 8] and torch.equal(got, flat)
    with pytest.raises(ValueError, match="runs of 2"):
        type(shared)(((req.models[:1], 3),), means=2)


def test_a_new_score_is_one_part_and_one_preset(quad_cfg, tmp_path):
    """examples/plugins/sign_score.py: a score registered by a plugin module and a preset
    naming it (module:PRESET) run as CoBo with that score, each sampled pair's weight
    moving by exactly gamma (here constant) before the projection; the run records the
    plugin's code, as any plugin's."""
    from pathlib import Path

    from raycobo.algorithms.cobo import CoBo, CoBoState
    from raycobo.lifecycle.experiment import run_experiment

    plugins = Path(__file__).parents[3] / "examples" / "plugins"
    cfg = quad_cfg(
        f"plugin_paths=[{plugins}]",
        "algorithm.preset=sign_score:SIGN",
        "algorithm.gamma_decay=none",
        "algorithm.gamma=0.25",
        "algorithm.sampling=full",
        "rounds=3",
        "eval_every=3",
    )
    algo = CoBo(cfg.algorithm, 3, 0)
    assert algo.cfg.alignment == "sign" and algo.cfg.pull == "mean"  # raycobo's otherwise
    _, ops, _ = build(cfg)
    state = algo.init(ops)
    after, _ = algo.round(CoBoState(state.X, state.W.clone(), scale=state.scale), 0, ops)
    moved = (after.W - state.W).abs()
    off = ~torch.eye(moved.shape[0], dtype=torch.bool)
    assert bool(((moved[off] - 0.25).abs() < 1e-6).logical_or(moved[off] == 0).all())
    assert bool((moved[off] > 0).any())
    res = run_experiment(cfg, tmp_path / "sign")
    assert res.summary["status"] == "completed"
    assert "sign_score" in (tmp_path / "sign" / "plugins.json").read_text()
