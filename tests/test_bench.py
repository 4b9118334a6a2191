"""Benchmarks run and write their files (figures are never asserted: no timing tests)."""

import csv

import pytest
from typer.testing import CliRunner

from raycobo.cli import app


def test_bench_engine_and_scaling_write_their_outputs(tmp_path):
    args = ["bench", "engine", "--model", "mlp,cnn", "--clients", "4", "--rounds", "1"]
    args += ["--algorithms", "cobo,fedavg", "--out", str(tmp_path / "e")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "e" / "bench_engine.csv").open()))
    # the loop times the named entries; the local engine Local and CoBo's paper preset too
    named = {
        (m, a, e) for m in ("mlp", "cnn") for a in ("cobo", "fedavg") for e in ("local", "loop")
    }
    refs = {(m, a, "local") for m in ("mlp", "cnn") for a in ("local", "cobo-paper")}
    assert {(r["model"], r["algorithm"], r["engine"]) for r in rows} == named | refs
    # the strategy the local engine chose on this CPU, and each measurement's own peak
    chosen = {(r["model"], r["engine"]): r["strategy"] for r in rows}
    assert chosen[("cnn", "local")] == "loop" and chosen[("mlp", "local")] == "chunked"
    assert all(float(r["peak_mib"]) > 0 for r in rows)
    # the local rows give the round's FLOPs and its share of this machine's limit
    local = [r for r in rows if r["engine"] == "local"]
    assert all(float(r["gflop_per_round"]) > 0 and float(r["limit_ms"]) > 0 for r in local)
    assert "GFLOP/round" in res.output and "of the same round's" in res.output
    assert "| mlp | 4 | cobo |" in res.output
    # passes a round: Local and FedAvg one gradient a client; CoBo's pair scores on top;
    # every local row's time against Local's and the paper preset's from the same process
    by = {(r["model"], r["algorithm"]): r for r in local}
    assert float(by[("mlp", "local")]["grads_per_round"]) == 4.0
    assert float(by[("mlp", "fedavg")]["grads_per_round"]) == 4.0
    assert float(by[("mlp", "cobo")]["grads_per_round"]) > 4.0
    assert float(by[("mlp", "local")]["vs_local"]) == 1.0
    assert float(by[("mlp", "cobo-paper")]["vs_paper"]) == 1.0
    bad = CliRunner().invoke(app, ["bench", "engine", "--algorithms", "cobo-rhoo"])
    assert bad.exit_code == 2 and "--algorithms" in bad.stderr and "cobo-rhoo" in bad.stderr
    bad = CliRunner().invoke(app, ["bench", "engine", "--algorithms", "cobo-start_all_pairs"])
    assert bad.exit_code == 2 and "measures nothing" in bad.stderr
    bad = CliRunner().invoke(app, ["bench", "engine", "--model", "vgg"])
    assert bad.exit_code == 2 and "--model" in bad.stderr
    bad = CliRunner().invoke(app, ["bench", "engine", "--strategy", "fast"])
    assert bad.exit_code == 2 and "--strategy" in bad.stderr
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "scaling",
            "--clients",
            "20,40",
            "--rounds",
            "3",
            "--clusters",
            "4",
            "--out",
            str(tmp_path / "s"),
            "--no-tracking",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "s" / "bench_scaling.csv").open()))
    assert [int(r["n"]) for r in rows] == [20, 40]
    assert (tmp_path / "s" / "bench_scaling.png").stat().st_size > 0
    bad = CliRunner().invoke(app, ["bench", "scaling", "--clients", "ten"])
    assert bad.exit_code == 2 and "--clients" in bad.stderr


def test_bench_ray_writes_its_rows(tmp_path):
    import pytest

    ray = pytest.importorskip("ray")
    args = [
        "bench",
        "ray",
        "--clients",
        "4",
        "--per-actor",
        "2",
        "--rounds",
        "1",
        "--schedule",
        "sync,resident,stale",
        "--slow",
        "0.001",
        "--out",
        str(tmp_path),
    ]
    fedavg = [*args[:9], "sync,stale", "--algorithm", "fedavg", "--local-steps", "3"]
    fedavg += ["--out", str(tmp_path / "fedavg")]
    try:
        res = CliRunner().invoke(app, args)
        res_f = CliRunner().invoke(app, fedavg)  # a method that trains locally
    finally:
        ray.shutdown()
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "bench_ray.csv").open()))
    assert [(r["hosts"], r["schedule"], r["staleness"]) for r in rows] == [
        ("2", "sync", "0"),
        ("2", "resident", "0"),
        ("2", "stale", "1"),
    ]
    assert all(float(r["ray_ms"]) > 0 and float(r["local_ms"]) > 0 for r in rows)
    assert {r["algorithm"] for r in rows} == {"cobo"}
    assert res_f.exit_code == 0, res_f.output
    rows = list(csv.DictReader((tmp_path / "fedavg" / "bench_ray.csv").open()))
    assert [(r["algorithm"], r["schedule"]) for r in rows] == [
        ("fedavg-3", "sync"),
        ("fedavg-3", "stale"),
    ]


def test_bench_engine_measures_each_named_strategy_against_one_loop(tmp_path):
    args = ["bench", "engine", "--model", "mlp", "--clients", "4", "--rounds", "1"]
    args += ["--strategy", "vmap,chunked", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "bench_engine.csv").open()))
    assert [(r["engine"], r["strategy"]) for r in rows if r["algorithm"] == "cobo"] == [
        ("loop", "loop"),
        ("local", "vmap"),
        ("local", "chunked"),
    ]


