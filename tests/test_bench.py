"""Benchmarks run and write their files (figures are never asserted: no timing tests)."""

import csv

from typer.testing import CliRunner

from raycobo.cli import app


def test_bench_engine_and_scaling_write_their_outputs(tmp_path):
    args = ["bench", "engine", "--model", "mlp,cnn", "--clients", "4", "--rounds", "1"]
    args += ["--algorithms", "cobo,fedavg", "--out", str(tmp_path / "e")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "e" / "bench_engine.csv").open()))
    assert {(r["model"], r["algorithm"], r["engine"]) for r in rows} == {
        (m, a, e) for m in ("mlp", "cnn") for a in ("cobo", "fedavg") for e in ("local", "loop")
    }
    # the strategy the local engine chose on this CPU, and each measurement's own peak
    chosen = {(r["model"], r["engine"]): r["strategy"] for r in rows}
    assert chosen[("cnn", "local")] == "loop" and chosen[("mlp", "local")] == "chunked"
    assert all(float(r["peak_mib"]) > 0 for r in rows)
    assert "| mlp | 4 | cobo |" in res.output
    bad = CliRunner().invoke(app, ["bench", "engine", "--model", "vgg"])
    assert bad.exit_code == 2 and "--model" in bad.stderr
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
        "--staleness",
        "0,1",
        "--slow",
        "0.001",
        "--out",
        str(tmp_path),
    ]  # resident both: (0, no), (0, yes), (1, no); resident rounds are synchronous
    try:
        res = CliRunner().invoke(app, args)
    finally:
        ray.shutdown()
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "bench_ray.csv").open()))
    assert [(r["hosts"], r["staleness"], r["resident"]) for r in rows] == [
        ("2", "0", "False"),
        ("2", "0", "True"),
        ("2", "1", "False"),
    ]
    assert all(float(r["ray_ms"]) > 0 and float(r["local_ms"]) > 0 for r in rows)
