"""The W figures: what the pull reads is told apart from what it leaves out."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np

from raycobo import plots


def test_weights_below_the_cut_keep_their_colour_and_are_marked():
    """(#71 item 4) Drawn faint, CoBo's sub-threshold zeros looked lavender beside the
    Oracle's dark zeros on the same colour bar; they keep the one colour scale and carry
    a cross each, and the zeros none."""
    W = np.array([[1.0, 0.9, 0.2], [0.9, 1.0, 0.0], [0.2, 0.0, 1.0]])
    fig, ax = plt.subplots()
    try:
        im = plots.heatmap(ax, W, [0, 0, 1], "W", cut=0.5)
        assert im.get_alpha() is None  # one opacity, one colour scale
        (marks,) = ax.collections
        assert sorted(map(tuple, marks.get_offsets().tolist())) == [(0.0, 2.0), (2.0, 0.0)]
        ax2 = fig.add_subplot(2, 1, 2)
        plots.heatmap(ax2, W, [0, 0, 1], "W")  # no cut: nothing marked
        assert not ax2.collections
    finally:
        plt.close(fig)


def test_the_w_note_matches_the_setting():
    """The caption said "clients ordered by true cluster" where there were none."""
    assert "ordered by true cluster" in plots.heatmap_note(True, False)
    plain = plots.heatmap_note(False, False)
    assert "cluster" not in plain and "cross" not in plain
    assert "white cross" in plots.heatmap_note(False, True)


def test_a_cobo_run_records_its_cut_and_a_comparison_grid_draws_it(quad_cfg, tmp_path):
    """rule raycobo's pull threshold is the summary's ``collaboration_cut`` (null for
    rule paper, which pulls toward every weight); the figures are written with it."""
    from raycobo.lifecycle.experiment import run_experiment

    ours = run_experiment(quad_cfg("rounds=4"), tmp_path / "ours")
    paper = run_experiment(quad_cfg("rounds=4", "algorithm.preset=paper"), tmp_path / "paper")
    assert ours.summary["collaboration_cut"] == 0.5
    assert paper.summary["collaboration_cut"] is None
    stored = json.loads((ours.run_dir / "summary.json").read_text())
    assert stored["collaboration_cut"] == 0.5
    assert "mass_pulled_inside" in ours.summary["cluster_agreement"]
    assert "mass_pulled_inside" not in paper.summary["cluster_agreement"]
    assert (ours.run_dir / "plots" / "collaboration.png").stat().st_size > 0
    W = np.array(ours.summary["collaboration"])
    clusters = [c["cluster"] for c in ours.summary["clients"]]
    out = tmp_path / "grid.png"
    plots.plot_matrix_grid(out, {"ours": {4: W}, "paper": {4: W}}, clusters, {"ours": 0.5})
    assert out.stat().st_size > 0
