"""Running a comparison's jobs: one after the other in this process, or as Ray tasks
side by side (``--parallel``). A run that fails midway comes back as its failed summary,
so one diverging method does not stop the others."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raycobo.comparison.plan import Job
from raycobo.config import Config
from raycobo.lifecycle import Result, RunFailed, run_experiment
from raycobo.lifecycle.callbacks import Callback
from raycobo.lifecycle.provenance import provenance
from raycobo.lifecycle.run_dir import read_summary


def run_one(
    cfg: Config, run_dir: Path, callbacks: list[Callback], progress: Any, again: bool
) -> Result:
    """One compared run; a run that fails midway comes back as its failed summary."""
    try:
        return run_experiment(cfg, run_dir, callbacks, progress, resume=again)
    except RunFailed as err:
        return Result(err.run_dir, read_summary(err.run_dir) or {"status": "failed"})


def _run_remote(
    cfg_dict: dict[str, Any],
    run_dir: str,
    callbacks: list[Callback],
    again: bool,
    threads: int,
    driver: dict[str, Any],
) -> Result:
    """One job in a Ray worker. Without engine.threads the run takes the task's CPUs as
    torch threads (torch's own default is every core: two such jobs on 2 cores ran 3x
    slower than one). ``driver``: the submitting command's provenance (the run records
    that command, not the Ray worker's)."""
    import torch

    from raycobo.config import validate
    from raycobo.lifecycle.provenance import launched_by

    launched_by(driver)
    cfg = validate(cfg_dict)
    if cfg.engine.threads is None:
        torch.set_num_threads(threads)
    return run_one(cfg, Path(run_dir), callbacks, None, again)


def run_serial(
    jobs: list[Job],
    make_callbacks: Callable[[str], list[Callback]],
    make_progress: Callable[[str], Any],
    labels: bool,
) -> dict[tuple[str, int], Result]:
    """``labels``: progress bars say the seed (several seeds per entry). Each bar says
    which entry and seed of how many it is, and after each run one line says how many
    runs are done and about how long the rest will take."""
    out = {}
    entries = list(dict.fromkeys(j.entry for j in jobs))
    seeds = list(dict.fromkeys(j.seed for j in jobs))
    clock = CompareClock([j.cfg.rounds for j in jobs])
    for k, j in enumerate(jobs):
        where = f"entry {entries.index(j.entry) + 1} of {len(entries)}"
        if labels:
            where += f", seed {seeds.index(j.seed) + 1} of {len(seeds)}"
        progress = make_progress(f"{j.label if labels else j.entry} ({where})")
        start = time.monotonic()
        out[(j.entry, j.seed)] = run_one(
            j.cfg, j.run_dir, make_callbacks(j.entry), progress, j.again
        )
        clock.done(k, time.monotonic() - start)
        if progress is not None and k + 1 < len(jobs):
            print(f"compare: {clock.say()}", file=sys.stderr, flush=True)
    return out


class CompareClock:
    """The whole comparison's time: the runs done, and what is left estimated from the
    seconds per round measured so far (each job's rounds weigh it)."""

    def __init__(self, rounds: list[int]):
        self.rounds, self.spent, self.finished = rounds, 0.0, 0

    def done(self, k: int, seconds: float) -> None:
        self.spent += seconds
        self.finished = k + 1

    def left_s(self) -> float:
        ran = sum(self.rounds[: self.finished])
        per_round = self.spent / ran if ran else 0.0
        return per_round * sum(self.rounds[self.finished :])

    def say(self) -> str:
        return (
            f"{self.finished} of {len(self.rounds)} runs done in {_clock(self.spent)}, "
            f"about {_clock(self.left_s())} left"
        )


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def run_parallel(
    jobs: list[Job], make_callbacks: Callable[[str], list[Callback]], cpus_per_run: float
) -> dict[tuple[str, int], Result]:
    """Every job as a Ray task of ``cpus_per_run`` CPUs, as many at once as the Ray
    instance (local, bound to 127.0.0.1, or ``engine.address``) has room for."""
    import ray

    from raycobo.engine.ray import start_ray
    from raycobo.engine.ray.layout import plugin_options

    first = jobs[0].cfg
    start_ray(first)
    driver = provenance()
    task = ray.remote(num_cpus=cpus_per_run)(_run_remote)
    refs = {
        (j.entry, j.seed): task.options(**plugin_options(j.cfg)).remote(
            j.cfg.to_dict(),
            str(j.run_dir.resolve()),
            make_callbacks(j.entry),
            j.again,
            max(1, int(cpus_per_run)),
            driver,
        )
        for j in jobs
    }
    # a bound on the whole batch: every run may take up to engine.timeout_s
    bound = first.engine.timeout_s * len(jobs)
    _, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=bound)
    if pending:
        late = [f"{entry} seed {seed}" for (entry, seed), ref in refs.items() if ref in pending]
        for ref in pending:  # an interrupted run keeps its checkpoints for --resume
            ray.cancel(ref)
        raise TimeoutError(
            f"compare --parallel: {len(late)} of {len(refs)} runs not finished within "
            f"engine.timeout_s x runs = {bound:g} s ({', '.join(late)}); the finished runs "
            "are kept: continue with raycobo compare --resume on the comparison's "
            "directory, or start again with a larger engine.timeout_s"
        )
    return dict(zip(refs, ray.get(list(refs.values())), strict=True))
