"""Runs that survive, part 2: the fault and bad-input cases of the issue, each as it was
found (a hand-edited config, a corrupt checkpoint, a full disk, SIGTERM at the wrong
moment, broken files, concurrent first use of an MLflow store, ...)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raycobo.cli import app
from raycobo.config import ConfigError, load_config
from raycobo.lifecycle import RunFailed, Terminated, resume_config, run_experiment
from raycobo.lifecycle import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[2]
QUAD = [
    "data.name=quadratic",
    "data.partition.clients_per_cluster=[2,3]",
    "rounds=20",
    "eval_every=5",
    "algorithm.sampling=full",
    "tracking.enabled=false",
]


def quad(*extra: str):
    return load_config(None, [*QUAD, *extra])


def cli(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


# 1 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "old", "new"), [("seed", "0", "7"), ("lr", "0.1", "0.5")])
def test_a_hand_edited_config_is_not_resumed(tmp_path, key, old, new):
    run_experiment(quad(), tmp_path / "r")
    path = tmp_path / "r" / "config.yaml"
    text = path.read_text()
    edited = text.replace(f"seed: {old}\n", f"seed: {new}\n", 1)
    if key == "lr":
        edited = text.replace(f"  lr: {old}\n", f"  lr: {new}\n", 1)
    assert edited != text
    path.write_text(edited)
    res = cli("run", "--resume", tmp_path / "r", "rounds=40", "-q")
    assert res.exit_code == 2
    dotted = "seed" if key == "seed" else "algorithm.lr"
    assert f"({dotted} changed)" in one_line(res)
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "completed"


# 5 ------------------------------------------------------------------------------------------
def test_an_unreachable_cluster_stops_within_the_connect_timeout(tmp_path):
    t0 = time.monotonic()
    res = cli(
        "run",
        REPO / "examples" / "quickstart.yaml",
        *QUAD,
        "engine.kind=ray",
        "engine.address=127.0.0.1:1",
        "engine.connect_timeout_s=2",
        "--out",
        tmp_path / "r",
        "-q",
    )
    assert res.exit_code == 2 and time.monotonic() - t0 < 30
    line = one_line(res)
    assert "'engine.address': 127.0.0.1:1" in line and "connect_timeout_s=2" in line


# 7 ------------------------------------------------------------------------------------------
def test_sigterm_while_the_final_files_are_written(tmp_path, monkeypatch):
    """The end of a run is interruptible too: the summary says interrupted (never running
    after the process is gone), and --resume writes the final files."""
    import raycobo.plots as plots

    def terminated(*args, **kwargs):
        raise Terminated("SIGTERM")

    monkeypatch.setattr(plots, "write_run_plots", terminated)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(quad(), tmp_path / "r")
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["last_round"] == 20 and s["error"] == "SIGTERM"
    monkeypatch.undo()
    res = run_experiment(resume_config(tmp_path / "r"), tmp_path / "r", resume=True)
    assert res.summary["status"] == "completed" and res.summary["resumed_from_round"] == 20
    assert (tmp_path / "r" / "plots" / "curves.png").is_file()


# 8 ------------------------------------------------------------------------------------------
def test_a_corrupt_newest_checkpoint_falls_back_to_an_older_one(tmp_path, capfd):
    from tests.helpers import StopAt

    cfg = quad("checkpoint.keep=3")
    whole = run_experiment(cfg, tmp_path / "whole")
    with pytest.raises(RunFailed):
        run_experiment(cfg, tmp_path / "r", [StopAt(17, RuntimeError("crash"))])
    found = ckpt.list_checkpoints(tmp_path / "r" / "checkpoints")
    assert [r for r, _ in found] == [5, 10, 15]
    found[-1][1].write_bytes(found[-1][1].read_bytes()[:100])  # cut mid-write
    stale = tmp_path / "r" / "checkpoints" / f".round_000020.pt.{2**22 + 17}.tmp"
    stale.write_bytes(b"half")  # a killed write's temporary file
    res = run_experiment(resume_config(tmp_path / "r"), tmp_path / "r", resume=True)
    err = capfd.readouterr().err
    assert "round_000015.pt" in err and "trying an older checkpoint" in err
    assert res.summary["resumed_from_round"] == 10 and not stale.exists()
    for name in ("metrics.csv", "rounds.csv"):
        assert (tmp_path / "r" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert res.summary["history"] == whole.summary["history"]


# 9 ------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root only): a disk that really fills."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)])
    if done.returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path, leave: int) -> None:
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, shutil.disk_usage(disk).free - leave))


@pytest.mark.parametrize("leave", [0, 8 * 1024, 160 * 1024])
def test_a_full_disk_names_the_file_in_one_line(small_disk, leave):
    """The run fills the disk (metrics rows, checkpoints): one line that names the file
    and says 'no space left on device'; a summary whenever it still fits, and where none
    could be written (a disk full from the start), the line says so."""
    _fill(small_disk, leave)
    res = cli(
        "run",
        REPO / "examples" / "quickstart.yaml",
        *QUAD,
        "rounds=400",
        "data.partition.clients_per_cluster=[20,20]",
        "--out",
        small_disk / "r",
        "-q",
    )
    assert res.exit_code in (1, 2), res.output
    line = one_line(res)
    assert "no space left on device" in line and str(small_disk / "r") in line, line
    summary = small_disk / "r" / "summary.json"
    if summary.exists():
        assert json.loads(summary.read_text())["status"] == "failed"
    else:
        assert "no summary.json could be written" in line, line


def test_paths_that_cannot_be_a_run_directory_are_bad_input(tmp_path):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / ("n" * 300)):
        res = cli("run", REPO / "examples" / "quickstart.yaml", *QUAD, "--out", out, "-q")
        assert res.exit_code == 2 and "cannot write the run directory" in one_line(res)


def test_the_checkpoint_in_a_summary_is_absolute(tmp_path, monkeypatch):
    from tests.helpers import StopAt

    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunFailed):
        run_experiment(quad(), Path("rel"), [StopAt(7, RuntimeError("x"))])
    s = json.loads((tmp_path / "rel" / "summary.json").read_text())
    assert s["checkpoint"] == str(tmp_path / "rel" / "checkpoints" / "round_000005.pt")


# 10 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "not gzip"])
def test_damaged_fashion_mnist_files_are_named(tmp_path, damage):
    src = Path("/usr/share/datasets/fashion-mnist")
    root = tmp_path / "fm"
    root.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"):
        if (src / f"{name}.gz").is_file():
            shutil.copy(src / f"{name}.gz", root / f"{name}.gz")
        else:  # a tiny but valid file in the real format
            with gzip.open(root / f"{name}.gz", "wb") as f:
                f.write(bytes([0, 0, 8, 1]) + (4).to_bytes(4, "big") + bytes(4))
    bad = root / "t10k-labels-idx1-ubyte.gz"
    if damage == "truncated":
        with gzip.open(bad, "wb") as f:
            f.write(bytes([0, 0, 8, 1]) + (10000).to_bytes(4, "big") + bytes(9000))
        bad.write_bytes(bad.read_bytes()[:-20])
    else:
        bad.write_bytes(b"this is not gzip at all")
    res = cli(
        "run",
        REPO / "examples" / "quickstart.yaml",
        f"data.root={root}",
        "--out",
        tmp_path / "r",
        "-q",
        "--no-tracking",
    )
    assert res.exit_code == 2
    assert str(bad) in one_line(res)


# 11 -----------------------------------------------------------------------------------------
def test_a_bad_encoder_path_is_one_line(tmp_path):
    import pickle

    import torch

    from tests.helpers import DIGITS

    (tmp_path / "noise.pt").write_bytes(os.urandom(256))
    (tmp_path / "code.pt").write_bytes(pickle.dumps(Path("x")))
    torch.save({"state_dict": {}}, tmp_path / "nosizes.pt")
    for name, needle in [
        ("noise.pt", "cannot be read as a meta-L2C encoder"),
        ("code.pt", "cannot be read as a meta-L2C encoder"),
        ("nosizes.pt", "is not a meta-L2C encoder"),
    ]:
        cfg = load_config(
            None,
            [*DIGITS, "algorithm.name=meta_l2c", f"algorithm.encoder_path={tmp_path / name}"],
        )
        with pytest.raises(ConfigError, match=needle) as info:
            run_experiment(cfg, tmp_path / name.replace(".", "_"))
        assert "algorithm.encoder_path" in str(info.value) and "\n" not in str(info.value)


# 12 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", ".inf"])
def test_non_finite_numbers_are_bad_input(tmp_path, value):
    res = cli("run", REPO / "examples" / "quickstart.yaml", f"algorithm.lr={value}", "-q")
    assert res.exit_code == 2 and "'algorithm.lr'" in one_line(res)


# 13, 14, 16 ---------------------------------------------------------------------------------
def test_compare_refuses_a_typo_in_overrides_and_says_what_a_resume_takes(tmp_path):
    res = cli(
        "compare",
        REPO / "examples" / "quickstart.yaml",
        *QUAD,
        "compare.overrides={cobbo: {algorithm.lr: 0.2}}",
        "-a",
        "local,cobo",
        "--out",
        tmp_path / "c",
    )
    assert res.exit_code == 2 and "compare.overrides.cobbo" in one_line(res)
    res = cli("compare", "--resume", tmp_path / "c", "rounds=100")
    assert res.exit_code == 2
    assert "takes no overrides (got rounds=100)" in one_line(res)


def test_two_comparisons_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    from raycobo.comparison.plan import default_root

    monkeypatch.chdir(tmp_path)
    a, b = default_root(quad()), default_root(quad())
    assert a != b and a.is_dir() and b.is_dir() and b.name == f"{a.name}-2"


# 15 -----------------------------------------------------------------------------------------
def test_runs_started_at_once_on_a_new_mlflow_store_all_track(tmp_path):
    db = tmp_path / "mlruns.db"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "raycobo",
                "run",
                str(REPO / "examples" / "quickstart.yaml"),
                *[q for q in QUAD if not q.startswith("tracking.")],
                "rounds=5",
                f"tracking.uri=sqlite:///{db}",
                f"tracking.artifact_root={tmp_path / 'art'}",
                "--out",
                str(tmp_path / f"r{k}"),
                "-q",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "tracking disabled" not in err, err
    ids = [json.loads((tmp_path / f"r{k}" / "summary.json").read_text()) for k in range(3)]
    assert all(s["mlflow_run_id"] for s in ids) and len({s["mlflow_run_id"] for s in ids}) == 3


# 6 ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_to_a_ray_engine_run_is_an_interruption(tmp_path):
    """Ray's init installs its own SIGTERM handler (exit without a summary); the run puts
    its own back: exit 130, status interrupted, and --resume finishes the run."""
    args = [
        "run",
        str(REPO / "examples" / "quickstart.yaml"),
        *QUAD,
        "rounds=100000",
        "eval_every=20",
        "engine.kind=ray",
        "engine.num_cpus=2",
        "--out",
        str(tmp_path / "r"),
        "-q",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "raycobo", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:  # a failed check must not leave a 100,000-round run (and its Ray) behind
        deadline = time.monotonic() + 120
        while not ckpt.list_checkpoints(tmp_path / "r" / "checkpoints"):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err.decode()[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["error"] == "SIGTERM" and s["last_round"] > 0


def test_a_yaml_alias_bomb_is_refused_at_load(tmp_path):
    """A 'billion laughs' in data.options hung the process past 3 GB inside the config
    dump; it is refused at load with one line naming the file, and so is one in an
    override's value."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    body = "\n".join("    " + ln for ln in levels)
    bomb.write_text(f"name: bomb\ndata:\n  name: quadratic\n  options:\n{body}\n")
    t0 = time.perf_counter()
    res = cli("run", bomb, "--out", tmp_path / "run", "-q")
    assert res.exit_code == 2, res.output
    assert "bomb.yaml" in res.output and "expands to more than" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
    assert time.perf_counter() - t0 < 60  # it stops at once, without building the tree
    plain = tmp_path / "plain.yaml"
    plain.write_text("name: plain\ndata: {name: quadratic}\n")
    cyclic = cli("run", plain, "--out", tmp_path / "run2", "-q", "data.options=&c [*c]")
    assert cyclic.exit_code == 2, cyclic.output
    assert "expands to more than" in cyclic.output or "nested deeper than" in cyclic.output


