"""``raycobo bench scaling``: CoBo with O(1/n) edge sampling at growing n."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from raycobo.bench.common import rss_mb, started, synthetic_data, write_rows
from raycobo.engine import make_local_ops


@dataclass
class ScaleRow:
    n: int
    task: str
    ms_per_round: float
    edges_per_round: float
    rss_mib: float
    mib_per_client: float
    final_loss: float
    final_accuracy: float | None
    w_within: float | None
    w_across: float | None


def bench_scaling(
    clients: list[int],
    rounds: int = 50,
    task: str = "quadratic",
    clusters: int = 10,
    out: Path | None = None,
    echo=print,
    tracking=None,
) -> list[ScaleRow]:
    """CoBo with constant O(1/n) edge sampling at growing n: time per round, memory and
    quality. ``task``: ``quadratic`` (d=10, CoBo Example 2) or ``mlp`` (784-64-10 on
    synthetic 28x28 data). Memory is the growth of this process's resident set while n
    is measured; run one n per call for exact per-n figures (allocators reuse memory)."""
    import gc

    rows: list[ScaleRow] = []
    echo(f"torch threads: {torch.get_num_threads()}, load average: {os.getloadavg()[0]:.2f}")
    for n in clients:
        gc.collect()
        rss0 = rss_mb()
        session = _session(task, n, clusters, rounds)
        session.round(0)
        t0 = time.perf_counter()
        edges = 0.0
        for t in range(1, rounds + 1):
            edges += session.round(t)["edges"]
        sec = (time.perf_counter() - t0) / rounds
        ev = session.evaluate()
        agree = session.agreement(session.collaboration())
        rss = rss_mb() - rss0
        n_real = session.n_clients
        row = ScaleRow(
            n_real,
            task,
            1e3 * sec,
            edges / rounds,
            rss,
            rss / n_real,
            float(ev.loss.mean()),
            float(ev.accuracy.mean()) if ev.accuracy is not None else None,
            agree.get("w_within"),
            agree.get("w_across"),
        )
        rows.append(row)
        echo(
            f"n={n_real:6d} {row.ms_per_round:9.1f} ms/round  "
            f"{row.edges_per_round:8.0f} edges/round  +{row.rss_mib:7.0f} MiB "
            f"({row.mib_per_client:.3f}/client)  loss {row.final_loss:.4g}"
        )
        del session
    if out is not None:
        write_rows(out / "bench_scaling.csv", rows)
        from raycobo.plots import plot_scaling

        plot_scaling(out / "bench_scaling.png", [r.__dict__ for r in rows])
        if tracking is not None:
            tracking.log_scaling(rows, out)
    return rows


def _session(task: str, n: int, clusters: int, rounds: int):
    """A started local session of CoBo with n clients in ``clusters`` clusters."""
    from raycobo.algorithms import build_algorithm
    from raycobo.config import load_config
    from raycobo.engine import open_session

    per = max(1, n // clusters)
    base = [
        f"data.partition.num_clusters={clusters}",
        f"data.partition.clients_per_cluster={per}",
        "algorithm.name=cobo",
        "algorithm.sampling=constant",
        "algorithm.sampling_samples=0",  # p = c / n: a bench's few rounds are no short run
        "algorithm.start_all_pairs=false",  # round 0 too
        f"algorithm.rho={min(0.1, 5.0 / n)}",  # eta * rho * (n - 1) < 1 while W = 1
        "tracking.enabled=false",
    ]
    if task == "quadratic":
        quad = ["data.name=quadratic", "data.dim=10", "data.noise=0.05", "data.center_scale=3"]
        session, _ = open_session(load_config(None, [*base, *quad]))
        session.start()
        return session
    cfg = load_config(None, [*base, "algorithm.lr=0.05"])
    data = synthetic_data(per * clusters, per_client=64)
    data.clusters = [c // per for c in range(per * clusters)]
    ops = make_local_ops(cfg, data)  # MLP 784-64-10, the engine's own strategy
    return started(build_algorithm(cfg.algorithm, rounds, 0), ops)
