"""Throughput benchmarks (``raycobo bench``). Figures, never tests.

``engine``: rounds/s and client-steps/s of FedAvg and CoBo on the vectorized engine
against a plain per-client PyTorch loop (one nn.Module and SGD optimizer per client)
measured in the same process, MLP 784-64-10 on 28x28 inputs, at several n.
"""

from __future__ import annotations

import csv
import os
import statistics
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from raycobo import rng
from raycobo.algorithms.cobo import CoBo
from raycobo.algorithms.fedavg import FedAvg
from raycobo.algorithms.samplers import EdgeSampler
from raycobo.config import AlgorithmConfig, ModelConfig
from raycobo.data.base import FederatedData
from raycobo.engine.local import VectorizedOps
from raycobo.models import build_model


def synthetic_data(n: int, per_client: int = 200, seed: int = 0) -> FederatedData:
    """Random 28x28 images and labels, ``per_client`` each: throughput needs no real data."""
    g = torch.Generator().manual_seed(seed)
    N = n * per_client
    x = torch.randn(N, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (N,), generator=g)
    idx = list(torch.arange(N).view(n, per_client))
    test = list(torch.arange(min(N, 500)).expand(n, -1))
    return FederatedData(
        "synthetic",
        x,
        x[:500],
        idx,
        [y[i] for i in idx],
        test,
        [y[:500][t] for t in test],
        [c % 4 for c in range(n)],
        10,
    )


class PlainLoop:
    """The baseline a researcher writes first: a module and an optimizer per client."""

    def __init__(self, data: FederatedData, model, batch_size: int, seed: int, lr: float):
        self.data, self.batch_size, self.seed, self.lr = data, batch_size, seed, lr
        self.modules = []
        for _ in range(data.n_clients):
            m = build_model(ModelConfig(name="mlp", hidden=[64]), (1, 28, 28), 10).module
            m.load_state_dict(model.module.state_dict())
            self.modules.append(m)
        self.opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in self.modules]

    def batch(self, c: int, t: int, stream: int, salt: int = 0):
        idx = self.data.train_idx[c]
        k = torch.arange(self.batch_size)
        pos = rng.randint(idx.numel(), self.seed, t, stream, c, salt, k)
        return self.data.train_x[idx[pos]], self.data.train_y[c][pos]

    def grad(self, m, xb, yb) -> list[torch.Tensor]:
        m.zero_grad()
        F.cross_entropy(m(xb), yb).backward()
        return [p.grad for p in m.parameters()]

    def fedavg_round(self, t: int) -> None:
        global_state = self.modules[0].state_dict()
        for c, (m, opt) in enumerate(zip(self.modules, self.opts, strict=True)):
            m.load_state_dict(global_state)
            xb, yb = self.batch(c, t, rng.STEP)
            opt.zero_grad()
            F.cross_entropy(m(xb), yb).backward()
            opt.step()
        with torch.no_grad():
            avg = [
                torch.stack(ps).mean(0)
                for ps in zip(*(m.parameters() for m in self.modules), strict=True)
            ]
            for p, a in zip(self.modules[0].parameters(), avg, strict=True):
                p.copy_(a)

    def cobo_round(self, t: int, W: torch.Tensor, edges: torch.Tensor, rho: float, gamma: float):
        mid = build_model(ModelConfig(name="mlp", hidden=[64]), (1, 28, 28), 10).module
        for i, j in edges.tolist():
            with torch.no_grad():
                for pm, pi, pj in zip(
                    mid.parameters(),
                    self.modules[i].parameters(),
                    self.modules[j].parameters(),
                    strict=True,
                ):
                    pm.copy_((pi + pj) / 2)
            gi = [g.clone() for g in self.grad(mid, *self.batch(i, t, rng.ALIGN, j))]
            gj = self.grad(mid, *self.batch(j, t, rng.ALIGN, i))
            score = sum(float((a * b).sum()) for a, b in zip(gi, gj, strict=True))
            W[i, j] = W[j, i] = min(1.0, max(0.0, float(W[i, j]) + gamma * score))
        params = [[p.detach().clone() for p in m.parameters()] for m in self.modules]
        for c, (m, opt) in enumerate(zip(self.modules, self.opts, strict=True)):
            xb, yb = self.batch(c, t, rng.STEP)
            opt.zero_grad()
            F.cross_entropy(m(xb), yb).backward()
            with torch.no_grad():
                for q, p in enumerate(m.parameters()):
                    pen = sum(W[c, k] * (params[c][q] - params[k][q]) for k in range(len(params)))
                    p.grad += rho * pen
            opt.step()


@dataclass
class Row:
    n: int
    algorithm: str
    engine: str
    ms_per_round: float
    rounds_per_s: float
    client_steps_per_s: float
    speedup: float
    mb_per_client: float


