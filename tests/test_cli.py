"""The real CLI on tiny configs: run directory contents, MLflow logging, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from raycobo.cli import app

QUAD = [
    "data.name=quadratic",
    "data.partition.clients_per_cluster=[2,3]",
    "rounds=30",
    "eval_every=10",
    "algorithm.sampling=full",
]


@pytest.fixture
def cfg_file(tmp_path):
    p = tmp_path / "exp.yaml"
    p.write_text("# raycobo run exp.yaml\nname: tiny\nseed: 1\n")
    return p


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_run_writes_the_run_directory_and_tracks_in_mlflow(tmp_path, cfg_file):
    """Prepare a sqlite store; Execute `raycobo run`; Assert run dir files and MLflow run."""
    db = tmp_path / "store.db"
    out = tmp_path / "run"
    res = invoke(
        "run",
        cfg_file,
        *QUAD,
        f"tracking.uri=sqlite:///{db}",
        f"tracking.artifact_root={tmp_path / 'art'}",
        "--out",
        out,
        "-q",
    )
    assert res.exit_code == 0, res.output
    for name in ("config.yaml", "summary.json", "metrics.csv", "rounds.csv", "collaboration.npy"):
        assert (out / name).is_file(), name
    assert (out / "plots" / "curves.png").is_file()
    assert (out / "plots" / "collaboration.png").is_file()
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "algorithm",
        "engine",
        "n_clients",
        "rounds",
        "seed",
        "mean_accuracy",
        "mean_loss",
        "clients",
        "collaboration",
        "wall_seconds",
        "mlflow_run_id",
    ):
        assert key in summary, key
    assert summary["algorithm"] == "cobo" and summary["n_clients"] == 5
    assert summary["mean_accuracy"] is None  # regression task
    assert [c["cluster"] for c in summary["clients"]] == [0, 0, 1, 1, 1]
    assert np.array(summary["collaboration"]).shape == (5, 5)
    assert np.allclose(np.load(out / "collaboration.npy"), summary["collaboration"])
    lines = (out / "metrics.csv").read_text().strip().splitlines()
    assert lines[0] == "round,client,cluster,accuracy,loss"
    assert len(lines) == 1 + 4 * 5  # rounds 0, 10, 20, 30 x 5 clients

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["algorithm.name"] == "cobo"
    assert run.data.params["rounds"] == "30"
    hist = client.get_metric_history(run.info.run_id, "mean_loss")
    assert [m.step for m in hist] == [0, 10, 20, 30]
    # the clients are a table at the end (series only with tracking.client_series)
    assert client.get_metric_history(run.info.run_id, "loss/client_004") == []
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "config.yaml", "plots", "clients.json"} <= arts
    assert run.info.status == "FINISHED"
    # (#71) the experiment opens on MLflow 3's training runs view, and the run says what
    # it was and how it ended
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("cobo on quadratic, 5 clients, 30 rounds (completed): mean loss")


def test_mlflow_shows_accuracy_in_percent_and_client_series_when_asked(tmp_path, cfg_file):
    """Accuracy in one unit (percent, as the console and the report print it); every
    client's series logged only with tracking.client_series."""
    from mlflow.tracking import MlflowClient

    db, out = tmp_path / "store.db", tmp_path / "run"
    digits = ["data.name=digits", "data.partition.clients_per_cluster=2", "rounds=4"]
    over = [*digits, "eval_every=2", "tracking.client_series=true"]
    res = invoke("run", cfg_file, *over, f"tracking.uri=sqlite:///{db}", "--out", out, "-q")
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.metrics["mean_accuracy"] == pytest.approx(100 * summary["mean_accuracy"])
    first = summary["clients"][0]
    series = client.get_metric_history(run.info.run_id, "accuracy/client_000")
    assert len(series) == 3 and series[-1].value == pytest.approx(100 * first["accuracy"])
    assert (
        f"mean accuracy {100 * summary['mean_accuracy']:.2f} %"
        in (run.data.tags["mlflow.note.content"])
    )


