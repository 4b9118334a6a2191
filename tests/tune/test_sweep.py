"""Sweeps: space validation, and a real 4-trial Tune sweep tracked in MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raycobo.cli import app
from raycobo.config import ConfigError, load_config, with_overrides
from raycobo.tune.space import load_sweep

SPACE = """\
# raycobo sweep space.yaml
name: t
base:
  name: quad
  rounds: 40
  eval_every: 10
  data: {{name: quadratic, dim: 4, noise: 0.05, center_scale: 3, curvature: [1, 2],
         partition: {{clients_per_cluster: [2, 2]}}}}
  algorithm: {{name: cobo}}
  engine: {{num_cpus: 2}}
space:
{space}
metric: mean_loss
mode: min
num_samples: 1
max_concurrent: 2
time_budget_s: 240
"""


def write(tmp_path, space: str, name: str = "space.yaml"):
    p = tmp_path / name
    p.write_text(SPACE.format(space=space))
    return p


@pytest.mark.parametrize(
    ("space", "needle"),
    [
        ("  algorithm.rhoo: {uniform: [0, 1]}", "space.algorithm.rhoo"),
        ("  algorithm.rho: {uniform: [1, 0]}", "space.algorithm.rho"),
        ("  algorithm.rho: {loguniform: [0, 1]}", "space.algorithm.rho"),
        ("  algorithm.rho: {uniform: [-1, 1]}", "space.algorithm.rho"),
        ("  algorithm.rho: {normal: [0, 1]}", "space.algorithm.rho"),
        ("  algorithm.sampling: {choice: []}", "space.algorithm.sampling"),
        ("  algorithm.sampling: {choice: [constant, never]}", "space.algorithm.sampling"),
        ("  rounds: {randint: [1.5, 3]}", "space.rounds"),
    ],
)
def test_bad_spaces_name_the_key(tmp_path, space, needle):
    with pytest.raises(ConfigError) as info:
        load_sweep(write(tmp_path, space))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_unknown_sweep_keys_and_shipped_spaces(tmp_path):
    p = write(tmp_path, "  algorithm.rho: {uniform: [0, 1]}")
    p.write_text(p.read_text() + "schedular: asha\n")
    with pytest.raises(ConfigError, match="schedular"):
        load_sweep(p)
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spaces = sorted((root / "tune_spaces").glob("*.yaml"))
    assert len(spaces) >= 3  # found from the repository root, wherever pytest runs
    from raycobo.comparison.plan import entry_config
    from raycobo.tune.entry import tuning_base
    from raycobo.tune.space import check_space, read_spec

    for path in spaces:
        if path.name.startswith("tune_"):  # `compare --tune ENTRY=SPACE`: the entry is the base
            assert path.read_text().startswith("# raycobo compare CONFIG --tune "), path
            entry = path.stem.removeprefix("tune_")
            cfg = load_config(root / "examples" / "quickstart.yaml")
            check_space(read_spec(path), tuning_base(entry_config(cfg, entry)), path)
            continue
        assert path.read_text().startswith("# raycobo sweep "), path
        spec, base = load_sweep(path)
        assert spec.space


def test_four_trial_sweep_tracks_trials_and_writes_a_runnable_best_config(tmp_path):
    """Prepare a 2 x 2 grid (one step size diverges); Execute `raycobo sweep`; Assert 4
    MLflow trial runs under one parent with params and metric histories, the diverging
    trials marked failed, and a best config that `raycobo run` accepts."""
    space = "  algorithm.lr: {grid: [0.1, 40.0]}\n  algorithm.sampling: {grid: [constant, full]}"
    path = write(tmp_path, space)
    db = tmp_path / "mlflow.db"
    out = tmp_path / "sweep"
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            str(path),
            f"tracking.uri=sqlite:///{db}",
            f"tracking.artifact_root={tmp_path / 'art'}",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "sweep_summary.json").read_text())
    assert summary["num_trials"] == 4 and summary["failed"] == 2
    # the console: one line per trial and the closing lines; Ray's and Tune's own
    # output (experiment box, TensorBoard hint, warnings) is in sweep.log
    lines = res.output.strip().splitlines()
    trial_lines = [x for x in lines if x.startswith("[") and "/4] trial" in x]
    assert len(trial_lines) == 4, res.output
    assert sum("(failed)" in x for x in trial_lines) == 2
    assert all("lr=" in x and "sampling=" in x and "mean_loss" in x for x in trial_lines)
    # a start line saying what runs and where; status lines while trials run; then the
    # result: counts, the best on validation, its one test run, the files
    assert lines[0].startswith("sweep t: 4 trials of 40 rounds, search random, scheduler fifo")
    assert "scored on validation" in lines[0] and "sweep.log" in lines[0]
    status = [x for x in lines if x.startswith("  ") and " s: " in x]
    assert all("running" in x and "failed" in x for x in status)
    final = [x for x in lines if x.startswith("t best on test: round ")]  # its progress
    assert len(final) == 4  # rounds 10..40, every 10
    data = [x for x in lines if x.startswith("data: ")]  # the test run's data report
    assert data == ["data: 4 clients in 2 clusters (2 each)"]  # (the quadratic task)
    assert len(lines) - len(status) - len(final) - len(data) <= 1 + 4 + 6, res.output
    assert "4 trials: 2 completed, 0 stopped, 2 failed, 0 interrupted" in res.output
    assert "best mean_loss on validation" in res.output and "on test (run once" in res.output
    for chatter in ("Configuration for experiment", "TensorBoard", "WARNING"):
        assert chatter not in res.output
    assert "Configuration for experiment" in (out / "sweep.log").read_text()
    failed = [t for t in summary["trials"] if t["status"] == "error"]
    assert all(t["config"]["algorithm.lr"] == 40.0 and t["error"] for t in failed)
    assert summary["best"]["config"]["algorithm.lr"] == 0.1
    import ray

    # where each trial ran (this machine's one node; test_ray_up checks two)
    assert {t["node"] for t in summary["trials"]} == {ray.util.get_node_ip_address()}

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    parent = [r for r in runs if r.info.run_id == summary["mlflow_parent_run_id"]]
    children = [
        r for r in runs if r.data.tags.get("mlflow.parentRunId") == summary["mlflow_parent_run_id"]
    ]
    trials = [r for r in children if r.data.tags["raycobo.sweep_role"] == "trial"]
    final = [r for r in children if r.data.tags["raycobo.sweep_role"] == "final_test"]
    assert len(parent) == 1 and len(trials) == 4 and len(final) == 1
    assert final[0].info.status == "FINISHED"
    # (the quadratic task's losses are exact: it reads no split, and its runs' params
    # leave data.evaluate_on out)
    assert all("data.evaluate_on" not in r.data.params for r in [*trials, *final])
    # the parent records what it searched, not one trial's settings
    pp, ptags = parent[0].data.params, parent[0].data.tags
    assert ptags["raycobo.kind"] == "sweep" and "raycobo.algorithm" not in ptags
    assert not any(k.startswith("algorithm.") for k in pp)
    assert pp["sweep.space.algorithm.lr"] == '{"grid": [0.1, 40.0]}'
    assert pp["sweep.metric"].startswith(summary["metric"]) and "None" not in pp.values()
    best_value = summary["best"]["metrics"][summary["metric"]]
    assert parent[0].data.metrics[f"best_{summary['metric']}"] == pytest.approx(best_value)
    for r in trials:
        assert r.data.params["algorithm.name"] == "cobo" and "None" not in r.data.params.values()
        # the run's folder is the one the sweep keeps, not Ray's session folder
        kept = Path(r.data.tags["raycobo.lifecycle.run_dir"])
        assert kept.parent.parent == (out / "tune").resolve() and kept.name == "run"
        assert (kept / "config.yaml").is_file()
        # the run's name shows what the trial tried
        name = r.data.tags["mlflow.runName"]
        assert f"lr={float(r.data.params['algorithm.lr']):.3g}" in name
        assert f"sampling={r.data.params['algorithm.sampling']}" in name
        assert r.data.params["algorithm.lr"] in ("0.1", "40.0")
        assert len(client.get_metric_history(r.info.run_id, "mean_loss")) >= 1
    ok = [r for r in trials if r.data.params["algorithm.lr"] == "0.1"]
    assert all(r.info.status == "FINISHED" for r in ok)
    assert all(len(client.get_metric_history(r.info.run_id, "mean_loss")) == 5 for r in ok)
    assert all(r.info.status == "FAILED" for r in trials if r not in ok)

    best = out / "best_config.yaml"
    cfg = load_config(best)
    assert cfg.algorithm.lr == 0.1
    res = CliRunner().invoke(
        app, ["run", str(best), "--out", str(tmp_path / "rerun"), "-q", "--no-tracking"]
    )
    assert res.exit_code == 0, res.output
    rerun = json.loads((tmp_path / "rerun" / "summary.json").read_text())
    # best_config.yaml is what the final test run ran: the base's own split, the best values
    assert cfg.data.evaluate_on == "test" and summary["chosen_on"] == "validation"
    assert rerun["mean_loss"] == pytest.approx(summary["test"]["mean_loss"], rel=1e-6)
    final = json.loads((out / "final" / "summary.json").read_text())
    assert final["status"] == "completed" and final["mean_loss"] == summary["test"]["mean_loss"]


def test_a_sweep_can_be_resumed_from_its_directory(tmp_path):
    """Resuming restores Tune's experiment state and finishes with the same trials."""
    path = write(tmp_path, "  algorithm.rho: {grid: [0.01, 0.1]}")
    out = tmp_path / "sw"
    base = ["sweep", str(path), "tracking.enabled=false"]
    res = CliRunner().invoke(app, [*base, "--out", str(out)])
    assert res.exit_code == 0, res.output
    first = json.loads((out / "sweep_summary.json").read_text())
    res = CliRunner().invoke(app, ["sweep", "--resume", str(out)])
    assert res.exit_code == 0, res.output
    again = json.loads((out / "sweep_summary.json").read_text())
    assert again["num_trials"] == first["num_trials"] == 2
    assert again["best"]["config"] == first["best"]["config"]
    res = CliRunner().invoke(app, ["sweep", "--resume", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "nothing to resume" in res.stderr
    res = CliRunner().invoke(app, [*base, "--resume", str(out)])
    assert res.exit_code == 2 and "takes everything from the sweep's directory" in res.stderr


def test_a_planted_tune_file_or_a_shared_directory_is_not_resumed(tmp_path, monkeypatch):
    """Tune unpickles its state on restore, so a sweep directory is trusted like code: a
    file swapped in (here a tuner.pkl whose unpickling would run a command) -- also with
    its digest rewritten in sweep_state.json, since the record is signed with a key that
    stays in the user's config folder --, a symbolic link, or a directory other users can
    write is refused before Tune sees it."""
    import hashlib
    import os
    import pickle

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    path = write(tmp_path, "  algorithm.rho: {grid: [0.01]}")
    out = tmp_path / "sw"
    res = CliRunner().invoke(app, ["sweep", str(path), "tracking.enabled=false", "--out", str(out)])
    assert res.exit_code == 0, res.output
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    real = (out / "tune" / "tuner.pkl").read_bytes()
    (out / "tune" / "tuner.pkl").write_bytes(pickle.dumps(Evil()))
    res = CliRunner().invoke(app, ["sweep", "--resume", str(out)])
    assert res.exit_code == 2 and "Tune's files changed" in res.stderr and "tuner.pkl" in res.stderr
    assert not marker.exists()
    state_file = out / "sweep_state.json"
    signed = state_file.read_text()
    state = json.loads(signed)
    state["tune_digests"]["tuner.pkl"] = hashlib.sha256(pickle.dumps(Evil())).hexdigest()
    state_file.write_text(json.dumps(state))  # the digest planted too: the signature fails
    res = CliRunner().invoke(app, ["sweep", "--resume", str(out)])
    assert res.exit_code == 2 and "not signed with your key" in res.stderr, res.output
    assert not marker.exists()
    state_file.write_text(signed)
    (out / "tune" / "tuner.pkl").write_bytes(real)
    planted = out / "tune" / "experiment_state-2099-01-01_00-00-00.json"
    planted.symlink_to(tmp_path / "elsewhere.json")
    res = CliRunner().invoke(app, ["sweep", "--resume", str(out)])
    assert res.exit_code == 2 and "is a symbolic link" in res.stderr, res.output
    planted.unlink()
    key = tmp_path / "config" / "raycobo" / "secret"
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    os.chmod(out / "tune", 0o777)
    res = CliRunner().invoke(app, ["sweep", "--resume", str(out)])
    assert res.exit_code == 2 and "writable by other users" in res.stderr
    os.chmod(out / "tune", 0o755)
    res = CliRunner().invoke(app, ["sweep", "--resume", str(out)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupted_sweep_resumes_its_trials_from_their_checkpoints(tmp_path, sig):
    """Ctrl-C (or SIGTERM, as a scheduler or `kill` sends it) on the sweep's driver once
    the trials have reported checkpoints: exit 130 and a pointer to --resume, no stack
    of Ray's; the trials read interrupted; the resumed trials continue from their
    checkpoints (not from round 0) and end with the numbers of an uninterrupted run of
    the same config."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from raycobo.lifecycle.experiment import run_experiment

    space = SPACE.replace("rounds: 40", "rounds: 3000").replace("eval_every: 10", "eval_every: 100")
    path = tmp_path / "space.yaml"
    path.write_text(space.format(space="  algorithm.rho: {grid: [0.05, 0.1]}"))
    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "raycobo.cli", "sweep", str(path), "tracking.enabled=false"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while len({p.parent for p in out.glob("tune/*/checkpoint_*")}) < 2:  # both trials
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "--resume" in err, err
    assert "SIGTERM received" not in err and "logging.cc" not in err, err
    from ray.tune import ExperimentAnalysis

    # the trials Tune saved as unfinished (one may have ended while Tune was stopping)
    unfinished = {
        Path(t.path).name
        for t in ExperimentAnalysis(str(out / "tune")).trials
        if t.status not in ("TERMINATED", "ERROR")
    }
    assert unfinished
    assert f"raycobo sweep --resume {out}" in err  # complete: nothing else to give
    stopped = json.loads((out / "sweep_summary.json").read_text())
    assert stopped["interrupted"] >= 1
    assert all(t["status"] in ("interrupted", "completed") for t in stopped["trials"])
    assert all(
        t["status"] == "interrupted" for t in stopped["trials"] if t["metrics"].get("round") != 3000
    )
    for t in stopped["trials"]:  # the trials' own summaries agree (none left running)
        if (Path(t["path"]) / "run" / "summary.json").is_file():
            own = json.loads((Path(t["path"]) / "run" / "summary.json").read_text())
            assert own["status"] == t["status"], own
    if stopped["best"] is not None:  # only a finished trial can be the best
        assert stopped["best"]["status"] == "completed"
    resume = [sys.executable, "-m", "raycobo.cli", "sweep", "--resume", str(out)]
    res = subprocess.run(resume, capture_output=True, text=True, timeout=300, env=os.environ)
    assert res.returncode == 0, res.stderr
    runs = {
        p.parents[1].name: json.loads(p.read_text()) for p in out.glob("tune/*/run/summary.json")
    }
    assert len(runs) == 2 and all(r["status"] == "completed" for r in runs.values())
    for name in unfinished:  # they went on from their checkpoints, not from round 0
        assert (runs[name]["resumed_from_round"] or 0) > 0, runs[name]
    summary = json.loads((out / "sweep_summary.json").read_text())
    assert summary["num_trials"] == 2 and summary["failed"] == 0
    # the same numbers as the trial's config run straight through
    best = load_config(out / "best_config.yaml")
    assert best.rounds == 3000 and best.algorithm.rho == summary["best"]["config"]["algorithm.rho"]
    straight = run_experiment(best, tmp_path / "straight")
    assert straight.summary["mean_loss"] == pytest.approx(
        summary["best"]["metrics"]["mean_loss"], rel=1e-6
    )


def test_a_plugin_method_is_swept_over_its_own_key(tmp_path):
    """A fresh process sweeps FedProx's mu (a key no built-in has): the trials run in
    Ray workers that get the plugin module from the sweep's runtime environment."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    folder = tmp_path / "plugins"
    folder.mkdir()
    shutil.copy(repo / "examples" / "plugins" / "fedprox.py", folder / "fp_sweep.py")
    space = SPACE.replace("algorithm: {{name: cobo}}", "algorithm: {{name: 'fp_sweep:FedProx'}}")
    space = space.replace("rounds: 40", "rounds: 6").replace("eval_every: 10", "eval_every: 3")
    space = space.replace("base:\n", f"base:\n  plugin_paths: [{folder}]\n")
    path = tmp_path / "space.yaml"
    path.write_text(space.format(space="  algorithm.mu: {grid: [0.0, 0.5]}"))
    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "raycobo", "sweep", str(path), "tracking.enabled=false"]
    res = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((out / "sweep_summary.json").read_text())
    assert summary["failed"] == 0 and summary["num_trials"] == 2
    assert sorted(t["config"]["algorithm.mu"] for t in summary["trials"]) == [0.0, 0.5]
    assert load_config(out / "best_config.yaml").algorithm.name == "fp_sweep:FedProx"


TUNE_SPACE = """\
# raycobo compare CONFIG --tune cobo=space.yaml
name: tune-cobo
space:
  algorithm.gamma: {grid: [0.01, 0.1]}
metric: mean_accuracy
mode: max
num_samples: 1
max_concurrent: 2
resources: {cpu: 1}
"""


def test_compare_tune_picks_on_validation_and_runs_with_the_pick(tmp_path):
    """`compare --tune cobo=SPACE`: the sweep scores trials on held-out training data, the
    pick lands in tuned.json and in the stored config, and the compared run uses it."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "name: t\nrounds: 20\neval_every: 10\nbatch_size: 16\n"
        "data: {name: digits, partition: {kind: label_permutation, num_clusters: 2, "
        "clients_per_cluster: 2}}\nmodel: {name: mlp, hidden: [16]}\n"
        "algorithm: {name: cobo}\nengine: {num_cpus: 2}\ntracking: {enabled: false}\n"
        "compare: {algorithms: [local, cobo]}\n"
    )
    space = tmp_path / "space.yaml"
    space.write_text(TUNE_SPACE)
    out = tmp_path / "cmp"
    r = CliRunner().invoke(
        app, ["compare", str(cfg), "--out", str(out), "--tune", f"cobo={space}", "-q"]
    )
    assert r.exit_code == 0, r.output
    picked = json.loads((out / "tuned.json").read_text())
    assert set(picked) == {"cobo"} and picked["cobo"]["algorithm.gamma"] in (0.01, 0.1)
    trials = json.loads((out / "tune-cobo" / "sweep_summary.json").read_text())["trials"]
    assert len(trials) == 2
    assert all(t["status"] == "completed" for t in trials)
    best = load_config(out / "tune-cobo" / "best_config.yaml")  # the trials' base + pick
    assert best.data.evaluate_on == "validation" and best.data.validation_fraction == 0.2
    stored = load_config(out / "cobo" / "config.yaml")
    assert stored.algorithm.gamma == picked["cobo"]["algorithm.gamma"]
    assert stored.data.evaluate_on == "test"  # the comparison itself is scored on test
    bad = CliRunner().invoke(app, ["compare", str(cfg), "--tune", f"ditto={space}", "-q"])
    assert bad.exit_code != 0 and "'ditto' is not compared" in bad.output


def test_a_metric_typo_stops_before_any_sweep_runs(tmp_path):
    """`mean_los` would be NaN in every trial: refused when the space is read, also for
    the second of two tuned entries of a compare (before the first one's sweep)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "name: t\nrounds: 4\ndata: {name: digits}\nmodel: {name: mlp, hidden: [8]}\n"
        "tracking: {enabled: false}\ncompare: {algorithms: [local, cobo, ditto]}\n"
    )
    good, typo = tmp_path / "good.yaml", tmp_path / "typo.yaml"
    good.write_text(TUNE_SPACE)
    typo.write_text(TUNE_SPACE.replace("metric: mean_accuracy", "metric: mean_los"))
    assert "metric: mean_los\n" in typo.read_text()
    out = tmp_path / "cmp"
    r = CliRunner().invoke(
        app,
        [
            "compare",
            str(cfg),
            "--out",
            str(out),
            "--tune",
            f"cobo={good}",
            "--tune",
            f"ditto={typo}",
            "-q",
        ],
    )
    assert r.exit_code == 2, r.output
    assert "invalid sweep key 'metric'" in r.stderr and "typo.yaml" in r.stderr
    assert "mean_accuracy" in r.stderr  # the metrics it can be
    assert not (out / "tune-cobo").exists()  # no sweep ran
    s = CliRunner().invoke(app, ["sweep", str(typo), "--out", str(tmp_path / "sw")])
    assert s.exit_code == 2 and "invalid sweep key 'metric'" in s.stderr


def test_a_restarted_trial_continues_its_own_run_from_the_newest_checkpoint(tmp_path):
    """The interrupted-sweep test above failed twice in full-suite runs (never alone): a
    resumed trial started over from round 0 though its run had checkpoints. A trial's run
    lives in the sweep's own folder, so without a checkpoint from Tune (whose saved state
    can miss the newest one when the sweep stops while a trial reports it) the run
    resumes from its own; a checkpoint Tune hands back joins them without replacing a
    newer one; a first attempt (nothing there) starts fresh."""
    from raycobo.tune.trial import _take_checkpoint

    out = tmp_path / "sweep" / "tune" / "trial_0" / "run"
    assert _take_checkpoint(out, None) is False and not (out / "checkpoints").exists()
    (out / "checkpoints").mkdir(parents=True)
    (out / "config.yaml").write_text("name: x\n")
    for r in (100, 200):
        (out / "checkpoints" / f"round_{r:06d}.pt").write_bytes(b"ckpt %d" % r)
    assert _take_checkpoint(out, None) is True
    given = tmp_path / "tune-checkpoint"
    given.mkdir()
    (given / "round_000100.pt").write_bytes(b"tune's copy")
    (given / "round_000050.pt").write_bytes(b"ckpt 50")
    assert _take_checkpoint(out, given) is True
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["round_000050.pt", "round_000100.pt", "round_000200.pt"]
    assert (out / "checkpoints" / "round_000100.pt").read_bytes() == b"ckpt 100"


@pytest.mark.slow
def test_every_shipped_space_runs_end_to_end_on_a_tiny_budget(tmp_path):
    """Each tune_spaces/ file as a user runs it, on a tiny budget (its --smoke-test,
    digits instead of Fashion-MNIST, a few rounds): `raycobo sweep` for the sweep files
    (trials end completed or stopped, the best then runs once on test), and the tuning
    sweep of `compare --tune ENTRY=FILE` for the others (on validation, no final run)."""
    from raycobo.comparison.plan import entry_config
    from raycobo.tune.entry import tuning_base
    from raycobo.tune.space import read_spec
    from raycobo.tune.sweep import run_sweep

    root = Path(__file__).resolve().parents[2]
    tiny = ["data.name=digits", "data.fraction=0.5", "rounds=8", "eval_every=4"]
    tiny += ["tracking.enabled=false"]
    for path in sorted((root / "tune_spaces").glob("*.yaml")):
        out = tmp_path / path.stem
        if path.name.startswith("tune_"):
            entry = path.stem.removeprefix("tune_")
            cfg = load_config(root / "examples" / "quickstart.yaml", tiny)
            spec = read_spec(path)
            summary = run_sweep(
                spec, tuning_base(entry_config(cfg, entry)), out, smoke_test=True, final=False
            )
            assert summary["chosen_on"] == "validation" and summary["test"] is None, path
        else:
            over = tiny if "quickstart" in path.read_text() else ["tracking.enabled=false"]
            res = CliRunner().invoke(
                app, ["sweep", str(path), "--smoke-test", "--out", str(out), *over]
            )
            assert res.exit_code == 0, (path, res.output)
            summary = json.loads((out / "sweep_summary.json").read_text())
            assert summary["test"] is not None and (out / "sweep_report.html").is_file()
        statuses = {t["status"] for t in summary["trials"]}
        assert statuses <= {"completed", "stopped", "error"}, path
        # (tune_fedavg_ft's ft_steps all need more than the tiny run's rounds)
        assert summary["best"] is not None or path.name == "tune_fedavg_ft.yaml", path
        # errors only where the space itself names a value the tiny run cannot take
        for t in summary["trials"]:
            assert t["status"] != "error" or "ft_steps" in (t["error"] or ""), (path, t)


def test_a_space_the_method_refuses_at_the_runs_length_is_refused_before_any_trial(tmp_path):
    """fedavg_ft's ft_steps must leave FedAvg rounds: a space of 50 fine-tuning rounds on a
    40-round run is refused by name when checked, not as five failed trials."""
    from raycobo.tune.space import check_space, read_spec

    p = tmp_path / "ft.yaml"
    p.write_text("space:\n  algorithm.ft_steps: {grid: [5, 50]}\nmetric: mean_accuracy\n")
    base = load_config(None, ["algorithm.name=fedavg_ft", "rounds=40"])
    with pytest.raises(ConfigError) as info:
        check_space(read_spec(p), base, p)
    msg = str(info.value)
    assert "space.algorithm.ft_steps" in msg and "rounds=40" in msg and "\n" not in msg
    check_space(read_spec(p), with_overrides(base, {"rounds": 60}), p)  # 50 < 60: accepted
