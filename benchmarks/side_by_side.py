"""Two runs sharing the machine: does ``engine.threads`` keep each at full speed?

Runs one experiment alone, then two copies of it at once (separate processes started
together behind a barrier), each with ``engine.threads`` torch threads, and prints each
run's wall time (``summary.json``'s ``wall_seconds``: data, rounds and evaluations, not
the interpreter's start) and the ratio side-by-side / alone. On a machine with as many
cores as the two runs' threads together, a ratio near 1 means the runs do not fight for
cores. Then a comparison's jobs side by side: ``raycobo compare`` of two methods, one
after another and ``--parallel`` (Ray tasks of a core each), each run's own wall time
from its ``summary.json``.

Usage: python benchmarks/side_by_side.py [--config examples/cross_device_fmnist.yaml]
       [--rounds 60] [--threads 1] [--repeat 2] [--algorithms cobo,fedavg]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _one(config: str, overrides: dict, out: str, barrier) -> float:
    """One run in this (fresh) process, started once every process is ready."""
    from raycobo import api  # imported before the barrier: import time is not measured

    barrier.wait(timeout=600)
    api.run(config, out=out, track=False, **overrides)
    return float(json.loads((Path(out) / "summary.json").read_text())["wall_seconds"])


def together(config: str, runs: list[dict]) -> list[float]:
    """The runs at once, one process each; -> their wall seconds."""
    ctx = get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="side-") as tmp, ctx.Manager() as manager:
        barrier = manager.Barrier(len(runs))
        with ctx.Pool(len(runs)) as pool:
            jobs = [
                pool.apply_async(_one, (config, over, f"{tmp}/run{k}", barrier))
                for k, over in enumerate(runs)
            ]
            return [j.get(timeout=3600) for j in jobs]


def _compare(config: str, algorithms: list[str], parallel: bool, overrides: dict) -> list[float]:
    """A comparison in this (fresh) process; -> its runs' wall seconds."""
    from raycobo import api

    with tempfile.TemporaryDirectory(prefix="side-cmp-") as tmp:
        api.compare(config, algorithms, out=tmp, parallel=parallel, track=False, **overrides)
        runs = sorted(Path(tmp).rglob("summary.json"))
        walls = [float(json.loads(f.read_text())["wall_seconds"]) for f in runs]
    if parallel:  # this process started Ray: stop it before the pool ends the process
        import ray

        ray.shutdown()
    return walls


def compared(config: str, algorithms: list[str], parallel: bool, overrides: dict) -> list[float]:
    with get_context("spawn").Pool(1) as pool:
        job = pool.apply_async(_compare, (config, algorithms, parallel, overrides))
        return job.get(timeout=3600)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(REPO / "examples" / "cross_device_fmnist.yaml"))
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1, help="engine.threads of each run")
    ap.add_argument("--repeat", type=int, default=2, help="repetitions of each measurement")
    ap.add_argument("--algorithms", default="cobo,fedavg", help="two methods for the compare")
    args = ap.parse_args()
    base = {
        "rounds": args.rounds,
        "eval_every": args.rounds,
        "engine__threads": args.threads,
    }
    first, second = args.algorithms.split(",")
    print(
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {Path(args.config).name}, "
        f"{args.rounds} rounds, engine.threads={args.threads} per run",
        flush=True,
    )
    alone, pair, serial, parallel = [], [], [], []
    for _ in range(args.repeat):  # interleaved, so drift hits every figure alike
        alone += together(args.config, [base])
        pair += together(args.config, [base, base])
        serial.append(compared(args.config, [first, second], False, base))
        parallel.append(compared(args.config, [first, second], True, base))
    med = statistics.median
    print(f"one run alone:            {med(alone):6.1f} s  (runs: {alone})")
    print(f"two at once, each:        {med(pair):6.1f} s  (runs: {pair})")
    print(f"  ratio two-at-once / alone: {med(pair) / med(alone):.2f}")
    one_by_one = [statistics.fmean(x) for x in serial]
    at_once = [statistics.fmean(x) for x in parallel]
    print(
        f"compare {first},{second}, one after another: {med(one_by_one):6.1f} s a run  ({serial})"
    )
    print(f"compare {first},{second} --parallel:         {med(at_once):6.1f} s a run  ({parallel})")
    print(f"  ratio parallel / serial, per run: {med(at_once) / med(one_by_one):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