class Stepper:
    """Advances an algorithm one round per call (for timing)."""

    def __init__(self, algo, ops):
        self.algo, self.ops = algo, ops
        self.state = algo.init(ops)

    def __call__(self, t: int) -> None:
        self.state, _ = self.algo.round(self.state, t, self.ops)


def _loop_cobo(loop: PlainLoop, W, sampler: EdgeSampler, rho: float, t: int) -> None:
    loop.cobo_round(t, W, sampler.sample(t), rho, 0.1)


def write_rows(path: Path, rows: list) -> None:
    """Dataclass rows as a CSV with a header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        if rows:
            w.writerow(rows[0].__dict__.keys())
        for r in rows:
            w.writerow(r.__dict__.values())


def rss_mb() -> float:
    """Current resident memory of this process in MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _time(fn, rounds: int, warmup: int = 2) -> float:
    for t in range(warmup):
        fn(t)
    times = []
    for t in range(warmup, warmup + rounds):
        t0 = time.perf_counter()
        fn(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_engine(
    clients: list[int],
    rounds: int = 20,
    batch_size: int = 32,
    out: Path | None = None,
    echo=print,
) -> list[Row]:
    rows: list[Row] = []
    echo(f"torch threads: {torch.get_num_threads()}, load average: {os.getloadavg()[0]:.2f}")
    for n in clients:
        data = synthetic_data(n)
        model = build_model(ModelConfig(name="mlp", hidden=[64]), (1, 28, 28), 10)
        rss0 = rss_mb()
        ops = VectorizedOps(data, model, batch_size, 0, "cpu")
        cfg = AlgorithmConfig(name="cobo", lr=0.05, rho=0.1 / n, gamma=0.1, sampling="constant")
        for name, algo in (("fedavg", FedAvg(cfg, 10**6, 0)), ("cobo", CoBo(cfg, 10**6, 0))):
            vec = _time(Stepper(algo, ops), rounds)
            mb = max(rss_mb() - rss0, 0.0) / n  # data + stacked models + W, per client
            steps = n if name == "fedavg" else n + 2 * n * (n - 1) / 2 * min(1.0, 1.0 / n)
            loop = PlainLoop(data, model, batch_size, 0, 0.05)
            sampler = EdgeSampler("constant", n, 10**6, 0)
            W = torch.ones(n, n)
            if name == "fedavg":
                base = _time(loop.fedavg_round, max(3, rounds // 4), warmup=1)
            else:
                step = partial(_loop_cobo, loop, W, sampler, 0.1 / n)
                base = _time(step, max(3, rounds // 4), warmup=1)
            for eng, sec in (("vectorized", vec), ("plain-loop", base)):
                rows.append(Row(n, name, eng, 1e3 * sec, 1 / sec, steps / sec, base / sec, mb))
            echo(
                f"n={n:4d} {name:6s} vectorized {1e3 * vec:8.2f} ms/round   plain loop "
                f"{1e3 * base:9.2f} ms/round   speed-up x{base / vec:6.1f}"
            )
    if out is not None:
        write_rows(out / "bench_engine.csv", rows)
    return rows


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

    from raycobo.config import load_config
    from raycobo.experiment import agreement_of, build_run

    rows: list[ScaleRow] = []
    echo(f"torch threads: {torch.get_num_threads()}, load average: {os.getloadavg()[0]:.2f}")
    for n in clients:
        per = max(1, n // clusters)
        base = [
            f"data.partition.num_clusters={clusters}",
            f"data.partition.clients_per_cluster={per}",
            "algorithm.name=cobo",
            "algorithm.sampling=constant",
            f"algorithm.rho={min(0.1, 5.0 / n)}",  # eta * rho * (n - 1) < 1 while W = 1
            "tracking.enabled=false",
        ]
        gc.collect()
        rss0 = rss_mb()
        if task == "quadratic":
            cfg = load_config(
                None,
                [
                    *base,
                    "data.name=quadratic",
                    "data.dim=10",
                    "data.noise=0.05",
                    "data.center_scale=3",
                ],
            )
            ops, algo = build_run(cfg)
        else:
            cfg = load_config(None, [*base, "algorithm.lr=0.05"])
            data = synthetic_data(per * clusters, per_client=64)
            model = build_model(ModelConfig(name="mlp", hidden=[64]), (1, 28, 28), 10)
            data.clusters = [c // per for c in range(per * clusters)]
            ops = VectorizedOps(data, model, 32, 0, "cpu")
            from raycobo.algorithms import build_algorithm

            algo = build_algorithm(cfg.algorithm, rounds, 0)
        step = Stepper(algo, ops)
        step(0)
        t0 = time.perf_counter()
        edges = 0.0
        for t in range(1, rounds + 1):
            step.state, stats = algo.round(step.state, t, ops)
            edges += stats["edges"]
        sec = (time.perf_counter() - t0) / rounds
        from raycobo.algorithms import evaluate

        ev = evaluate(algo, step.state, ops)
        agree = agreement_of(algo, step.state, algo.collaboration(step.state), list(ops.clusters))
        rss = rss_mb() - rss0
        n_real = ops.n_clients
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
        del step, ops, algo
    if out is not None:
        write_rows(out / "bench_scaling.csv", rows)
        from raycobo.plots import plot_scaling

        plot_scaling(out / "bench_scaling.png", [r.__dict__ for r in rows])
        if tracking is not None:
            tracking.log_scaling(rows, out)
    return rows


@dataclass
class RayRow:
    n: int
    clients_per_actor: int
    hosts: int
    staleness: int
    resident: bool
    slow_seconds: float
    local_ms: float
    ray_ms: float
    coordination_share: float | None
    alignment_lag_mean: float | None


def bench_ray(
    clients: list[int],
    per_actor: list[int],
    rounds: int = 10,
    slow_seconds: float = 0.0,
    staleness: list[int] = (0,),
    out: Path | None = None,
    echo=print,
    resident: list[bool] = (False,),
    gpus_per_client: float = 0.0,
    device: str = "cpu",
    data_root: str | None = None,
    fraction: float = 0.05,
) -> list[RayRow]:
    """CoBo rounds on the Ray engine against the local engine on the same config (MLP
    784-64-10 on Fashion-MNIST, or digits when it is missing): median ms per round and
    the coordination share (1 - the slowest host's compute / round time). With
    ``slow_seconds`` host 1 computes that much longer per gradient, to measure bounded
    staleness (``engine.staleness``). ``gpus_per_client`` > 0 places the hosts on GPU
    fractions (they compute on CUDA when Ray gives them a GPU); ``device`` is the local
    engine's."""
    from raycobo.config import load_config
    from raycobo.data import fashion_mnist_available
    from raycobo.engine.ray_engine import RayRun, start_ray
    from raycobo.experiment import build_run

    data = "fashion_mnist" if fashion_mnist_available(data_root) else "digits"
    rows: list[RayRow] = []
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    echo(
        f"torch threads: {torch.get_num_threads()}, load average: {os.getloadavg()[0]:.2f}, "
        f"data: {data}, GPU: {gpu}, local engine on {device}, "
        f"{gpus_per_client:g} GPU per client on ray"
    )
    for n in clients:
        base = [
            f"data.name={data}",
            f"data.fraction={fraction if data == 'fashion_mnist' else 1.0}",
            *([f"data.root={data_root}"] if data_root else []),
            "data.partition.num_clusters=4",
            f"data.partition.clients_per_cluster={max(1, n // 4)}",
            "algorithm.name=cobo",
            "algorithm.sampling=constant",
            f"algorithm.rho={min(0.3, 5.0 / n)}",
            f"rounds={rounds + 2}",
            "tracking.enabled=false",
        ]
        cfg = load_config(None, [*base, f"engine.device={device}"])
        ops, algo = build_run(cfg)
        local_ms = 1e3 * _time(Stepper(algo, ops), rounds)
        modes = [(k, s, r) for k in per_actor for s in staleness for r in resident]
        for k, s, res in modes:
            if res and s:  # host-resident rounds are synchronous
                continue
            rcfg = load_config(
                None,
                [
                    *base,
                    "engine.kind=ray",
                    f"engine.clients_per_actor={k}",
                    "engine.cpus_per_actor=0",
                    # the hosts share the machine's cores (the local engine uses them all)
                    f"engine.threads={max(1, torch.get_num_threads() // -(-ops.n_clients // k))}",
                    f"engine.gpus_per_client={gpus_per_client}",
                    f"engine.staleness={s}",
                    "engine.slow_hosts=[1]",
                    f"engine.slow_seconds={slow_seconds}",
                    f"engine.resident={str(res).lower()}",
                ],
            )
            start_ray(rcfg)
            run = RayRun(rcfg, ops.n_clients)
            try:
                state = run.init(run)

                def step(t, run=run, state=state):
                    run.round(state, t, run)

                ray_ms = 1e3 * _time(step, rounds)
                rep = run.summary_extras()
            finally:
                run.close()
            row = RayRow(
                ops.n_clients,
                k,
                rep["hosts"],
                s,
                res,
                slow_seconds,
                local_ms,
                ray_ms,
                rep.get("coordination_share"),
                rep.get("alignment_lag_mean"),
            )
            rows.append(row)
            share = "-" if row.coordination_share is None else f"{row.coordination_share:.0%}"
            echo(
                f"n={row.n:4d} per_actor={k:3d} hosts={row.hosts:3d} staleness={s} "
                f"resident={'yes' if res else 'no '} "
                f"local {local_ms:7.1f} ms  ray {ray_ms:7.1f} ms  coordination {share}"
            )
    if out is not None:
        write_rows(out / "bench_ray.csv", rows)
    return rows
