"""`raycobo compare`: table columns and numbers match the individual runs; the HTML
report references every plot; variants and seeds."""

from __future__ import annotations

import base64
import json
import platform
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import raycobo
from raycobo.cli import app
from raycobo.comparison import TABLE_COLUMNS
from raycobo.config import load_config

QUICKSTART = str(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")
SAMPLING = str(Path(__file__).resolve().parents[2] / "examples" / "sampling_study.yaml")
# the columns the README and downstream scripts read, written out (not the code's list)
CSV_COLUMNS = [
    "algorithm",
    "seeds",
    "mean_accuracy",
    "std_accuracy",
    "mean_loss",
    "mean_perplexity",
    "improved_vs_local",
    "worst10_accuracy",
    "worst20_accuracy",
    "client_std_accuracy",
    "rounds_to_target",
    "wall_seconds",
    "megabytes_sent",
    "failed",
    "run_dirs",
]
# columns no row has a value in (perplexity) are left out
MD_HEADER = (
    "| algorithm | accuracy (%) | loss | Imp. vs Local (%) | worst 10 % (%) | worst 20 % (%) | "
    "client std (%) | rounds to target | wall (s) | sent |"
)


def test_two_algorithms_two_seeds_table_matches_runs(tmp_path):
    out = tmp_path / "cmp"
    res = CliRunner().invoke(
        app,
        [
            "compare",
            QUICKSTART,
            "data.name=digits",
            "data.fraction=0.3",
            "data.partition.num_clusters=2",
            "data.partition.clients_per_cluster=2",
            "model.hidden=[16]",
            "rounds=20",
            "eval_every=5",
            "compare.target_accuracy=0.2",
            "--algorithms",
            "local,cobo",
            "--seeds",
            "0,1",
            "--out",
            str(out),
            "-q",
            "--no-tracking",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = json.loads((out / "comparison.json").read_text())
    assert [r["algorithm"] for r in rows] == ["local", "cobo"]
    header = (out / "comparison.csv").read_text().splitlines()[0].split(",")
    assert header == CSV_COLUMNS and CSV_COLUMNS[:-2] == TABLE_COLUMNS
    assert (out / "comparison.md").read_text().splitlines()[0] == MD_HEADER
    for row in rows:
        sums = [
            json.loads((out / row["algorithm"] / f"seed{s}" / "summary.json").read_text())
            for s in (0, 1)
        ]
        assert [s["seed"] for s in sums] == [0, 1]
        accs = [s["mean_accuracy"] for s in sums]
        assert row["mean_accuracy"] == np.mean(accs)
        assert row["std_accuracy"] == np.std(accs)
        assert row["mean_loss"] == np.mean([s["mean_loss"] for s in sums])
        # 4 clients per seed: the worst 10 % and the worst 20 % are each the single
        # weakest client (ceil(0.4) = ceil(0.8) = 1), averaged over the seeds
        client_acc = [sorted(c["accuracy"] for c in s["clients"]) for s in sums]
        assert all(len(a) == 4 for a in client_acc)
        weakest = (client_acc[0][0] + client_acc[1][0]) / 2
        assert row["worst10_accuracy"] == pytest.approx(weakest, abs=1e-12)
        assert row["worst20_accuracy"] == pytest.approx(weakest, abs=1e-12)
        stds = [float(np.sqrt(np.mean((np.array(a) - np.mean(a)) ** 2))) for a in client_acc]
        assert row["client_std_accuracy"] == pytest.approx(np.mean(stds), abs=1e-12)
        # the first evaluation at or above the target (0.2), averaged over the seeds
        first = [next(h["round"] for h in s["history"] if h["mean_accuracy"] >= 0.2) for s in sums]
        assert row["rounds_to_target"] == pytest.approx(np.mean(first))
        sent = [s["megabytes_sent"] for s in sums]  # Local sends nothing; CoBo counts
        assert row["megabytes_sent"] == pytest.approx(np.mean(sent))
        assert (row["megabytes_sent"] == 0) == (row["algorithm"] == "local")
    local = [json.loads((out / "local" / f"seed{s}" / "summary.json").read_text()) for s in (0, 1)]
    cobo = [json.loads((out / "cobo" / f"seed{s}" / "summary.json").read_text()) for s in (0, 1)]
    imp = np.mean(
        [
            100
            * np.mean(
                [
                    a["accuracy"] > b["accuracy"]
                    for a, b in zip(c["clients"], l["clients"], strict=True)
                ]
            )
            for c, l in zip(cobo, local, strict=True)
        ]
    )
    assert rows[1]["improved_vs_local"] == imp and rows[0]["improved_vs_local"] is None
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert {"curves.png", "collaboration.png", "client_accuracy.png"} <= set(plots)
    # the report is one file: read from a copy elsewhere, every image is inside it
    copy = tmp_path / "elsewhere" / "report.html"
    copy.parent.mkdir()
    shutil.copy(out / "report.html", copy)
    report = copy.read_text()
    images = re.findall(r'<img src="([^"]+)"', report)
    # every plot but curves.png, whose two panels the report shows apart (side by side
    # or stacked, as the page's width allows)
    assert {"curves_accuracy.png", "curves_loss.png"} <= set(plots)
    assert len(images) == len(plots) - 1
    for src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    results = report[report.index("<h2>Results</h2>") : report.index("<h2>Plots</h2>")]
    assert len(re.findall(r"<tr>", results)) == 3  # header + 2 rows
    assert "None" not in report and 'name="viewport"' in report
    assert "first evaluation at or above 20 %" in report  # the target in the table's unit
    # provenance: the version, the command, the machine
    assert f"raycobo {raycobo.__version__}" in report and "command: <code>" in report
    assert platform.node() in report
    # settings: what the entries share once, where they differ side by side
    shared = report[report.index("Shared by every entry") : report.index("Where the entries")]
    assert "data.name" in shared and "digits" in shared and "data.dim" not in shared
    differ = report[report.index("Where the entries differ") :]
    assert "algorithm.name" in differ and "algorithm.gamma" in differ
    summary = json.loads((out / "cobo" / "seed0" / "summary.json").read_text())
    assert summary["provenance"]["raycobo_version"] == raycobo.__version__
    assert summary["provenance"]["host"] == platform.node()
    assert "| cobo |" in (out / "comparison.md").read_text()


def test_variants_compare_sampling_strategies(tmp_path):
    """Table 1's study: CoBo under several sampling strategies as named variants."""
    out = tmp_path / "v"
    res = CliRunner().invoke(
        app,
        [
            "compare",
            SAMPLING,
            "data.name=quadratic",
            "rounds=20",
            "eval_every=10",
            "--out",
            str(out),
            "-q",
            "--no-tracking",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = json.loads((out / "comparison.json").read_text())
    names = [r["algorithm"] for r in rows]
    assert names == ["cobo-constant", "cobo-time", "cobo-mixed", "cobo-full"]
    full = json.loads((out / "cobo-full" / "summary.json").read_text())
    const = json.loads((out / "cobo-constant" / "summary.json").read_text())
    assert full["algorithm"] == const["algorithm"] == "cobo"
    edges_full = (out / "cobo-full" / "rounds.csv").read_text().splitlines()[1].split(",")
    assert float(edges_full[2]) == full["n_clients"] * (full["n_clients"] - 1) / 2


def test_parallel_compare_gives_the_sequential_numbers(tmp_path):
    """(algorithm, seed) pairs as Ray tasks: same summaries as running them one by one."""
    base = [
        "compare",
        QUICKSTART,
        "data.name=quadratic",
        "rounds=15",
        "eval_every=5",
        "engine.num_cpus=2",
        "engine.timeout_s=60",  # bounds the wait for the Ray tasks: 4 runs x 60 s
        "--algorithms",
        "local,cobo",
        "--seeds",
        "0,1",
        "-q",
        "--no-tracking",
    ]
    seq, par = tmp_path / "seq", tmp_path / "par"
    import ray

    try:
        assert CliRunner().invoke(app, [*base, "--out", str(seq)]).exit_code == 0
        res = CliRunner().invoke(app, [*base, "--out", str(par), "--parallel"])
    finally:
        ray.shutdown()
    assert res.exit_code == 0, res.output
    for algo in ("local", "cobo"):
        for seed in (0, 1):
            a = json.loads((seq / algo / f"seed{seed}" / "summary.json").read_text())
            b = json.loads((par / algo / f"seed{seed}" / "summary.json").read_text())
            for key in ("wall_seconds", "mlflow_run_id"):  # the only keys that may differ
                a.pop(key), b.pop(key)
            # the same command is named (not the Ray worker's), from the same folder
            pa, pb = a.pop("provenance"), b.pop("provenance")
            for key in ("command", "cwd", "host", "raycobo_version", "git_commit"):
                assert pa[key] == pb[key], key
            assert a == b, (algo, seed)


def test_a_parallel_compare_past_its_bound_says_which_runs_and_which_key(tmp_path):
    """The wait for a parallel compare's Ray tasks is bounded by engine.timeout_s per run;
    past it, one line names the runs still going and the key (it said only "Get timed
    out: some object(s) not ready"), and no table is written."""
    import ray

    args = [
        "compare",
        QUICKSTART,
        "data.name=quadratic",
        "rounds=10000000",
        "engine.num_cpus=2",
        "engine.timeout_s=2",
        "--algorithms",
        "local,cobo",
        "-q",
        "--no-tracking",
        "--out",
        str(tmp_path / "c"),
        "--parallel",
    ]
    try:
        res = CliRunner().invoke(app, args)
    finally:
        ray.shutdown()
    assert res.exit_code == 1
    line = res.output.strip().splitlines()[-1]
    assert "2 of 2 runs not finished within engine.timeout_s x runs = 4 s" in line, line
    assert "local seed 0, cobo seed 0" in line and "compare --resume" in line
    assert not (tmp_path / "c" / "comparison.json").exists()


def test_compare_nests_its_runs_under_one_mlflow_parent(tmp_path):
    """Tracking on: a parent run for the comparison, one child per (algorithm, seed) with
    the parent's id, its params and its final metrics."""
    from mlflow.tracking import MlflowClient

    db = tmp_path / "m.db"
    res = CliRunner().invoke(
        app,
        [
            "compare",
            QUICKSTART,
            "data.name=quadratic",
            "rounds=10",
            "eval_every=5",
            f"tracking.uri=sqlite:///{db}",
            f"tracking.artifact_root={tmp_path / 'art'}",
            "--algorithms",
            "local,cobo",
            "--out",
            str(tmp_path / "c"),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    # the parent is the comparison: its entries and seeds and each entry's result, not
    # the base config's method (a search for algorithm.name = 'cobo' finds the CoBo run)
    pp = parents[0].data
    assert pp.tags["raycobo.kind"] == "compare" and "raycobo.algorithm" not in pp.tags
    assert not any(k.startswith("algorithm.") for k in pp.params) and "seed" not in pp.params
    assert set(pp.params["compare.entries"].split(",")) == {"local", "cobo"}
    seeds = pp.params["compare.seeds"].split(",")
    for name in ("local", "cobo"):
        summaries = [json.loads((tmp_path / "c" / name / "summary.json").read_text())]
        assert [str(x["seed"]) for x in summaries] == seeds
        want = np.mean([x["mean_loss"] for x in summaries])
        assert pp.metrics[f"mean_loss/{name}"] == pytest.approx(want)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 2
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert child.info.status == "FINISHED"
        name = child.data.params["algorithm.name"]
        summary = json.loads((tmp_path / "c" / name / "summary.json").read_text())
        assert summary["mlflow_run_id"] == child.info.run_id
        assert child.data.metrics["mean_loss"] == pytest.approx(summary["mean_loss"])
        assert child.data.params["rounds"] == "10"
    # the UI link the demo prints opens this experiment's runs table
    from raycobo.config import TrackingConfig
    from raycobo.tracking.mlflow_tracker import runs_link

    exp_id = parents[0].info.experiment_id
    link = runs_link(TrackingConfig(uri=f"sqlite:///{db}", experiment=exp_name(client, exp_id)))
    table = f"http://127.0.0.1:5000/#/experiments/{exp_id}/runs"
    assert link == table + "?workflowType=machine_learning"  # MLflow 3's training view
    # provenance on every run: MLflow's own source columns and raycobo's record
    for run in runs:
        tags = run.data.tags
        assert tags["mlflow.source.name"] and tags["mlflow.source.type"] == "LOCAL"
        assert tags["raycobo.provenance.raycobo_version"] == raycobo.__version__
        assert tags["raycobo.provenance.host"] == platform.node()
        assert tags.get("raycobo.provenance.git_commit") == tags.get("mlflow.source.git.commit")


def exp_name(client, exp_id: str) -> str:
    return client.get_experiment(exp_id).name


def test_dropped_clients_and_perplexity_in_tables():
    """Imp. counts only clients measured in both runs; language-model runs show their
    perplexity in the table."""
    from raycobo.comparison import improved_share, markdown_table

    local = {
        "mean_accuracy": 0.5,
        "clients": [{"accuracy": 0.5}, {"accuracy": 0.6}, {"accuracy": 0.7}],
    }
    mine = {
        "mean_accuracy": 0.6,
        "clients": [{"accuracy": 0.7}, {"accuracy": None}, {"accuracy": 0.6}],
    }
    assert improved_share(mine, local) == 50.0
    row = {k: None for k in TABLE_COLUMNS}
    row.update(algorithm="cobo", seeds=[0], mean_loss=4.5, mean_perplexity=90.0, wall_seconds=1.0)
    md = markdown_table([row])
    assert "| perplexity |" in md and "| 90 |" in md


def test_a_diverging_algorithm_does_not_stop_the_others(tmp_path, quad_cfg):
    from raycobo.comparison import run_compare

    cfg = quad_cfg("rounds=10", "compare.overrides={fedavg: {algorithm.lr: 1.0e6}}")
    root, rows, _ = run_compare(cfg, ["local", "fedavg", "cobo"], tmp_path / "c")
    by = {r["algorithm"]: r for r in rows}
    assert by["fedavg"]["seeds"] == [] and by["fedavg"]["mean_loss"] is None
    (note,) = by["fedavg"]["failed"]
    assert note.startswith("seed 0: FloatingPointError at round ")
    assert by["local"]["failed"] == [] and by["local"]["mean_loss"] is not None
    assert by["cobo"]["failed"] == [] and by["cobo"]["mean_loss"] is not None
    table = (root / "comparison.md").read_text()
    assert "| fedavg | failed |" in table and f"fedavg failed: {note}" in table


def test_compare_resume_keeps_finished_runs_and_continues_the_rest(tmp_path, quad_cfg):
    from raycobo.comparison import Hooks, run_compare
    from raycobo.lifecycle.callbacks import BaseCallback

    class CtrlC(BaseCallback):
        def on_round_end(self, ctx, round, stats):
            if round == 7:
                raise KeyboardInterrupt

    cfg = quad_cfg("rounds=10", "eval_every=5")
    out = tmp_path / "c"
    with pytest.raises(KeyboardInterrupt):
        hooks = Hooks(callbacks=lambda e: [CtrlC()] if e == "cobo" else [])
        run_compare(cfg, ["local", "cobo"], out, seeds=[0, 1], hooks=hooks)
    local_summary = (out / "local" / "seed1" / "summary.json").read_bytes()
    stored = load_config(out / "config.yaml")
    assert stored.compare.algorithms == ["local", "cobo"] and stored.compare.seeds == [0, 1]
    _, rows, results = run_compare(stored, ["local", "cobo"], out, resume=True)
    assert (out / "local" / "seed1" / "summary.json").read_bytes() == local_summary
    cobo = results["cobo"][0].summary
    assert cobo["resumed_from_round"] == 5 and cobo["status"] == "completed"
    # seed 1 of cobo never started: it runs from round 0
    assert results["cobo"][1].summary["resumed_from_round"] is None
    _, fresh, _ = run_compare(cfg, ["local", "cobo"], tmp_path / "fresh", seeds=[0, 1])
    for a, b in zip(rows, fresh, strict=True):
        assert a["mean_loss"] == b["mean_loss"] and a["algorithm"] == b["algorithm"]


def test_side_by_side_processes_give_the_sequential_comparison(tmp_path, quad_cfg):
    """benchmarks/fidelity/parallel_compare.py (a comparison without Ray: one `raycobo
    run` process per entry, then `compare --resume`) writes the table that a sequential
    `raycobo compare` writes, and a run cut off by its timeout leaves no table."""
    import subprocess
    import sys

    from raycobo.comparison import run_compare

    repo = Path(__file__).resolve().parents[2]
    spec = tmp_path / "c.yaml"
    spec.write_text(quad_cfg("rounds=6", "eval_every=3").to_yaml())
    script = repo / "benchmarks" / "fidelity" / "parallel_compare.py"
    entries = "compare.algorithms=[local,cobo]"
    cmd = [sys.executable, str(script), str(spec), "--out", str(tmp_path / "p"), entries]
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    _, rows, _ = run_compare(
        quad_cfg("rounds=6", "eval_every=3"), ["local", "cobo"], tmp_path / "s"
    )
    side = json.loads((tmp_path / "p" / "comparison.json").read_text())
    keys = ("algorithm", "mean_loss", "mean_accuracy", "improved_vs_local")
    assert [{k: r[k] for k in keys} for r in side] == [{k: r[k] for k in keys} for r in rows]
    cut = [*cmd[:4], str(tmp_path / "t"), entries, "rounds=10000000", "--timeout", "10"]
    late = subprocess.run(cut, cwd=repo, capture_output=True, text=True, timeout=300)
    assert late.returncode == 1 and "compare --resume" in late.stdout
    assert not (tmp_path / "t" / "comparison.json").exists()
    cut_off = json.loads((tmp_path / "t" / "cobo" / "summary.json").read_text())
    assert cut_off["status"] == "interrupted" and cut_off["last_round"] > 0


def test_variants_with_different_numbers_of_clients_plot_each_with_its_clusters(tmp_path, quad_cfg):
    """Found by the fidelity suite (CoBo Figure 2a over the number of clusters): the W
    grid drew every variant with the first one's clusters and failed on 4 vs 8 clients."""
    from raycobo.comparison import run_compare

    cfg = quad_cfg(
        "rounds=4",
        "eval_every=2",
        "compare.variants={k2: {data.partition.num_clusters: 2},"
        " k4: {data.partition.num_clusters: 4}}",
    )
    root, rows, _ = run_compare(cfg, ["k2", "k4"], tmp_path / "c")
    sizes = [
        len(json.loads((root / e / "summary.json").read_text())["clients"]) for e in ("k2", "k4")
    ]
    assert sizes == [4, 8]
    assert (root / "plots" / "collaboration.png").stat().st_size > 0


def test_a_comparison_says_which_run_of_how_many_and_the_time_left(tmp_path):
    """(#71 item 5) Each run's progress names its entry and seed of how many, and after
    each run one line gives the whole comparison's runs done and time left (from the
    seconds per round so far: a run of twice the rounds counts twice)."""
    from typer.testing import CliRunner

    from raycobo.cli import app
    from raycobo.comparison.execute import CompareClock

    clock = CompareClock([10, 10, 20])
    clock.done(0, 5.0)
    assert clock.left_s() == pytest.approx(15.0)
    assert clock.say() == "1 of 3 runs done in 5 s, about 15 s left"
    clock.done(1, 15.0)  # 20 s for 20 rounds: 1 s a round
    assert clock.say() == "2 of 3 runs done in 20 s, about 20 s left"

    quad = ["data.name=quadratic", "rounds=4", "eval_every=2", "tracking.enabled=false"]
    args = ["compare", "-", *quad, "-a", "local,fedavg", "--seeds", "0,1"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: c\n")
    args[1] = str(cfg)
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output
    err = res.stderr
    assert "local seed 0 (entry 1 of 2, seed 1 of 2): round 2/4" in err
    assert "fedavg seed 1 (entry 2 of 2, seed 2 of 2): round 4/4" in err
    done = [ln for ln in err.splitlines() if ln.startswith("compare: ")]
    assert [ln.split(" runs done")[0] for ln in done] == [f"compare: {k} of 4" for k in (1, 2, 3)]
    assert all(" left" in ln for ln in done)
