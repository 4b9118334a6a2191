"""Sweeps under every scheduler and searcher: trials that a scheduler stops end
``stopped`` (never failed) in all four places, finished trials report their last round,
PBT records its lineage, Optuna and HyperOpt propose the space's values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raycobo.cli import app
from raycobo.config import ConfigError
from raycobo.tune.space import load_sweep

SPACE = """\
# raycobo sweep space.yaml
name: {name}
base:
  name: quad
  rounds: {rounds}
  eval_every: 5
  data: {{name: quadratic, dim: 4, noise: 0.05, center_scale: 3, curvature: [1, 2],
         partition: {{clients_per_cluster: [2, 2]}}}}
  algorithm: {{name: cobo}}
  engine: {{num_cpus: 2}}
space:
{space}
metric: mean_loss
mode: min
num_samples: {samples}
max_concurrent: {concurrent}
time_budget_s: 300
{extra}
"""


def sweep(tmp_path, name, space, extra="", rounds=20, samples=1, concurrent=1, tracked=False):
    path = tmp_path / f"{name}.yaml"
    text = SPACE.format(
        name=name,
        space=space,
        extra=extra,
        rounds=rounds,
        samples=samples,
        concurrent=concurrent,
    )
    path.write_text(text)
    out = tmp_path / name
    args = ["sweep", str(path), "--out", str(out)]
    if tracked:
        args += [f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
        args += [f"tracking.artifact_root={tmp_path / 'art'}"]
    else:
        args += ["tracking.enabled=false"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return res, json.loads((out / "sweep_summary.json").read_text()), out


def run_summary(trial: dict) -> dict:
    return json.loads((Path(trial["path"]) / "run" / "summary.json").read_text())


def test_asha_stops_a_bad_trial_and_lets_a_good_one_finish_in_all_four_places(tmp_path):
    """Two trials one after the other: lr 0.3 runs first and finishes (ASHA's max_t is
    the run's length: it never cuts the last evaluation); lr 0.001 is worse at the first
    rung and is stopped there. The stop reads ``stopped`` with who and where in the
    trial's summary.json, in sweep_summary.json, on the console and in MLflow (FINISHED,
    tagged), with the metrics of its last evaluation; the finished trial has its final
    round's metrics everywhere."""
    res, summary, out = sweep(
        tmp_path,
        "asha",
        "  algorithm.lr: {grid: [0.3, 0.001]}",
        "scheduler: {kind: asha, grace_period: 1, reduction_factor: 2}",
        tracked=True,
    )
    by_lr = {t["config"]["algorithm.lr"]: t for t in summary["trials"]}
    good, bad = by_lr[0.3], by_lr[0.001]
    assert good["status"] == "completed" and good["metrics"]["round"] == 20
    assert bad["status"] == "stopped" and bad["stopped_by"] == "asha"
    assert bad["metrics"]["round"] == 5 and bad["metrics"]["mean_loss"] is not None
    assert summary["completed"] == 1 and summary["stopped"] == 1 and summary["failed"] == 0
    # the trials' own run directories
    g, b = run_summary(good), run_summary(bad)
    assert g["status"] == "completed" and g["last_round"] == 20
    assert g["mean_loss"] == pytest.approx(good["metrics"]["mean_loss"])
    assert b["status"] == "stopped" and b["stopped_by"] == "asha" and b["last_round"] == 5
    assert b["mean_loss"] == pytest.approx(bad["metrics"]["mean_loss"]) and b["checkpoint"]
    assert [h["round"] for h in b["history"]] == [0, 5]
    # the console
    assert "(finished)" in res.output and "(stopped by asha at round 5)" in res.output
    assert "1 completed, 1 stopped, 0 failed" in res.output and "failed)" not in res.output
    # MLflow: both trial runs FINISHED, the stopped one tagged, its metrics up to round 5
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    trials = {
        float(r.data.params["algorithm.lr"]): r
        for r in runs
        if r.data.tags.get("raycobo.sweep_role") == "trial"
    }
    assert {r.info.status for r in trials.values()} == {"FINISHED"}
    stopped = trials[0.001]
    assert stopped.data.tags["raycobo.stopped_by"] == "asha"
    assert stopped.data.tags["raycobo.last_round"] == "5"
    steps = [m.step for m in client.get_metric_history(stopped.info.run_id, "mean_loss")]
    assert steps == [0, 5]
    finished = client.get_metric_history(trials[0.3].info.run_id, "mean_loss")
    assert max(m.step for m in finished) == 20
    # the report shows both trials and how each ended
    page = (out / "sweep_report.html").read_text()
    assert "stopped by asha at round 5" in page and "data:image/png;base64," in page


