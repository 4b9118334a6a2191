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
        out.mkdir(parents=True, exist_ok=True)
        with (out / "bench_engine.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(Row.__dataclass_fields__.keys())
            for r in rows:
                w.writerow(r.__dict__.values())
    return rows