def test_compare_refuses_duplicates_and_flags_a_resume_would_ignore(tmp_path):
    """`-a fedavg,local,fedavg` ran two entries and then failed on its own folder; a
    resumed comparison silently ignored --algorithms, --seeds, --out and --tune."""
    base = ("compare", REPO / "examples" / "quickstart.yaml", *QUAD, "--out", tmp_path / "c")
    res = cli(*base, "-a", "fedavg,local,fedavg")
    assert res.exit_code == 2 and "algorithm fedavg given twice" in one_line(res)
    assert not (tmp_path / "c" / "fedavg").exists()
    res = cli(*base, "-a", "local", "--seeds", "0,0")
    assert res.exit_code == 2 and "seed 0 given twice" in one_line(res)
    for flag in (["-a", "local"], ["--seeds", "1"], ["--out", str(tmp_path)], ["--tune", "x=y"]):
        res = cli("compare", "--resume", tmp_path / "c", *flag)
        assert res.exit_code == 2 and "drop " + flag[0].replace("-a", "--algorithms") in (
            one_line(res)
        ), res.output


def test_the_api_takes_a_method_name_as_a_string(tmp_path):
    import raycobo

    cmp = raycobo.compare(quad("rounds=4", "eval_every=2"), "local", out=tmp_path / "c")
    assert [r["algorithm"] for r in cmp.rows] == ["local"]
    with pytest.raises(ConfigError, match="seed 0 given twice"):
        raycobo.compare(quad("rounds=4"), ["local"], seeds=[0, 0], out=tmp_path / "d")


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("algorithm.gama=1", "algorithm.gamma"),
        ("data.fractoin=0.1", "data.fraction"),
        ("data.partition.kindd=shards", "data.partition.kind"),
        ("roundz=3", "rounds"),
    ],
)
def test_a_misspelled_key_gets_a_did_you_mean(key, hint):
    with pytest.raises(ConfigError, match=f"did you mean '{hint}'"):
        load_config(None, [key])