def test_hyperband_median_and_pbt_run_and_end_every_trial_right(tmp_path):
    """HyperBand (pausing and resuming trials), median stopping, and PBT, each on two
    concurrent trials: no trial failed, every trial completed or stopped; under PBT a
    trial continued from the other's checkpoint with its perturbed values, recorded in
    its lineage, its earlier segment kept and its new run naming where it started."""
    for kind, extra in (
        ("hyperband", "scheduler: {kind: hyperband, reduction_factor: 2}"),
        ("median", "scheduler: {kind: median, grace_period: 1, min_samples_required: 1}"),
    ):
        _, summary, _ = sweep(
            tmp_path, kind, "  algorithm.lr: {grid: [0.3, 0.001]}", extra, concurrent=2
        )
        assert summary["failed"] == 0 and summary["interrupted"] == 0, kind
        assert {t["status"] for t in summary["trials"]} <= {"completed", "stopped"}, kind
        assert summary["best"]["config"]["algorithm.lr"] == 0.3, kind
        for t in summary["trials"]:
            assert run_summary(t)["status"] == t["status"], kind

    _, summary, out = sweep(
        tmp_path,
        "pbt",
        "  algorithm.lr: {grid: [0.3, 0.001]}\n  algorithm.gamma: {choice: [1.0, 3.0]}",
        "scheduler: {kind: pbt, perturbation_interval: 1, quantile_fraction: 0.5, synch: true}",
        rounds=30,
        concurrent=2,
    )
    assert summary["failed"] == 0 and summary["interrupted"] == 0
    forked = [t for t in summary["trials"] if t["lineage"]]
    assert forked, summary["trials"]
    t = forked[0]
    step = t["lineage"][0]
    folders = {Path(x["path"]).name for x in summary["trials"]}
    assert step["from_trial"] in folders and step["round"] % 5 == 0
    assert (Path(t["path"]) / "run.0" / "config.yaml").is_file()  # the segment before
    run = run_summary(t)
    assert "started_from" in run and run["status"] in ("completed", "stopped")
    assert run["history"][0]["round"] == 0  # the donor's evaluations up to the step


def test_optuna_and_hyperopt_propose_the_spaces_values(tmp_path):
    """Both model-based searchers run, seeded, and every trial's values lie in the space
    (a log-uniform range and a choice)."""
    space = "  algorithm.lr: {loguniform: [0.05, 0.5]}\n  algorithm.gamma: {choice: [1.0, 3.0]}"
    for search in ("optuna", "hyperopt"):
        _, summary, _ = sweep(tmp_path, search, space, f"search: {search}", samples=2)
        assert summary["search"] == search and summary["num_trials"] == 2
        assert summary["completed"] == 2, summary["trials"]
        for t in summary["trials"]:
            assert 0.05 <= t["config"]["algorithm.lr"] <= 0.5
            assert t["config"]["algorithm.gamma"] in (1.0, 3.0)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("search: optuna", "space.algorithm.lr': search optuna samples every key"),
        ("scheduler: {kind: asha, perturbation_interval: 2}", "perturbation_interval"),
        ("scheduler: {kind: fifo, grace_period: 2}", "does nothing with kind fifo"),
        ("scheduler: {kind: pbt}", "pbt needs a key to perturb"),
        ("scheduler: {kind: pbt}\nsearch: hyperopt", "pbt explores by itself"),
    ],
)
def test_searcher_and_scheduler_settings_that_cannot_work_are_refused(tmp_path, body, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(
        SPACE.format(
            name="bad",
            space="  algorithm.lr: {grid: [0.1, 0.3]}",
            extra=body,
            rounds=20,
            samples=1,
            concurrent=1,
        )
    )
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert needle in str(info.value) and "\n" not in str(info.value)
    res = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "never")])
    assert res.exit_code == 2 and needle in res.stderr
    assert not (tmp_path / "never").exists()  # refused before a folder was made


def test_a_pbt_space_over_other_than_method_settings_is_refused(tmp_path):
    path = tmp_path / "pbt.yaml"
    path.write_text(
        SPACE.format(
            name="pbt",
            space="  batch_size: {choice: [8, 16]}",
            extra="scheduler: {kind: pbt}",
            rounds=20,
            samples=1,
            concurrent=1,
        )
    )
    with pytest.raises(ConfigError, match="space.batch_size"):
        load_sweep(path)


def test_a_space_that_chooses_on_the_test_split_says_so_everywhere(tmp_path):
    """`evaluate_on: test` given in the space: trials are scored on the test split, no
    final run follows, and the start line, the closing lines, the summary and the report
    mark the choice as made on the test split."""
    res, summary, out = sweep(
        tmp_path, "ontest", "  algorithm.lr: {grid: [0.3, 0.1]}", "evaluate_on: test"
    )
    assert summary["chosen_on"] == "test" and summary["test"] is None
    assert not (out / "final").exists()
    assert "trials scored on the TEST split" in res.output.splitlines()[0]
    assert "chosen on the TEST split" in res.output and "on test (run once" not in res.output
    assert "Chosen on the TEST split" in (out / "sweep_report.html").read_text()
    from raycobo.config import load_config

    for t in summary["trials"]:
        assert load_config(Path(t["path"]) / "run" / "config.yaml").data.evaluate_on == "test"
