"""Eq. (1)'s scores and the rows of the alignment requests, by hand."""

from __future__ import annotations

import pytest
import torch

from raycobo.algorithms.cobo.requests import mean_over
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


def test_a_round_asks_for_the_rows_its_scores_read():
    """The alignment rows as one tensor (all i-ends, then all j-ends, per minibatch) and
    as shared points (pair by pair) ask for the same (client, salt) rows at the same
    midpoints, and each layout's answer averages back to the same two ends."""
    from raycobo.algorithms.cobo.requests import (
        ALIGN_SALT_STRIDE,
        end_gradients,
        round_rows,
        shared_rows,
    )

    X = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    edges, members, k = torch.tensor([[0, 1], [1, 4], [2, 3]]), torch.arange(5), 2
    flat = round_rows(X, edges, members, k, True, True)
    shared = shared_rows(X, edges, members, k, True)
    A = 2 * k * edges.shape[0]
    rows = lambda c, s, Z: sorted(zip(c.tolist(), s.tolist(), Z.tolist(), strict=True))  # noqa: E731
    points = shared.points.materialize()
    assert rows(flat.align_clients, flat.align_salts, flat.points[:A]) == rows(
        shared.align_clients, shared.align_salts, points[:A]
    )
    assert torch.equal(flat.points[A:], X) and torch.equal(points[A:], X)
    assert int(flat.align_salts.max()) == 4 + ALIGN_SALT_STRIDE  # the second minibatch
    # answers that are a function of (client, salt) come back to the same ends either way
    answer = lambda c, s: torch.stack([c.float(), s.float()], dim=1)  # noqa: E731
    flat_ends = end_gradients(answer(flat.align_clients, flat.align_salts), 3, k)
    shared_ends = end_gradients(answer(shared.align_clients, shared.align_salts), 3, k, True)
    for a, b in zip(flat_ends, shared_ends, strict=True):
        assert torch.equal(a, b)


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
