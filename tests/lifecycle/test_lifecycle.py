"""The run's life cycle: checkpoints, resume, statuses, one writer, the failure path."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from raycobo.config import ConfigError, with_overrides
from raycobo.lifecycle import checkpoint as ckpt
from raycobo.lifecycle.callbacks import BaseCallback
from raycobo.lifecycle.experiment import RunFailed, resume_config, run_experiment
from tests.helpers import StopAt, assert_trees_equal, final_state, method_cases, short_run

REPO = Path(__file__).resolve().parents[2]


def _digits(digits_cfg, name: str):
    # CoBo's sampled pairs change from round to round (no full sampling)
    extra = {**short_run(name, skip=("sampling",)), "rounds": 6, "eval_every": 2}
    return with_overrides(digits_cfg(), extra)


@pytest.mark.parametrize("name", method_cases())
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, digits_cfg, name):
    cfg = _digits(digits_cfg, name)
    whole = run_experiment(cfg, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "cut", [StopAt(3, KeyboardInterrupt())])
    cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert cut["status"] == "interrupted" and cut["last_round"] == 3
    assert cut["checkpoint"].endswith("round_000002.pt")
    again = run_experiment(resume_config(tmp_path / "cut"), tmp_path / "cut", resume=True)
    assert again.summary["resumed_from_round"] == 2
    assert_trees_equal(final_state(tmp_path / "whole"), final_state(tmp_path / "cut"))
    for key in ("mean_loss", "mean_accuracy", "clients", "collaboration", "megabytes_sent"):
        assert again.summary[key] == whole.summary[key], key
    strip = lambda h: [{k: v for k, v in r.items() if k != "wall"} for r in h]  # noqa: E731
    assert strip(again.summary["history"]) == strip(whole.summary["history"])
    for name_ in ("metrics.csv", "rounds.csv"):
        assert (tmp_path / "cut" / name_).read_text() == (tmp_path / "whole" / name_).read_text()


def test_resume_extends_a_finished_run(tmp_path, quad_cfg):
    # constant sampling at its own rate: the default (mixed) switches at a share of
    # `rounds`, and sampling_samples scales the rates by the run's length, so a run
    # extended to more rounds follows another schedule than a straight run of that length
    own = ("algorithm.sampling=constant", "algorithm.sampling_samples=0")
    cfg = quad_cfg("rounds=10", "eval_every=5", *own)
    run_experiment(cfg, tmp_path / "a")
    longer = run_experiment(
        resume_config(tmp_path / "a", ["rounds=20"]), tmp_path / "a", resume=True
    )
    straight = run_experiment(quad_cfg("rounds=20", "eval_every=5", *own), tmp_path / "b")
    assert longer.summary["resumed_from_round"] == 10 and longer.summary["rounds"] == 20
    # the constant sampler does not depend on the total: the same numbers as 20 rounds
    assert longer.summary["collaboration"] == straight.summary["collaboration"]
    assert longer.summary["mean_loss"] == straight.summary["mean_loss"]


def test_resume_refuses_other_overrides_and_finished_runs(tmp_path, quad_cfg):
    run_experiment(quad_cfg("rounds=4"), tmp_path / "a")
    with pytest.raises(ConfigError, match="cannot override 'algorithm.rho'"):
        resume_config(tmp_path / "a", ["algorithm.rho=1"])
    with pytest.raises(ConfigError, match="holds a finished run of 4 rounds"):
        run_experiment(resume_config(tmp_path / "a"), tmp_path / "a", resume=True)
    with pytest.raises(ConfigError, match="already holds a finished run"):
        run_experiment(quad_cfg("rounds=4"), tmp_path / "a")
    # (#39 item 14) without checkpoints there is nothing to extend: said so, not "finished"
    run_experiment(quad_cfg("rounds=4", "checkpoint.every=0"), tmp_path / "n")
    with pytest.raises(ConfigError, match="finished run of 4 rounds but no checkpoint"):
        run_experiment(resume_config(tmp_path / "n", ["rounds=8"]), tmp_path / "n", resume=True)
    with pytest.raises(ConfigError, match="no config.yaml"):
        resume_config(tmp_path / "nothing")


def test_rerun_into_a_failed_run_points_to_resume(tmp_path, quad_cfg):
    cfg = quad_cfg("rounds=10", "eval_every=2")
    with pytest.raises(RunFailed):
        run_experiment(cfg, tmp_path / "a", [StopAt(5, RuntimeError("boom"))])
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["status"] == "failed" and "boom" in s["error"] and s["last_round"] == 5
    with pytest.raises(ConfigError, match=r"holds a failed run at round 5; .*--resume"):
        run_experiment(cfg, tmp_path / "a")
    res = run_experiment(resume_config(tmp_path / "a"), tmp_path / "a", resume=True)
    assert res.summary["status"] == "completed" and res.summary["resumed_from_round"] == 4


def test_checkpoint_schedule_and_keep(tmp_path, quad_cfg):
    run_experiment(quad_cfg("rounds=9", "checkpoint.every=2", "checkpoint.keep=3"), tmp_path / "a")
    rounds = [r for r, _ in ckpt.list_checkpoints(tmp_path / "a" / "checkpoints")]
    assert rounds == [6, 8, 9]  # every 2nd round, the last one, the newest 3 kept
    run_experiment(quad_cfg("rounds=9", "checkpoint.every=0"), tmp_path / "b")
    assert ckpt.list_checkpoints(tmp_path / "b" / "checkpoints") == []
    # only plain data inside: readable with weights_only=True
    data = torch.load(tmp_path / "a" / "checkpoints" / "round_000009.pt", weights_only=True)
    assert data["round"] == 9 and data["algo_state"]["__dataclass__"] == "CoBoState"


def test_two_writers_on_one_directory(tmp_path, quad_cfg):
    from raycobo.lifecycle.run_dir import RunDir, RunDirBusy

    cfg = quad_cfg("rounds=4")
    first = RunDir(tmp_path / "a", cfg)
    first.open(resume=False)
    try:
        with pytest.raises(
            RunDirBusy, match=rf"in use by another raycobo process \(pid {os.getpid()}\)"
        ):
            run_experiment(cfg, tmp_path / "a")
    finally:
        first.close()
    # the directory is free again, and holds a run that never finished
    with pytest.raises(ConfigError, match="holds a running run"):
        run_experiment(cfg, tmp_path / "a")


def test_full_disk_in_the_failure_path(tmp_path, quad_cfg, monkeypatch):
    """The disk fills mid-run: the CSV write fails, the full summary does not fit, the
    minimal one does; nothing in the failure path raises a second error."""
    import raycobo.lifecycle.run_dir as rd

    cfg = quad_cfg("rounds=10", "eval_every=2")
    real_write = rd.atomic_write_text
    state = {"full": False}

    def write(path, text):
        if state["full"] and '"history"' in text:  # the minimal summary fits, the full not
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, text)

    class FillDisk(BaseCallback):
        def on_round_end(self, ctx, round, stats):
            if round == 5:
                state["full"] = True
                raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rd, "atomic_write_text", write)
    with pytest.raises(RunFailed, match="No space left"):
        run_experiment(cfg, tmp_path / "a", [FillDisk()])
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["status"] == "failed" and s["last_round"] == 5 and "history" not in s
    assert s["checkpoint"].endswith("round_000004.pt")


def test_run_and_variant_names_cannot_leave_the_output_root(quad_cfg):
    with pytest.raises(ConfigError, match="invalid config key 'name'"):
        quad_cfg("name=../../../x")
    with pytest.raises(ConfigError, match="compare.variants"):
        quad_cfg("compare.variants={'../up': {'algorithm.rho': 0.1}}")


def _cli(*args, cwd):
    """The CLI as a terminal starts it: SIGINT at its default even where pytest itself
    runs in a background job (which inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "raycobo.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_a_run_interrupted_and_resume_finishes_it(tmp_path, sig):
    """A real process: the signal after a checkpoint, exit 130, status interrupted with
    CSVs consistent with last_round; --resume then gives the uninterrupted numbers."""
    args = [
        str(REPO / "examples" / "quickstart.yaml"),
        "data.name=quadratic",
        "rounds=4000",
        "eval_every=50",
        "--no-tracking",
        "-q",
    ]
    proc = _cli("run", *args, "--out", "cut", cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not ckpt.list_checkpoints(tmp_path / "cut" / "checkpoints"):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    # the one line names the run directory and the command that continues it
    assert f"continue with: raycobo run --resume {tmp_path / 'cut'}" in err, err
    s = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["error"] == sig.name
    last = s["last_round"]
    rounds = (tmp_path / "cut" / "rounds.csv").read_text().splitlines()
    assert int(rounds[-1].split(",")[0]) == last and len(rounds) == last + 1
    if last < 4000:
        resumed = _cli("run", "--resume", "cut", "--no-tracking", "-q", cwd=tmp_path)
        out, err = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, err
        assert "resumed from round" in out
    whole = _cli("run", *args, "--out", "whole", cwd=tmp_path)
    whole.communicate(timeout=120)
    a = json.loads((tmp_path / "cut" / "summary.json").read_text())
    b = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert a["status"] == b["status"] == "completed"
    assert a["mean_loss"] == b["mean_loss"] and a["collaboration"] == b["collaboration"]
    assert np.array_equal(
        np.load(tmp_path / "cut" / "collaboration.npy"),
        np.load(tmp_path / "whole" / "collaboration.npy"),
    )


def test_a_run_that_failed_before_its_first_round_can_be_run_again(tmp_path, quad_cfg):
    """A setting refused while the run starts (here CoBo's stability bound) leaves a
    failed directory with nothing measured: fixing the setting and running into the same
    --out starts anew instead of pointing to --resume."""
    bad = quad_cfg(
        "data.partition.clients_per_cluster=20", "algorithm.preset=paper", "algorithm.rho=0.3"
    )
    with pytest.raises(ConfigError, match="algorithm.rho"):
        run_experiment(bad, tmp_path / "a")
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["status"] == "failed" and s["last_round"] == 0
    ok = quad_cfg("data.partition.clients_per_cluster=20", "rounds=4")
    assert run_experiment(ok, tmp_path / "a").summary["status"] == "completed"


def test_a_resume_that_fails_while_starting_keeps_what_the_directory_holds(
    tmp_path, quad_cfg, monkeypatch
):
    """Seen on the GPU machine: a resumed run whose data could not be loaded rewrote the
    summary of a run interrupted at round 150 as 'failed at round 0' with no history.
    The directory still holds its checkpoint: the summary says so."""
    import raycobo.lifecycle.experiment as ex

    cfg = quad_cfg("rounds=10", "eval_every=2")
    with pytest.raises(RunFailed):
        run_experiment(cfg, tmp_path / "a", [StopAt(5, RuntimeError("boom"))])

    def gone(_cfg):
        raise RuntimeError("data gone")

    monkeypatch.setattr(ex, "open_session", gone)
    with pytest.raises(RunFailed):
        run_experiment(resume_config(tmp_path / "a"), tmp_path / "a", resume=True)
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["status"] == "failed" and "data gone" in s["error"]
    assert s["last_round"] == 4 and s["checkpoint"].endswith("round_000004.pt")
    assert [h["round"] for h in s["history"]] == [0, 2, 4]
    monkeypatch.undo()
    res = run_experiment(resume_config(tmp_path / "a"), tmp_path / "a", resume=True)
    assert res.summary["status"] == "completed" and res.summary["resumed_from_round"] == 4


def test_errors_that_cross_ray_processes_survive_pickling():
    """Seen in a sweep: a diverging trial's RunFailed, re-raised in the driver, failed to
    unpickle ('missing 1 required positional argument'), hiding the divergence."""
    import pickle

    from raycobo.engine.ray.errors import HostsLost

    err = pickle.loads(pickle.dumps(RunFailed(Path("r/x"), "FloatingPointError at round 3", 3)))
    assert (err.run_dir, err.reason, err.last_round) == (
        Path("r/x"),
        "FloatingPointError at round 3",
        3,
    )
    assert "FloatingPointError at round 3" in str(err)
    lost = pickle.loads(pickle.dumps(HostsLost([2, 3])))
    assert lost.clients == [2, 3] and "clients [2, 3]" in str(lost)


def test_a_running_summary_without_its_writer_reads_interrupted(tmp_path, quad_cfg):
    """(#39 item 14) A process killed before its last status (a sweep's trials after
    SIGINT) left `running` with a dead pid: with nobody holding the directory's lock it
    reads `interrupted`, and resumes; while its writer lives it reads `running`."""
    import json

    from raycobo.lifecycle.run_dir import RunDir, read_summary

    cfg = quad_cfg("rounds=4")
    writer = RunDir(tmp_path / "r", cfg)
    writer.open(False)
    try:
        assert read_summary(tmp_path / "r")["status"] == "running"
    finally:
        writer.close()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    (tmp_path / "r" / "summary.json").write_text(json.dumps({**summary, "status": "running"}))
    seen = read_summary(tmp_path / "r")
    assert seen["status"] == "interrupted" and seen["stale_running"]
    done = run_experiment(resume_config(tmp_path / "r"), tmp_path / "r", resume=True)
    assert done.summary["status"] == "completed"


def test_the_plotting_modules_are_loaded_before_the_first_round(tmp_path):
    """(#39 item 5) SIGTERM while the plots were written ended 1 run in ~26 `failed`
    (ImportError: initialization failed, from inside matplotlib's C extensions): they are
    imported before the rounds start, so a signal at the end meets plain Python."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from raycobo.config import load_config\n"
        "from raycobo.lifecycle.experiment import run_experiment\n"
        "class P:\n"
        "    def start(self, total, done=0):\n"
        "        assert 'matplotlib.pyplot' in sys.modules, 'not loaded before the rounds'\n"
        "    def advance(self, stats, row): pass\n"
        "    def stop(self): pass\n"
        "assert 'matplotlib' not in sys.modules\n"
        f"run_experiment(load_config(None, ['rounds=2', 'tracking.enabled=false']), "
        f"{str(tmp_path / 'r')!r}, progress=P())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_provenance_names_the_version_without_the_package_init(monkeypatch):
    """A checkout synced beside a script on a cluster node imports raycobo as a namespace
    package (its __init__ never runs): the version comes from the installed metadata."""
    from importlib.metadata import version

    import raycobo
    from raycobo.lifecycle.provenance import raycobo_version

    assert raycobo_version() == raycobo.__version__
    monkeypatch.delattr(raycobo, "__version__")
    assert raycobo_version() == version("raycobo")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_a_checkpoint_write_is_delivered_after_it(tmp_path, sig):
    """A SIGTERM landing inside ``torch.save`` came out of torch's C++ writer as
    ``RuntimeError: [enforce fail at inline_container.cc]`` and ended the run `failed`:
    interrupts are postponed to the end of an atomic write, which completes."""
    from raycobo.lifecycle.experiment import Terminated
    from raycobo.lifecycle.files import atomic_write

    class Writes:  # a file object that is signalled in the middle of torch's writing
        def __init__(self, f):
            self.f, self.sent = f, False

        def write(self, b):
            if not self.sent:
                self.sent = True
                os.kill(os.getpid(), sig)
                time.sleep(0.05)  # the handler would run here, inside the C++ writer
            return self.f.write(b)

        def flush(self):
            self.f.flush()

    def on_term(signum, frame):
        raise Terminated("SIGTERM")

    # the handlers a run has (an earlier test in the session may have left others)
    previous = signal.signal(signal.SIGTERM, on_term)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    path, state = tmp_path / "c.pt", {"x": torch.arange(100_000.0)}
    try:
        with pytest.raises(KeyboardInterrupt) as err:
            atomic_write(path, lambda f: torch.save(state, Writes(f)), True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    assert isinstance(err.value, Terminated) == (sig == signal.SIGTERM)
    assert torch.equal(torch.load(path)["x"], state["x"])  # written whole, then delivered
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_a_statistic_that_starts_later_widens_the_rounds_file(tmp_path):
    """rounds.csv takes its columns from the first round; a statistic first reported
    later (a stale round's loss of the updates it applied, none in the first rounds) is
    added as a column, the earlier rows blank there, instead of dropped. A resumed file
    keeps the widened header."""
    import csv

    from raycobo.lifecycle.run_dir import _CsvLog

    path = tmp_path / "rounds.csv"
    log = _CsvLog(path, None, None)
    log.write([{"round": 0, "bytes_sent": 8.0}])
    log.write([{"round": 1, "train_loss": 0.5, "bytes_sent": 8.0}])
    log.write([{"round": 2, "train_loss": 0.25, "bytes_sent": 8.0}])
    log.close()
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["round", "bytes_sent", "train_loss"]
    assert [r["train_loss"] for r in rows] == ["", "0.5", "0.25"]
    again = _CsvLog(path, None, 1)  # resume after round 1
    again.write([{"round": 2, "train_loss": 0.125, "bytes_sent": 8.0}])
    again.close()
    rows = list(csv.DictReader(path.open()))
    assert [r["train_loss"] for r in rows] == ["", "0.5", "0.125"]


class _StopAtEval(BaseCallback):
    """Ends the run at the evaluation of ``round``, as a sweep's scheduler would."""

    def __init__(self, round: int):
        self.round, self.ended = round, None

    def on_eval(self, ctx, round, metrics):
        from raycobo.lifecycle.callbacks import StopRun

        if round == self.round:
            raise StopRun("asha")

    def on_run_end(self, ctx, summary):
        self.ended = summary


def test_a_callback_that_stops_the_run_ends_it_stopped_with_its_last_metrics(tmp_path, quad_cfg):
    """StopRun from on_eval: no exception reaches the caller, summary.json says stopped,
    by whom, at which round, with that evaluation's metrics and the checkpoint written
    there; the callbacks hear the same; the CSVs stop at that round; a resume finishes
    the run with the numbers of one never stopped."""
    cfg = quad_cfg("rounds=20", "eval_every=5")
    whole = run_experiment(cfg, tmp_path / "whole")
    stop = _StopAtEval(10)
    res = run_experiment(cfg, tmp_path / "cut", [stop])
    s = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert res.summary["status"] == s["status"] == "stopped" and s["stopped_by"] == "asha"
    assert s["last_round"] == 10 and s["checkpoint"].endswith("round_000010.pt")
    assert s["resumed_from_round"] is None
    ten = next(h for h in whole.summary["history"] if h["round"] == 10)
    assert s["mean_loss"] == ten["mean_loss"]
    assert [h["round"] for h in s["history"]] == [0, 5, 10]
    assert stop.ended["status"] == "stopped" and stop.ended["last_round"] == 10
    rows = (tmp_path / "cut" / "metrics.csv").read_text().splitlines()[1:]
    assert {int(r.split(",")[0]) for r in rows} == {0, 5, 10}
    # a resumed run stopped again says where it resumed (a sweep's retried trial)
    later = run_experiment(
        resume_config(tmp_path / "cut"), tmp_path / "cut", [_StopAtEval(15)], resume=True
    )
    s = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert later.summary["status"] == s["status"] == "stopped" and s["resumed_from_round"] == 10
    again = run_experiment(resume_config(tmp_path / "cut"), tmp_path / "cut", resume=True)
    assert again.summary["status"] == "completed" and again.summary["resumed_from_round"] == 15
    assert again.summary["mean_loss"] == whole.summary["mean_loss"]
    from raycobo.tracking.mlflow_tracker import mlflow_status

    assert mlflow_status(s) == "FINISHED"


def test_a_run_started_from_another_runs_checkpoint_continues_its_state(tmp_path, quad_cfg):
    """``start_from`` (how PBT continues a better trial): a new run directory whose
    first round is the checkpoint's, with the checkpoint's models, W and history. Under
    the same settings it ends bit for bit where the donor ends; under a perturbed step
    size it goes on from the donor's state (its history up to the checkpoint is the
    donor's) to other numbers; its summary names the checkpoint."""
    own = ("algorithm.sampling=constant", "algorithm.sampling_samples=0")
    cfg = quad_cfg("rounds=20", "eval_every=5", "checkpoint.keep=10", *own)
    donor = run_experiment(cfg, tmp_path / "donor")
    at10 = tmp_path / "donor" / "checkpoints" / "round_000010.pt"
    same = run_experiment(cfg, tmp_path / "same", start_from=at10)
    assert same.summary["started_from"] == str(at10)
    assert same.summary["mean_loss"] == donor.summary["mean_loss"]
    assert same.summary["collaboration"] == donor.summary["collaboration"]
    assert_trees_equal(final_state(tmp_path / "donor"), final_state(tmp_path / "same"))
    other = run_experiment(
        with_overrides(cfg, {"algorithm.lr": 0.05}), tmp_path / "o", start_from=at10
    )
    assert other.summary["status"] == "completed" and other.summary["last_round"] == 20
    head = lambda h: [(r["round"], r["mean_loss"]) for r in h if r["round"] <= 10]  # noqa: E731
    assert head(other.summary["history"]) == head(donor.summary["history"])
    assert other.summary["mean_loss"] != donor.summary["mean_loss"]
    with pytest.raises(ConfigError, match="either resumes"):
        run_experiment(cfg, tmp_path / "o", resume=True, start_from=at10)