def test_resolved_config_reproduces_the_run(tmp_path, cfg_file):
    a, b = tmp_path / "a", tmp_path / "b"
    assert invoke("run", cfg_file, *QUAD, "--out", a, "-q", "--no-tracking").exit_code == 0
    res = invoke("run", a / "config.yaml", "--out", b, "-q", "--no-tracking")
    assert res.exit_code == 0, res.output
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    assert sa["mean_loss"] == sb["mean_loss"]
    assert sa["collaboration"] == sb["collaboration"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nope.yaml"], "nope.yaml"),
        (["{cfg}", "algorithm.name=sgd"], "algorithm.name"),
        (["{cfg}", "data.name=imagenet"], "data.name"),
        (["{cfg}", "algorithm.rho=-2"], "algorithm.rho"),
        (["{cfg}", "algorithm.lr=fast"], "algorithm.lr"),
        (["{cfg}", "model.name=gpt9", "data.name=digits"], "model.name"),
        (["{cfg}", "algorithm.unknown=1"], "algorithm.unknown"),
        (["{broken}"], "broken.yaml"),
    ],
)
def test_bad_input_is_one_line_naming_the_problem(tmp_path, cfg_file, args, needle):
    broken = tmp_path / "broken.yaml"
    broken.write_text("rounds: [\n")
    argv = [a.format(cfg=cfg_file, broken=broken) for a in args]
    res = invoke("run", *argv, "--out", tmp_path / "o", "-q", "--no-tracking")
    assert res.exit_code == 2, res.output  # bad input: 2, not a crash's 1
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error:") and needle in err
    assert "Traceback" not in res.output


def test_a_failing_run_keeps_what_it_measured(tmp_path, cfg_file):
    """A diverging run (lr far too large) fails midway with exit 1, keeps config.yaml,
    the metrics so far and a summary saying where it stopped."""
    out = tmp_path / "bad"
    res = invoke(
        "run",
        cfg_file,
        *QUAD,
        "algorithm.lr=50",
        "data.curvature=[1,1]",
        "rounds=400",
        "--out",
        out,
        "-q",
        "--no-tracking",
    )
    assert res.exit_code == 1
    # the error in one line; before it, the warning that named the divergence on its
    # way to non-finite values (once, with the round)
    *before, last = res.stderr.strip().splitlines()
    assert str(out) in last and len(before) <= 1
    assert all(x.startswith("warning: the run is diverging: ") for x in before)
    assert (out / "config.yaml").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["last_round"] > 0
    assert len((out / "metrics.csv").read_text().splitlines()) > 1


def test_unreachable_tracking_store_warns_once_and_continues(tmp_path, cfg_file):
    out = tmp_path / "r"
    res = invoke(
        "run",
        cfg_file,
        *QUAD,
        "tracking.uri=http://127.0.0.1:9",
        "--out",
        out,
        "-q",
    )
    assert res.exit_code == 0, res.output
    assert res.stderr.count("warning: MLflow tracking disabled") == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mlflow_run_id"] is None and summary["status"] == "completed"


def test_compare_writes_a_table(tmp_path, cfg_file):
    out = tmp_path / "cmp"
    res = invoke(
        "compare",
        cfg_file,
        *QUAD,
        "--algorithms",
        "local,cobo,oracle",
        "--out",
        out,
        "-q",
        "--no-tracking",
    )
    assert res.exit_code == 0, res.output
    rows = json.loads((out / "comparison.json").read_text())
    assert [r["algorithm"] for r in rows] == ["local", "cobo", "oracle"]
    for r in rows:
        s = json.loads((out / r["algorithm"] / "summary.json").read_text())
        assert r["mean_loss"] == s["mean_loss"]
    assert (out / "plots" / "curves.png").is_file()
    assert "| cobo |" in (out / "comparison.md").read_text()


def test_entry_point_help_and_error_exit_code(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "raycobo.cli", "run", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: config file not found: {tmp_path}/missing.yaml"
    ]
    res = subprocess.run(
        [sys.executable, "-m", "raycobo.cli", "--help"], capture_output=True, text=True
    )
    assert res.returncode == 0 and "compare" in res.stdout


def test_an_interrupt_exits_130_and_says_where(tmp_path, cfg_file, monkeypatch):
    import raycobo.api as ex

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ex, "run_experiment", interrupted)
    res = invoke("run", cfg_file, *QUAD, "--out", tmp_path / "o", "-q", "--no-tracking")
    assert res.exit_code == 130
    assert res.stderr.strip().splitlines() == [
        "error: interrupted; partial results and checkpoints were kept in the run directory"
    ]


