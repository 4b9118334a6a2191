"""The fidelity suite (benchmarks/fidelity): its orderings hold on the quickstart's
twin in a CI-sized run, and the report reads them from the runs. Orderings, never
timings; digits instead of Fashion-MNIST (no data files needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "fidelity"))

import report  # noqa: E402
import run as fidelity  # noqa: E402


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """The quickstart claim on digits (as `raycobo demo` falls back to), 1 seed. Seed 0
    measured: Local 84.3 %, CoBo 92.4 %, Oracle 94.1 %."""
    out = tmp_path_factory.mktemp("fidelity")
    claim = next(c for c in fidelity.load_claims() if c["id"] == "quickstart-twin")
    extra = [
        "data.name=digits",
        "data.fraction=0.2",  # 0.5 leaves each client enough data alone to tie CoBo
        "model.hidden=[32]",
        "compare.algorithms=[local,cobo,oracle]",
    ]
    claim = {**claim, "overrides": [*claim.get("overrides", []), *extra]}
    claim.pop("tune", None)  # Ditto is not among the entries here
    fidelity.run_claim(claim, out, [0])
    return claim, out


def test_oracle_and_cobo_above_local_on_the_twin(twin):
    claim, out = twin
    root = out / claim["id"]
    rows = report.load_rows(root)
    for text in ("oracle >= cobo", "cobo > local"):
        ok, detail = report.holds(text, rows, "accuracy", root)
        assert ok, f"{text}: {detail}"


def test_the_report_is_generated_from_the_runs(twin, tmp_path):
    claim, out = twin
    text = report.write_report(out, tmp_path / "F.md").read_text()
    section = text.split("### quickstart-twin")[1].split("###")[0]
    acc = {
        r["algorithm"]: 100 * r["mean_accuracy"]
        for r in report.load_rows(out / claim["id"]).values()
    }
    assert f"| cobo | 74.6 | {acc['cobo']:.2f} |" in section  # the paper's beside ours
    assert "| cobo > local | ✓ |" in section
    assert "| ditto > local | ? | no result |" in section  # not run here: not a pass
    assert "Figure 3 (W against the true clusters, CoBo): seed 0: within" in section
    # claims that were not run say so instead of showing numbers
    assert "### cobo-table2-cross-device" in text and "Not run yet." in text


def test_an_ordering_is_checked_both_ways():
    rows = {
        "a": {"mean_accuracy": 0.80, "std_accuracy": 0.01},
        "b": {"mean_accuracy": 0.795, "std_accuracy": 0.01},
    }
    root = Path(".")
    # half a point apart at a std of one point: neither way is decided
    assert report.holds("a > b", rows, "accuracy", root)[0] == report.UNDECIDED
    assert report.holds("b > a", rows, "accuracy", root)[0] == report.UNDECIDED
    assert report.holds("b >= a", rows, "accuracy", root)[0] is True  # within one std
    rows["b"]["mean_accuracy"] = 0.70
    assert report.holds("a > b", rows, "accuracy", root)[0] is True
    assert report.holds("b > a", rows, "accuracy", root)[0] is False
    assert report.holds("b >= a", rows, "accuracy", root)[0] is False
    assert report.holds("c > a", rows, "accuracy", root)[0] is None


def test_a_twin_outside_the_papers_regime_fails_its_claim():
    """The regime check: the Oracle's lead over Local must be at least half the paper's
    (or, without an Oracle, our Local near the paper's)."""
    root = Path(".")
    claim = {"paper": {"local": 60.0, "oracle": 80.0}, "regime": {"low": "local", "high": "oracle"}}
    rows = {
        "local": {"mean_accuracy": 0.90, "std_accuracy": 0.0},
        "oracle": {"mean_accuracy": 0.95, "std_accuracy": 0.0},
    }
    line, ok = report.regime_check(claim, rows, "accuracy", root)
    assert ok is False and "≥ 10.00" in line  # 5 points where the paper has 20
    rows["local"]["mean_accuracy"] = 0.80
    assert report.regime_check(claim, rows, "accuracy", root)[1] is True
    claim = {"paper": {"local": 87.5}, "regime": {"low": "local", "match": 3}}
    assert report.regime_check(claim, rows, "accuracy", root)[1] is False  # 80 vs 87.5
    rows["local"]["mean_accuracy"] = 0.86
    assert report.regime_check(claim, rows, "accuracy", root)[1] is True


def test_gap_closure_and_blocks_that_stay(tmp_path):
    """CoBo's share of the Local -> Oracle gap against the paper's, and W within the
    clusters at the end against its peak once the blocks exist (not W0 = 1)."""
    import json

    claim = {
        "paper": {"local": 54.9, "cobo": 79.6, "oracle": 83.6},
        "closure": {"method": "cobo", "low": "local", "high": "oracle", "target": 80},
    }
    rows = {
        "local": {"mean_accuracy": 0.60},
        "cobo": {"mean_accuracy": 0.68, "run_dirs": [str(tmp_path / "cobo")]},
        "oracle": {"mean_accuracy": 0.70},
    }
    line, ok = report.closure_check(claim, rows, "accuracy", tmp_path)
    assert ok is True and "80 % (paper 86 %)" in line
    rows["cobo"]["mean_accuracy"] = 0.67
    assert report.closure_check(claim, rows, "accuracy", tmp_path)[1] is False

    (tmp_path / "cobo").mkdir()
    (tmp_path / "comparison.json").write_text(json.dumps([{"algorithm": "cobo", **rows["cobo"]}]))

    def history(*within_across):
        h = [
            {"round": 100 * i, "w_within": w, "w_across": a}
            for i, (w, a) in enumerate(within_across)
        ]
        (tmp_path / "cobo" / "summary.json").write_text(json.dumps({"history": h}))

    history((1.0, 1.0), (0.97, 0.15), (0.80, 0.003))  # 0.80 / 0.97 = 0.82
    assert report.w_kept(tmp_path, 0.8)[1] is True
    history((1.0, 1.0), (0.97, 0.15), (0.70, 0.003))  # faded
    assert report.w_kept(tmp_path, 0.8)[1] is False
    history((1.0, 1.0), (0.90, 0.60))  # never apart: no blocks to keep
    assert report.w_kept(tmp_path, 0.8)[1] is False
