"""The searcher and the scheduler a sweep spec names, as Ray Tune objects.

Every scheduler runs on the trials' reported ``round``; the spec counts its times in
evaluations (``eval_every`` rounds each), and ``max_t`` is at most the run's length, so
no scheduler cuts a trial that would finish. Model-based searchers are seeded with the
base config's seed, so a sweep proposes the same trials when run again.
"""

from __future__ import annotations

from typing import Any

from raycobo.config import Config, ConfigError
from raycobo.tune.space import SweepSpec, tune_space

INSTALL = "pip install 'raycobo[tune-search]'"


def searcher(spec: SweepSpec, base: Config):
    """None for Tune's own generator (random sampling and grid expansion)."""
    if spec.search == "optuna":
        try:
            import optuna  # noqa: F401
            from ray.tune.search.optuna import OptunaSearch
        except ImportError:
            raise ConfigError(
                f"invalid sweep key 'search': optuna is not installed ({INSTALL})"
            ) from None
        return OptunaSearch(seed=base.seed)
    if spec.search == "hyperopt":
        try:
            import hyperopt  # noqa: F401
            from ray.tune.search.hyperopt import HyperOptSearch
        except ImportError:
            raise ConfigError(
                f"invalid sweep key 'search': hyperopt is not installed ({INSTALL})"
            ) from None
        return HyperOptSearch(random_state_seed=base.seed)
    return None


def scheduler(spec: SweepSpec, base: Config):
    from ray.tune import schedulers as ts

    s, every, horizon = spec.scheduler, base.eval_every, base.rounds
    max_t = min(horizon, s.max_t * every) if s.max_t else horizon
    grace = min(s.grace_period * every, max_t)
    if s.kind == "asha":
        return ts.ASHAScheduler(
            time_attr="round",
            max_t=max_t,
            grace_period=grace,
            reduction_factor=s.reduction_factor,
        )
    if s.kind == "hyperband":
        return ts.HyperBandScheduler(
            time_attr="round", max_t=max_t, reduction_factor=s.reduction_factor
        )
    if s.kind == "median":
        return ts.MedianStoppingRule(
            time_attr="round", grace_period=grace, min_samples_required=s.min_samples_required
        )
    if s.kind == "pbt":
        return ts.PopulationBasedTraining(
            time_attr="round",
            perturbation_interval=s.perturbation_interval * every,
            hyperparam_mutations=mutations(spec),
            quantile_fraction=s.quantile_fraction,
            resample_probability=s.resample_probability,
            synch=s.synch,
        )
    return ts.FIFOScheduler()


def mutations(spec: SweepSpec) -> dict[str, Any]:
    """PBT's explore space: every non-grid key with its distribution (a choice: its list)."""
    space = tune_space(spec)
    out: dict[str, Any] = {}
    for key, dist in spec.space.items():
        kind, arg = next(iter(dist.items()))
        if kind == "grid":
            continue
        out[key] = list(arg) if kind == "choice" else space[key]
    return out


def grid_size(spec: SweepSpec) -> int:
    """Trials per sample: Tune expands every grid key (the product of their lengths)."""
    size = 1
    for dist in spec.space.values():
        kind, arg = next(iter(dist.items()))
        if kind == "grid":
            size *= len(arg)
    return size


def describe(spec: SweepSpec) -> str:
    """``search random, scheduler asha (grace 3 evaluations, factor 2)`` for the start line."""
    s = spec.scheduler
    shown = {
        "asha": f" (grace {s.grace_period} evaluations, factor {s.reduction_factor:g})",
        "hyperband": f" (factor {s.reduction_factor:g})",
        "median": f" (grace {s.grace_period} evaluations)",
        "pbt": f" (every {s.perturbation_interval} evaluations, quantile {s.quantile_fraction:g})",
    }.get(s.kind, "")
    return f"search {spec.search}, scheduler {s.kind}{shown}"