def test_a_run_into_a_log_file_shows_each_evaluation(tmp_path, cfg_file):
    """Output not a terminal (a batch job's log): one plain line per evaluation, and the
    run's summary names the command it came from."""
    out = tmp_path / "r"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "raycobo",
            "run",
            str(cfg_file),
            *QUAD,
            "--out",
            str(out),
            "--no-tracking",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stderr.splitlines() if ": round " in x]
    assert [x.split("round ")[1].split()[0] for x in lines] == ["10/30", "20/30", "30/30"]
    assert all("loss" in x and x.rstrip().endswith("s)") for x in lines)
    prov = json.loads((out / "summary.json").read_text())["provenance"]
    assert prov["command"].startswith("raycobo run ") and "--no-tracking" in prov["command"]


def test_mlflow_params_are_the_settings_the_run_reads():
    """(#71 item 3) A CoBo run on digits logged ~100 params, the quadratic task's dim,
    noise and curvature, partition.alpha on a label permutation, the LoRA keys on an MLP
    and the Ray keys on a local run among them; now only what its data set, partition,
    model, method and engine read (config.yaml keeps the rest)."""
    from raycobo.config import load_config
    from raycobo.tracking.mlflow_tracker import MLflowTracker

    def params(*over: str) -> dict[str, str]:
        cfg = load_config(None, list(over))
        return MLflowTracker(cfg.tracking)._params(cfg)

    digits = params("data.name=digits")
    for unread in (
        "data.dim",
        "data.noise",
        "data.curvature",
        "data.partition.alpha",
        "data.languages",
        "model.lora_rank",
        "model.norm",
        "engine.staleness",
        "engine.clients_per_actor",
        "engine.address",
        "compare.algorithms",
    ):
        assert unread not in digits, unread
    for read in (
        "data.fraction",
        "data.test_fraction",
        "data.partition.clients_per_cluster",
        "model.hidden",
        "engine.device",
        "algorithm.rho",
        "rounds",
        "seed",
    ):
        assert read in digits, read
    quad = params("data.name=quadratic")
    assert {"data.dim", "data.noise", "data.curvature"} <= set(quad)
    assert "data.fraction" not in quad and not any(k.startswith("model.") for k in quad)
    dirichlet = params(
        "data.name=digits", "data.partition.kind=dirichlet", "data.partition.num_clients=6"
    )
    assert "data.partition.alpha" in dirichlet and "data.partition.num_clusters" not in dirichlet
    ray = params("data.name=digits", "engine.kind=ray")
    assert {"engine.clients_per_actor", "engine.rounds", "engine.connect_timeout_s"} <= set(ray)


def test_every_run_reports_the_data_its_clients_got(tmp_path, cfg_file):
    """(#71 item 2) A Dirichlet partition of a small fraction gave clients a handful of
    test images and nothing said so. The data report (clients, counts and classes per
    client) is printed, in summary.json, in the comparison's report with the label mix,
    and in MLflow; a client with under 20 test samples and a data.fraction that means
    the whole set's share are said."""
    from mlflow.tracking import MlflowClient

    db = tmp_path / "store.db"
    over = [
        "data.name=digits",
        "data.fraction=0.1",
        "data.partition.kind=dirichlet",
        "data.partition.num_clients=6",
        "rounds=2",
        "eval_every=1",
        f"tracking.uri=sqlite:///{db}",
    ]
    res = invoke("compare", cfg_file, *over, "-a", "local", "--out", tmp_path / "c")
    assert res.exit_code == 0, res.output
    err = res.stderr
    assert "data: 6 clients; per client (min/median/max) train " in err
    assert "test samples (its accuracy moves in steps of" in err
    assert "under partition dirichlet, data.fraction = 0.1 is the share of the whole" in err
    summary = json.loads((tmp_path / "c" / "local" / "summary.json").read_text())
    data = summary["data"]
    assert data["clients"] == 6 and data["num_classes"] == 10 and data["test"]["min"] < 20
    per_client = [sum(row) for row in data["label_mix"]]  # training samples, every class
    assert len(per_client) == 6 and min(per_client) == data["train"]["min"]
    page = (tmp_path / "c" / "report.html").read_text()
    assert "<h2>Data</h2>" in page and "6 clients" in page
    assert (tmp_path / "c" / "plots" / "label_mix.png").is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    arts = {a.path for a in client.list_artifacts(summary["mlflow_run_id"])}
    assert "data_report.json" in arts


def test_help_config_lists_a_sections_keys():
    res = invoke("run", "--help-config", "data")
    assert res.exit_code == 0, res.output
    assert "data.fraction" in res.output and "data.partition.alpha" in res.output
    assert "dirichlet: the concentration" in res.output
    eng = invoke("run", "--help-config", "engine")
    assert eng.exit_code == 0 and "engine.staleness" in eng.output
