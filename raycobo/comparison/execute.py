"""Running a comparison's jobs: one after the other in this process, or as Ray tasks
side by side (``--parallel``). A run that fails midway comes back as its failed summary,
so one diverging method does not stop the others."""

from __future__ import annotations

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
    """``labels``: progress bars say the seed (several seeds per entry)."""
    out = {}
    for j in jobs:
        progress = make_progress(j.label if labels else j.entry)
        out[(j.entry, j.seed)] = run_one(
            j.cfg, j.run_dir, make_callbacks(j.entry), progress, j.again
        )
    return out


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
