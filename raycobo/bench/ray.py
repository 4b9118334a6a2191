"""``raycobo bench ray``: a method (CoBo by default) on the Ray engine against the local
engine."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from raycobo.bench.common import _time, write_rows


@dataclass
class RayRow:
    n: int
    clients_per_actor: int
    hosts: int
    schedule: str  # engine.rounds
    staleness: int  # stale: engine.staleness; else 0
    slow_seconds: float
    local_ms: float
    ray_ms: float
    coordination_share: float | None
    ahead_lag_mean: float | None
    startup_s: float  # placing the hosts and the coordinator, loading data, first state
    model: str = "mlp"
    algorithm: str = "cobo"  # with its local steps, e.g. fedavg-5

    def line(self) -> str:
        share = "-" if self.coordination_share is None else f"{self.coordination_share:.0%}"
        return (
            f"{self.algorithm} n={self.n:4d} per_actor={self.clients_per_actor:3d} "
            f"hosts={self.hosts:3d} "
            f"rounds={self.schedule:8s} staleness={self.staleness} "
            f"local {self.local_ms:7.1f} ms  ray {self.ray_ms:7.1f} ms  "
            f"coordination {share}  start-up {self.startup_s:.1f} s"
        )


def bench_ray(
    clients: list[int],
    per_actor: list[int],
    rounds: int = 10,
    slow_seconds: float = 0.0,
    staleness: int = 1,
    out: Path | None = None,
    echo=print,
    schedules: list[str] = ("sync",),
    gpus_per_client: float = 0.0,
    device: str = "cpu",
    data_root: str | None = None,
    fraction: float = 0.05,
    model: str = "mlp",
    threads: int | None = None,
    algorithm: str = "cobo",
    local_steps: int | None = None,
) -> list[RayRow]:
    """A method's rounds (``algorithm``, CoBo by default; ``local_steps`` for one that
    trains locally) on the Ray engine against the local engine on the same config (MLP
    784-64-10 on Fashion-MNIST, or digits when it is missing): median ms per round and
    the coordination share (1 - the slowest host's compute / round time). With
    ``slow_seconds`` host 1 computes that much longer per gradient, to measure bounded
    staleness; ``schedules``: the ``engine.rounds`` measured (``staleness``: stale's
    ``engine.staleness``). ``gpus_per_client`` > 0 places the hosts on GPU
    fractions (they compute on CUDA when Ray gives them a GPU); ``device`` is the local
    engine's."""
    from raycobo.config import load_config
    from raycobo.data import fashion_mnist_available
    from raycobo.engine import open_session

    data = "fashion_mnist" if fashion_mnist_available(data_root) else "digits"
    rows: list[RayRow] = []
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    echo(
        f"torch threads: {torch.get_num_threads()}, load average: {os.getloadavg()[0]:.2f}, "
        f"data: {data}, GPU: {gpu}, local engine on {device}, "
        f"{gpus_per_client:g} GPU per client on ray"
    )
    for n in clients:
        base = _base(n, data, fraction, data_root, rounds, model)
        base += _method(algorithm, n, local_steps)
        local, _ = open_session(load_config(None, [*base, f"engine.device={device}"]))
        local.start()
        n_clients = local.n_clients
        local_ms = 1e3 * _time(local.round, rounds)
        del local
        modes = [(k, m, staleness if m == "stale" else 0) for k in per_actor for m in schedules]
        label = algorithm + (f"-{local_steps}" if local_steps else "")
        opts = (rounds, threads, gpus_per_client, slow_seconds, model, label)
        rows += _on_ray(base, n_clients, local_ms, modes, opts, echo)
    if out is not None:
        write_rows(out / "bench_ray.csv", rows)
    return rows


def _base(n: int, data: str, fraction: float, data_root, rounds: int, model: str) -> list[str]:
    """The overrides every engine of one n shares: 4 clusters of n/4 clients."""
    return [
        f"data.name={data}",
        f"data.fraction={fraction if data == 'fashion_mnist' else 1.0}",
        *([f"data.root={data_root}"] if data_root else []),
        "data.partition.num_clusters=4",
        f"data.partition.clients_per_cluster={max(1, n // 4)}",
        f"rounds={rounds + 2}",
        "tracking.enabled=false",
        f"model.name={model}",
    ]


def _method(algorithm: str, n: int, local_steps: int | None) -> list[str]:
    """The measured method's overrides: CoBo with constant sampling (as every row of
    this bench before), or another method with its local steps."""
    if algorithm == "cobo":
        # the strategy's own rates: a bench's few rounds are no short run to make up for
        head = [
            "algorithm.name=cobo",
            "algorithm.sampling=constant",
            "algorithm.sampling_samples=0",
            "algorithm.start_all_pairs=false",
        ]
        head.append(f"algorithm.rho={min(0.3, 5.0 / n)}")
    else:
        head = [f"algorithm.name={algorithm}"]
    return head + ([f"algorithm.local_steps={local_steps}"] if local_steps else [])


def _on_ray(base, n_clients: int, local_ms: float, modes, opts, echo) -> list[RayRow]:
    """One row per (clients per actor, schedule, staleness) mode of one n on Ray.
    ``opts``: (rounds, threads, GPUs per client, slow seconds, model, method label)."""
    from raycobo.config import load_config

    rounds, threads, gpus_per_client, slow_seconds, model, label = opts
    rows = []
    for k, mode, s in modes:
        shared = max(1, torch.get_num_threads() // -(-n_clients // k))
        # the hosts share the machine's cores (the local engine uses them all)
        engine = _engine(k, mode, s, threads or shared, gpus_per_client, slow_seconds)
        ray_ms, rep, startup = _measure_ray(load_config(None, [*base, *engine]), n_clients, rounds)
        share, lag = rep.get("coordination_share"), rep.get("ahead_lag_mean")
        row = RayRow(
            n_clients,
            k,
            rep["hosts"],
            mode,
            s,
            slow_seconds,
            local_ms,
            ray_ms,
            share,
            lag,
            startup,
            model,
            label,
        )
        rows.append(row)
        echo(row.line())
    return rows


def _engine(k: int, mode: str, s: int, threads: int, gpus: float, slow: float) -> list[str]:
    """The Ray engine's overrides of one measured mode."""
    return [
        "engine.kind=ray",
        f"engine.clients_per_actor={k}",
        "engine.cpus_per_actor=0",
        f"engine.threads={threads}",
        f"engine.gpus_per_client={gpus}",
        f"engine.rounds={mode}",
        *([f"engine.staleness={s}"] if mode == "stale" else []),
        "engine.slow_hosts=[1]",
        f"engine.slow_seconds={slow}",
    ]


def _measure_ray(cfg, n_clients: int, rounds: int) -> tuple[float, dict, float]:
    """(median ms per round, engine report, start-up seconds) of ``cfg`` on Ray."""
    from raycobo.engine.ray import RaySession, start_ray

    start_ray(cfg)
    t0 = time.perf_counter()
    run = RaySession(cfg, n_clients)
    try:
        run.start()
        startup = time.perf_counter() - t0
        ray_ms = 1e3 * _time(run.round, rounds)
        return ray_ms, run.report()["engine_report"], startup
    finally:
        run.close()
