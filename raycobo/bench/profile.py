"""``raycobo bench profile``: where one round's time goes, for one model, n and engine.

Times a few rounds without the profiler (ms/round), then runs the same number under
``torch.profiler`` and returns its table of operators (self time, calls), sorted by the
device's time on CUDA and by CPU time otherwise, with the number of operator calls and
kernel launches per round: the overhead beside the GEMMs / convolutions that a round
cannot avoid.
"""

from __future__ import annotations

import torch

from raycobo.bench.common import _time, started
from raycobo.bench.engine import workload


def profile_round(
    model: str,
    n: int,
    algorithm: str = "cobo",
    engine: str = "local",
    strategy: str = "auto",
    device: str = "cpu",
    rounds: int = 3,
    batch_size: int = 32,
    row_limit: int = 25,
) -> str:
    from torch.profiler import ProfilerActivity, profile

    from raycobo.algorithms import build_algorithm
    from raycobo.config import with_overrides
    from raycobo.engine import make_local_ops

    extra = [f"engine.device={device}", f"engine.strategy={strategy}"]
    cfg, data = workload(model, n, engine, batch_size, extra)
    cfg = with_overrides(cfg, {"algorithm.name": algorithm})  # CoBo's own keys drop
    ops = make_local_ops(cfg, data)
    algo = build_algorithm(cfg.algorithm, 10**6, 0)
    session = started(algo, ops)
    cuda = device.startswith("cuda")

    def step(t):
        session.round(t)
        if cuda:
            torch.cuda.synchronize()

    sec = _time(step, rounds, warmup=2)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for t in range(2 + rounds, 2 + 2 * rounds):
            step(t)
    events = prof.key_averages()
    calls = sum(e.count for e in events if not e.key.startswith("cuda"))
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel"))
    strategy_used = ops.execution.strategy if engine == "local" else "loop"
    head = (
        f"{model}, n={n}, {algorithm}, {engine} ({strategy_used}) on {device}, "
        f"{torch.get_num_threads()} threads: {1e3 * sec:.1f} ms/round without the profiler; "
        f"per round {calls / rounds:.0f} operator calls"
        + (f", {launches / rounds:.0f} kernel launches" if cuda else "")
    )
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return head + "\n" + events.table(sort_by=sort, row_limit=row_limit)
