"""``raycobo bench``: throughput and scaling measurements (figures, not tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from raycobo.cli.common import (
    Debug,
    NoTrack,
    Out,
    Threads,
    _choices,
    _guarded,
    _int_list,
    _set_threads,
)
from raycobo.settings import ConfigError

bench_app = typer.Typer(help="Throughput and scaling measurements (figures, not tests).")


@bench_app.command("engine")
def bench_engine_cmd(
    models: Annotated[str, typer.Option("--model", help="comma-separated models")] = "mlp,cnn",
    clients: Annotated[str, typer.Option(help="comma-separated client counts")] = "8,40,80",
    algorithms: Annotated[
        str,
        typer.Option(
            help="comma-separated entries: a method (cobo, fedavg, ...), cobo-paper, or "
            "cobo-KEY (CoBo's defaults with preset key KEY at the paper preset's value); "
            "Local and cobo-paper are measured beside them"
        ),
    ] = "cobo",
    rounds: Annotated[int, typer.Option(help="timed rounds per measurement")] = 5,
    batch_size: Annotated[int, typer.Option()] = 32,
    threads: Threads = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    strategy: Annotated[
        str, typer.Option(help="comma-separated local-engine strategies: auto, vmap, chunked")
    ] = "auto",
    loop: Annotated[bool, typer.Option(help="also time the per-client loop")] = True,
    out: Out = None,
    debug: Debug = False,
) -> None:
    """The local engine (its automatic strategy, or those named) vs the per-client loop:
    time per round and peak memory, per model and n (each measured in a fresh process),
    minibatch passes a round, and time against Local's and CoBo preset paper's."""

    def go():
        from raycobo.bench.engine import SHAPES, as_markdown, bench_engine

        names = [m.strip() for m in models.split(",") if m.strip()]
        bad = [m for m in names if m not in SHAPES]
        if bad:
            raise ConfigError(
                f"--model: unknown model '{bad[0]}' (choose from {', '.join(SHAPES)})"
            )
        algos = [a.strip() for a in algorithms.split(",") if a.strip()]
        ns = _int_list(clients, "--clients")
        strategies = _choices(strategy, "--strategy", ("auto", "vmap", "chunked"))
        rows = bench_engine(
            names,
            ns,
            rounds,
            batch_size,
            out,
            typer.echo,
            algos,
            threads,
            device=device,
            strategies=strategies,
            with_loop=loop,
        )
        typer.echo(as_markdown(rows))
        if out is not None:
            typer.echo(f"wrote {out}/bench_engine.csv")

    _guarded(debug, go)


@bench_app.command("paper")
def bench_paper_cmd(
    setting: Annotated[
        str, typer.Option(help="comma-separated: cross_silo, cross_device")
    ] = "cross_silo,cross_device",
    device: Annotated[str, typer.Option(help="cuda or cpu")] = "cuda",
    precision: Annotated[str, typer.Option(help="comma-separated: fp32, tf32, bf16")] = "fp32",
    layout: Annotated[str, typer.Option(help="comma-separated: nchw, nhwc")] = "nchw",
    rounds: Annotated[int, typer.Option(help="timed rounds per measurement")] = 3,
    batch_size: Annotated[int, typer.Option()] = 128,
    clients: Annotated[
        int | None, typer.Option(help="scale the settings down to this many clients (smoke)")
    ] = None,
    threads: Threads = None,
    out: Out = None,
    debug: Debug = False,
) -> None:
    """The CoBo paper's ResNet-9 experiments at full size: s/round, images/s against one
    plain ResNet-9 at the same batch, precision and layout, and the projected wall time."""

    def go():
        from raycobo.bench.paper import bench_paper

        _set_threads(threads)
        rows = bench_paper(
            _choices(setting, "--setting", ("cross_silo", "cross_device")),
            device,
            _choices(precision, "--precision", ("fp32", "tf32", "bf16")),
            [x == "nhwc" for x in _choices(layout, "--layout", ("nchw", "nhwc"))],
            rounds,
            batch_size,
            clients,
            out,
            echo=typer.echo,
        )
        if out is not None:
            typer.echo(f"wrote {out}/bench_paper.csv ({len(rows)} rows)")

    _guarded(debug, go)


@bench_app.command("profile")
def bench_profile_cmd(
    model: Annotated[str, typer.Option("--model")] = "mlp",
    clients: Annotated[int, typer.Option()] = 40,
    algorithm: Annotated[str, typer.Option(help="cobo or fedavg")] = "cobo",
    engine: Annotated[str, typer.Option(help="local or loop")] = "local",
    strategy: Annotated[str, typer.Option(help="auto, vmap, chunked")] = "auto",
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    rounds: Annotated[int, typer.Option(help="rounds timed, then profiled")] = 3,
    batch_size: Annotated[int, typer.Option()] = 32,
    rows: Annotated[int, typer.Option(help="operators listed")] = 25,
    threads: Threads = None,
    debug: Debug = False,
) -> None:
    """Where one round's time goes: ms/round, then torch.profiler's operator table."""

    def go():
        from raycobo.bench.engine import SHAPES
        from raycobo.bench.profile import profile_round

        _set_threads(threads)
        _choices(model, "--model", tuple(SHAPES))
        _choices(algorithm, "--algorithm", ("cobo", "fedavg"))
        _choices(engine, "--engine", ("local", "loop"))
        _choices(strategy, "--strategy", ("auto", "vmap", "chunked"))
        typer.echo(
            profile_round(
                model, clients, algorithm, engine, strategy, device, rounds, batch_size, rows
            )
        )

    _guarded(debug, go)


@bench_app.command("scaling")
def bench_scaling_cmd(
    clients: Annotated[
        str, typer.Option(help="comma-separated client counts")
    ] = "80,320,1000,3000,10000",
    rounds: Annotated[int, typer.Option(help="timed rounds per n")] = 50,
    task: Annotated[str, typer.Option(help="quadratic or mlp")] = "quadratic",
    clusters: Annotated[int, typer.Option(help="ground-truth clusters")] = 10,
    threads: Threads = None,
    out: Out = None,
    no_tracking: NoTrack = False,
    debug: Debug = False,
) -> None:
    """CoBo with O(1/n) sampling at growing n: round time, memory, quality (CSV + plot)."""

    def go():
        from raycobo.bench import bench_scaling

        if task not in ("quadratic", "mlp"):
            raise ConfigError(f"--task must be quadratic or mlp, got '{task}'")
        _set_threads(threads)
        ns = _int_list(clients, "--clients")
        target = out or Path("runs") / "bench-scaling"
        tracker = None
        if not no_tracking:
            from raycobo.config import TrackingConfig
            from raycobo.tracking.mlflow_tracker import ScalingLogger

            tracker = ScalingLogger(TrackingConfig(experiment="raycobo-bench"))
        bench_scaling(ns, rounds, task, clusters, target, echo=typer.echo, tracking=tracker)
        typer.echo(f"wrote {target}/bench_scaling.csv and bench_scaling.png")

    _guarded(debug, go)


@bench_app.command("ray")
def bench_ray_cmd(
    clients: Annotated[str, typer.Option(help="comma-separated client counts")] = "8,40,80",
    per_actor: Annotated[str, typer.Option(help="clients per host actor")] = "8,40",
    rounds: Annotated[int, typer.Option(help="timed rounds per measurement")] = 10,
    slow: Annotated[float, typer.Option(help="extra seconds per gradient on host 1")] = 0.0,
    schedule: Annotated[
        str, typer.Option(help="comma-separated engine.rounds: sync, stale, resident")
    ] = "sync,resident",
    staleness: Annotated[int, typer.Option(help="engine.staleness of the stale rows")] = 1,
    threads: Threads = None,
    gpus_per_client: Annotated[
        float, typer.Option(help="engine.gpus_per_client of the Ray hosts")
    ] = 0.0,
    device: Annotated[str, typer.Option(help="the local engine's device (cpu, cuda)")] = "cpu",
    data_root: Annotated[str | None, typer.Option(help="Fashion-MNIST folder (idx files)")] = None,
    fraction: Annotated[float, typer.Option(help="data.fraction of Fashion-MNIST")] = 0.05,
    model: Annotated[str, typer.Option(help="mlp or cnn")] = "mlp",
    host_threads: Annotated[
        int | None, typer.Option(help="torch threads per host (default: shared out)")
    ] = None,
    algorithm: Annotated[str, typer.Option(help="the method measured")] = "cobo",
    local_steps: Annotated[
        int | None, typer.Option(help="algorithm.local_steps of a method that has it")
    ] = None,
    out: Out = None,
    debug: Debug = False,
) -> None:
    """A method (CoBo by default) on the Ray engine vs the local engine: ms per round,
    coordination share, start-up time."""

    def go():
        from raycobo.bench import bench_ray

        _set_threads(threads)
        bench_ray(
            _int_list(clients, "--clients"),
            _int_list(per_actor, "--per-actor"),
            rounds,
            slow,
            staleness,
            out,
            echo=typer.echo,
            schedules=_choices(schedule, "--schedule", ("sync", "stale", "resident")),
            gpus_per_client=gpus_per_client,
            device=device,
            data_root=data_root,
            fraction=fraction,
            model=_choices(model, "--model", ("mlp", "cnn"))[0],
            threads=host_threads,
            algorithm=algorithm,
            local_steps=local_steps,
        )

    _guarded(debug, go)