def test_bench_profile_prints_the_round_and_its_operators():
    args = ["bench", "profile", "--model", "mlp", "--clients", "4", "--rounds", "1"]
    res = CliRunner().invoke(app, [*args, "--rows", "5"])
    assert res.exit_code == 0, res.output
    head = res.output.splitlines()[0]
    assert head.startswith("mlp, n=4, cobo, local (chunked) on cpu") and "ms/round" in head
    assert "operator calls" in head and "aten::" in res.output
    loop = CliRunner().invoke(app, [*args, "--engine", "loop", "--algorithm", "fedavg"])
    assert loop.exit_code == 0 and "fedavg, loop (loop)" in loop.output.splitlines()[0]
    bad = CliRunner().invoke(app, [*args, "--engine", "gpu"])
    assert bad.exit_code == 2 and "--engine" in bad.stderr


def test_bench_paper_measures_cobo_against_one_plain_model(tmp_path):
    """The paper's settings scaled down to a CPU smoke run: every (setting, precision,
    layout) row has CoBo's rate, the single model's, their ratio and a projection."""
    args = ["bench", "paper", "--device", "cpu", "--clients", "2", "--batch-size", "2"]
    args += ["--rounds", "1", "--precision", "fp32,bf16", "--layout", "nchw,nhwc"]
    args += ["--setting", "cross_silo", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "bench_paper.csv").open()))
    assert [(r["precision"], r["channels_last"]) for r in rows] == [
        ("fp32", "False"),
        ("fp32", "True"),
        ("bf16", "False"),
        ("bf16", "True"),
    ]
    for r in rows:
        assert float(r["images_per_s"]) > 0 and float(r["single_images_per_s"]) > 0
        ratio = float(r["images_per_s"]) / float(r["single_images_per_s"])
        assert abs(float(r["ratio"]) - ratio) < 1e-9
        hours = 40_000 * float(r["s_per_round"]) / 3600
        assert abs(float(r["projected_hours"]) - hours) < 1e-9
        assert r["strategy"] == "loop"  # conv nets on a CPU
    bad = CliRunner().invoke(app, ["bench", "paper", "--precision", "fp8"])
    assert bad.exit_code == 2 and "--precision" in bad.stderr


def test_round_limit_counts_each_phase_and_replays_its_operators():
    """A known round: the gradients of 2 alignment rows and 3 model-step rows in one call
    (one (5, 8, 4) batched product), a penalty product (6x7 @ 7x2) outside the
    gradients, an evaluation (3x4 @ 4x5): FLOPs by torch's counter (2mnk), split by rows;
    the replayed time is positive; the ops' own grads is back afterwards. The round is
    run again from the state it was recorded from, ``repeats`` times, and the share is
    the best replay against the best rerun; the session ends in the recorded round's
    state."""
    import torch

    from raycobo import rng
    from raycobo.bench.limit import round_limit

    class Ops:
        def grads(self, clients, Z, round, stream, salt=0):
            G = torch.bmm(torch.randn(5, 8, 4), torch.randn(5, 4, 3))
            return G, torch.zeros(clients.numel())

    class Session:
        def __init__(self, ops):
            self.ops = ops
            self.state = 10
            self.started_from = []

        def round(self, t):
            self.started_from.append(self.state)
            self.state = self.state + 1
            streams = torch.tensor([rng.ALIGN] * 2 + [rng.STEP] * 3)
            self.ops.grads(torch.arange(5), None, t, streams, 0)
            torch.randn(6, 2).addmm_(torch.randn(6, 7), torch.randn(7, 2))  # in place

        def evaluate(self):
            return torch.randn(3, 4) @ torch.randn(4, 5)

    ops = Ops()
    session = Session(ops)
    lim = round_limit(session, ops, 0, repeats=3)
    assert session.started_from == [10, 10, 10, 10] and session.state == 11
    assert lim.repeats == 3 and lim.round_ms > 0
    assert lim.share() == pytest.approx(lim.round_limit_ms / lim.round_ms)
    g = 2 * 5 * 8 * 4 * 3 / 1e9
    assert lim.gflop["alignment"] == pytest.approx(g * 2 / 5)
    assert lim.gflop["model step"] == pytest.approx(g * 3 / 5)
    assert lim.gflop["penalty and W"] == pytest.approx(2 * 6 * 7 * 2 / 1e9)
    assert lim.eval_gflop == pytest.approx(2 * 3 * 4 * 5 / 1e9)
    assert all(v > 0 for v in lim.limit_ms.values()) and lim.eval_limit_ms > 0
    assert "grads" not in ops.__dict__


def _dies() -> None:
    import os

    os._exit(9)  # as the out-of-memory killer leaves a process: no answer, no exception


def _fails() -> None:
    raise ValueError("bad shape")


def _sleeps() -> None:
    import time

    time.sleep(60)


def test_a_measurement_whose_process_dies_stops_with_one_line():
    """bench engine measures in a fresh process: a result comes back, an exception is
    raised as itself, and a process that dies or hangs ends the wait with a line naming
    the measurement (a multiprocessing pool waited for ever on a killed worker)."""
    import multiprocessing as mp

    from raycobo.bench.engine import in_fresh_process

    ctx = mp.get_context("spawn")
    assert in_fresh_process(divmod, (7, 2), ctx, 60, "x") == (3, 1)
    with pytest.raises(ValueError, match="bad shape"):
        in_fresh_process(_fails, (), ctx, 60, "x")
    with pytest.raises(RuntimeError, match=r"mlp, n=10000.*died \(exit code 9"):
        in_fresh_process(_dies, (), ctx, 60, "mlp, n=10000")
    with pytest.raises(RuntimeError, match="took over 2 s"):
        in_fresh_process(_sleeps, (), ctx, 2, "x")