def _resume_in_subprocess(args: list[str]) -> subprocess.CompletedProcess:
    """A resume that must answer at once (a regression would block on the planted file:
    the subprocess's timeout ends the test instead of the suite's)."""
    import sys

    cmd = [sys.executable, "-m", "raycobo.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("plant", ["fifo", "link-to-dev-zero"])
def test_a_planted_special_file_in_a_run_directory_is_refused_not_read(tmp_path, quad_cfg, plant):
    """An interrupted run whose checkpoints/ holds a FIFO (or a link to /dev/zero) named
    like the newest checkpoint: `run --resume` refuses in one line naming it (exit 2)
    instead of blocking in (or reading without end from) it."""

    from raycobo.lifecycle.experiment import run_experiment
    from tests.helpers import StopAt

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(quad_cfg("rounds=20"), out, [StopAt(12, KeyboardInterrupt())])
    planted = out / "checkpoints" / "round_000099.pt"
    if plant == "fifo":
        os.mkfifo(planted)
    else:
        planted.symlink_to("/dev/zero")
    res = _resume_in_subprocess(["run", "--resume", str(out), "-q", "--no-tracking"])
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "round_000099.pt" in line and ("FIFO" in line or "symbolic link" in line)


def test_a_planted_fifo_in_a_sweep_directory_is_refused_even_when_trusted(tmp_path):
    """A FIFO among Tune's files passed the digest checks (they hash regular files) and
    blocked `sweep --resume` in open(); now it is refused in one line, with or without
    --trust-files."""

    root = tmp_path / "sw"
    (root / "tune").mkdir(parents=True)
    (root / "sweep.yaml").write_text("name: x\n")
    os.mkfifo(root / "tune" / "experiment_state-2099-01-01_00-00-00.json")
    for extra in ([], ["--trust-files"]):
        res = _resume_in_subprocess(["sweep", "--resume", str(root), *extra])
        assert res.returncode == 2, res.stderr
        assert "experiment_state-2099" in res.stderr and "FIFO" in res.stderr


def test_a_huge_rounds_holds_no_table_as_long_as_the_run(tmp_path, quad_cfg):
    """rounds=10**12 grew to 22 GB before its first round (a set of every checkpoint
    round; CoBo's sampling tables over all rounds): what a run holds follows the rounds
    it has reached. Three rounds of CoBo with its defaults, then an interrupt, within a
    small memory bound."""
    import tracemalloc

    from raycobo.lifecycle.experiment import run_experiment
    from tests.helpers import StopAt

    cfg = quad_cfg("rounds=1000000000000", "algorithm.name=cobo")
    assert 10**12 in cfg.checkpoint_rounds() and 10 in cfg.checkpoint_rounds()
    assert 11 not in cfg.checkpoint_rounds() and 0 not in cfg.checkpoint_rounds()
    tracemalloc.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_experiment(cfg, tmp_path / "big", [StopAt(3, KeyboardInterrupt())])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200e6, f"{peak / 1e6:.0f} MB"
    assert json.loads((tmp_path / "big" / "summary.json").read_text())["last_round"] == 3


@pytest.mark.parametrize("name", ["fedavg", "cobo"])
def test_a_run_whose_loss_explodes_is_named_diverging(tmp_path, digits_cfg, name, capsys):
    """lr=1000: FedAvg and CoBo ended `completed` at chance with a training loss 10^7
    times its start, since only non-finite values counted. The run is named diverging,
    once: a warning line with the round, and `diverged` in the summary; a sane run has
    none."""
    from raycobo.lifecycle.experiment import run_experiment

    over = [f"algorithm.name={name}", "rounds=6", "eval_every=3"]
    res = run_experiment(digits_cfg(*over, "algorithm.lr=1000"), tmp_path / "wild")
    d = res.summary["diverged"]
    err = capsys.readouterr().err
    assert res.summary["status"] == "completed"
    assert d is not None and 1 < d["round"] <= 6, res.summary["history"]
    assert d["train_loss"] > 1000 * max(d["first"], 1.0)
    assert err.count("the run is diverging") == 1 and f"at round {d['round']}" in err
    sane = run_experiment(digits_cfg(*over), tmp_path / "sane")
    assert sane.summary["diverged"] is None


def test_input_without_bounds_is_refused_before_it_is_parsed(tmp_path):
    """(#70 item 3) A 2 MB YAML file (a flow list of zeros), a 100 KB string in
    data.options (from a file, an override and the Python API) and a 50,000-deep nested
    list each end exit 2 in one line naming the file or the key, at once, with no run
    directory written."""
    import raycobo
    from raycobo.config import MAX_CONFIG_BYTES, MAX_VALUE_CHARS

    big = tmp_path / "big.yaml"
    zeros = "0, " * 700_000
    big.write_text("name: big\ndata: {name: quadratic, options: {xs: [" + zeros + "0]}}\n")
    assert big.stat().st_size > MAX_CONFIG_BYTES
    long_value = "x" * (MAX_VALUE_CHARS + 1)
    long = tmp_path / "long.yaml"
    long.write_text(f"name: long\ndata: {{name: quadratic, options: {{s: {long_value}}}}}\n")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: deep\ndata: {options: {x: " + "[" * 50_000 + "]" * 50_000 + "}}\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text("name: plain\ndata: {name: quadratic}\n")
    cases = [
        ((big,), "big.yaml", "a config file is at most 1 MiB"),
        ((long,), "'data.options.s' in", "at most 65,536"),
        ((deep,), "deep.yaml", "nested deeper than"),
        ((plain, f"data.options={{s: {long_value}}}"), "data.options", "at most 65,536"),
        ((plain, "data.options=" + "[" * 10_000 + "]" * 10_000), "override", "nested deeper"),
    ]
    t0 = time.perf_counter()
    for i, (args, where, what) in enumerate(cases):
        out = tmp_path / f"run{i}"
        res = cli("run", *args, "--out", out, "-q")
        assert res.exit_code == 2, res.output
        line = one_line(res)
        assert where in line and what in line, line
        assert not out.exists()
    assert time.perf_counter() - t0 < 120  # none of them is parsed or copied in full
    with pytest.raises(ConfigError, match=r"'data.options.s' in the config: a value of"):
        raycobo.load({"data": {"name": "quadratic", "options": {"s": long_value}}})


def test_out_into_a_folder_of_the_users_own_files_is_refused(tmp_path):
    """(#70 item 5) `--out` into a folder holding the user's own rounds.csv overwrote it;
    one holding their config.yaml was called an unfinished run and left with a .lock.
    Both are refused in one line with nothing written; so is a new comparison into a
    folder that is not empty. An empty folder is a run directory like a new one."""
    plain = tmp_path / "plain.yaml"
    plain.write_text("name: plain\ndata: {name: quadratic}\nrounds: 2\neval_every: 1\n")
    for name in ("rounds.csv", "config.yaml"):
        mine = tmp_path / f"mine_{name}"
        mine.mkdir()
        (mine / name).write_text("my own file\n")
        res = cli("run", plain, "--out", mine, "-q", "--no-tracking")
        assert res.exit_code == 2, res.output
        line = one_line(res)
        assert "is not empty and holds no raycobo run" in line and name in line, line
        assert sorted(p.name for p in mine.iterdir()) == [name]
        assert (mine / name).read_text() == "my own file\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("run", plain, "--out", empty, "-q", "--no-tracking").exit_code == 0
    again = cli("run", plain, "--out", empty, "-q", "--no-tracking")
    assert again.exit_code == 2 and "already holds a finished run" in one_line(again)
    comp = cli("compare", plain, "-a", "local", "--out", empty, "-q", "--no-tracking")
    assert comp.exit_code == 2, comp.output
    assert "compare: --out" in one_line(comp) and "is not empty" in one_line(comp)


def test_sigterm_inside_an_import_at_the_end_is_an_interruption(tmp_path, monkeypatch):
    """(#70 item 5) SIGTERM landing while matplotlib initialised a C extension for the
    plots ended a run `failed` with `ImportError: initialization failed`: whatever breaks
    once SIGTERM has arrived is the interruption, and --resume writes the final files."""
    import raycobo.plots as plots

    def import_interrupted(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Terminated:  # what a C extension's init turns the handler's exception into
            raise ImportError("initialization failed") from None

    monkeypatch.setattr(plots, "write_run_plots", import_interrupted)
    with pytest.raises(Terminated):
        run_experiment(quad(), tmp_path / "r")
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["error"] == "SIGTERM" and s["last_round"] == 20
    monkeypatch.undo()
    res = run_experiment(resume_config(tmp_path / "r"), tmp_path / "r", resume=True)
    assert res.summary["status"] == "completed"


def test_a_tracking_store_deleted_mid_run_is_one_warning_line(tmp_path, capfd):
    """(#70 item 5) Deleting mlruns.db while a run logs to it printed an 80-line
    SQLAlchemy traceback (MLflow's own log) before raycobo's warning; now the warning is
    the one line, naming the cause, and the run completes."""
    from raycobo.lifecycle.callbacks import BaseCallback
    from raycobo.tracking.mlflow_tracker import MLflowTracker

    db = tmp_path / "mlruns.db"

    class DeleteStore(BaseCallback):
        def on_round_end(self, ctx, r, stats):
            if r == 3:
                db.unlink()

    cfg = quad("tracking.enabled=true", f"tracking.uri=sqlite:///{db}")
    res = run_experiment(cfg, tmp_path / "r", [DeleteStore(), MLflowTracker(cfg.tracking)])
    assert res.summary["status"] == "completed"
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: MLflow tracking disabled"), err
    assert "readonly database" in err[0] or "no such table" in err[0], err[0]


def test_the_summary_records_the_torch_threads_its_numbers_ran_on(tmp_path, digits_cfg):
    """(#70 item 5) A parallel compare (one thread a run) differs from a serial one in the
    last digits; the thread count is in the summary beside the execution plan."""
    for threads in (1, 2):
        cfg = digits_cfg("rounds=1", f"engine.threads={threads}")
        res = run_experiment(cfg, tmp_path / f"t{threads}")
        assert res.summary["execution"]["threads"] == threads


def test_a_new_run_refused_as_it_starts_leaves_no_run_directory(tmp_path):
    """(#70 item 3) A setting the data loader refuses (a data.root without the files)
    used to leave a `failed` run directory holding the config: it is refused in one line
    with nothing left, and an empty folder given as --out stays empty."""
    quick = REPO / "examples" / "quickstart.yaml"
    missing = f"data.root={tmp_path / 'nowhere'}"
    res = cli("run", quick, missing, "--out", tmp_path / "new" / "r", "-q", "--no-tracking")
    assert res.exit_code == 2 and "data.root" in one_line(res)
    assert not (tmp_path / "new" / "r").exists()
    (tmp_path / "empty").mkdir()
    res = cli("run", quick, missing, "--out", tmp_path / "empty", "-q", "--no-tracking")
    assert res.exit_code == 2 and list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_between_a_rounds_count_and_its_row_waits_for_the_row(
    tmp_path, quad_cfg, monkeypatch, sig
):
    """A signal that lands after the loop counted round r but before rounds.csv has its
    row (a race CI met once: last_round 62, the last row 61) ends the run once the row is
    written: the summary's last_round and rounds.csv agree."""
    from raycobo.lifecycle.run_dir import RunDir

    write = RunDir.on_round_end

    def signalled(self, ctx, r, stats):
        if r == 7:
            os.kill(os.getpid(), sig)  # delivered here, inside the round's record-keeping
        write(self, ctx, r, stats)

    monkeypatch.setattr(RunDir, "on_round_end", signalled)
    # Python's own SIGINT handler, whatever an earlier test in this process left there
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            run_experiment(quad_cfg("rounds=20"), tmp_path / "cut")
    finally:
        signal.signal(signal.SIGINT, before)
    assert isinstance(caught.value, Terminated) == (sig == signal.SIGTERM)
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    rows = (tmp_path / "cut" / "rounds.csv").read_text().splitlines()
    assert summary["status"] == "interrupted" and summary["last_round"] == 7
    assert int(rows[-1].split(",")[0]) == 7 and len(rows) == 8
