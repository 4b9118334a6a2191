"""What the benchmarks share: synthetic data, timing, memory, CSV rows. Figures, never
tests (no timing is asserted anywhere)."""

from __future__ import annotations

import csv
import os
import resource
import statistics
import time
from pathlib import Path

import torch

from raycobo.data.base import FederatedData


def synthetic_data(
    n: int,
    per_client: int = 200,
    seed: int = 0,
    shape: tuple[int, ...] = (1, 28, 28),
    classes: int = 10,
) -> FederatedData:
    """Random inputs of ``shape`` and labels, ``per_client`` each (4 clusters): throughput
    needs no real data."""
    g = torch.Generator().manual_seed(seed)
    N = n * per_client
    x = torch.randn(N, *shape, generator=g)
    y = torch.randint(0, classes, (N,), generator=g)
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
        classes,
    )


def started(algo, ops):
    """A local session of ``algo`` over ``ops``, started: ``session.round(t)`` is what
    the benchmarks time."""
    from raycobo.engine import LocalSession

    session = LocalSession(algo, ops)
    session.start()
    return session


class CountingOps:
    """``ops`` that counts the clients' minibatch passes it answers: a row of a ``grads``
    call is one gradient (a forward and a backward on one minibatch), a row of a
    ``losses`` call one forward. Everything else is ``ops``'s own."""

    def __init__(self, ops):
        self._ops = ops
        self.grad_rows = 0
        self.loss_rows = 0

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def grads(self, clients, *args, **kwargs):
        self.grad_rows += len(clients)
        return self._ops.grads(clients, *args, **kwargs)

    def losses(self, clients, *args, **kwargs):
        self.loss_rows += len(clients)
        return self._ops.losses(clients, *args, **kwargs)


def write_rows(path: Path, rows: list) -> None:
    """Dataclass rows as a CSV with a header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        if rows:
            w.writerow(rows[0].__dict__.keys())
        for r in rows:
            w.writerow(r.__dict__.values())


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (run one measurement per process
    for a per-measurement peak): Linux's VmHWM, where ru_maxrss would start at the peak of
    the process that started this one (Linux keeps it across exec)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
