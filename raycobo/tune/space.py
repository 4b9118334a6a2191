"""Sweep specifications (``tune_spaces/*.yaml``): a base config plus a search space.

```yaml
# raycobo sweep tune_spaces/cobo_cross_silo.yaml
base: ../examples/quickstart.yaml     # path relative to this file, or an inline mapping
overrides: {rounds: 300}              # dotted overrides applied to the base
space:                                # dotted config keys -> Tune distributions
  algorithm.rho: {loguniform: [0.01, 0.3]}
  algorithm.gamma: {choice: [0.01, 0.1, 1.0]}
  algorithm.sampling: {grid: [constant, time, mixed]}
metric: mean_accuracy
mode: max
scheduler: {kind: asha, grace_period: 2}  # fifo | asha | hyperband | median | pbt
search: random                         # random | grid | optuna | hyperopt
evaluate_on: validation                # trials scored on validation; best then run on test
num_samples: 8
max_concurrent: 2
resources: {cpu: 1, gpu: 0}
smoke: {rounds: 20, num_samples: 2}   # what --smoke-test uses
max_failures: 2                        # retries of a failed trial, from its checkpoint
time_budget_s: 3600                    # optional bound on the whole sweep
```

Every key of ``space`` is checked against the config schema with each value the
distribution can take at its bounds, and against every method the space sweeps
(``algorithm.name``): a setting that one of them does not have would make a flat,
meaningless sweep. Bad keys and bounds are one-line errors naming them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from raycobo.algorithms import build_algorithm
from raycobo.config import (
    Config,
    ConfigError,
    apply_overrides,
    read_config_tree,
    read_yaml,
    validate,
    with_overrides,
)

MODEL_BASED = ("optuna", "hyperopt")  # searchers that model the space (no grids)
DISTRIBUTIONS = ("choice", "grid", "uniform", "loguniform", "randint", "quniform")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# which scheduler reads which of SchedulerSpec's keys (a key set for another is refused)
SCHEDULER_KEYS = {
    "fifo": set(),
    "asha": {"grace_period", "reduction_factor", "max_t"},
    "hyperband": {"reduction_factor", "max_t"},
    "median": {"grace_period", "min_samples_required"},
    "pbt": {"perturbation_interval", "quantile_fraction", "resample_probability", "synch"},
}


class SchedulerSpec(_Strict):
    """When trials are stopped early (or, for PBT, continued from a better trial's
    checkpoint with perturbed settings). Times are counted in *evaluations* (every
    ``eval_every`` rounds); a scheduler never cuts a trial's last evaluation short."""

    kind: Literal["fifo", "asha", "hyperband", "median", "pbt"] = Field(
        default="fifo", description="the trial scheduler (fifo: every trial runs to its end)"
    )
    grace_period: int = Field(
        default=1, ge=1, description="asha, median: evaluations before a trial may be stopped"
    )
    reduction_factor: float = Field(
        default=2.0, gt=1, description="asha, hyperband: 1 / the share kept at each rung"
    )
    max_t: int | None = Field(
        default=None,
        ge=1,
        description="asha, hyperband: the longest a trial runs, in evaluations; null: the run",
    )
    min_samples_required: int = Field(
        default=3, ge=1, description="median: trials that report before one is compared"
    )
    perturbation_interval: int = Field(
        default=2, ge=1, description="pbt: evaluations between exploit/explore steps"
    )
    quantile_fraction: float = Field(
        default=0.25, gt=0, le=0.5, description="pbt: the bottom share that copies the top"
    )
    resample_probability: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="pbt: chance an explored value is drawn anew instead of perturbed",
    )
    synch: bool = Field(
        default=False,
        description="pbt: every trial reaches a perturbation point before any goes on "
        "(which trial continues from which then does not depend on timing; slower)",
    )

    @model_validator(mode="after")
    def _keys_of_its_kind(self) -> SchedulerSpec:
        unread = sorted(self.model_fields_set - {"kind"} - SCHEDULER_KEYS[self.kind])
        if unread:
            raise ValueError(
                f"'{unread[0]}' does nothing with kind {self.kind} (it reads: "
                f"{', '.join(sorted(SCHEDULER_KEYS[self.kind])) or 'no other key'})"
            )
        return self


class ResourceSpec(_Strict):
    cpu: float = Field(default=1.0, ge=0, description="CPUs each trial reserves")
    gpu: float = Field(default=0.0, ge=0, description="GPUs (a share) each trial reserves")


class SmokeSpec(_Strict):
    rounds: int = Field(default=20, ge=1, description="--smoke: rounds of each trial")
    num_samples: int = Field(default=2, ge=1, description="--smoke: trials")
    eval_every: int | None = Field(
        default=None, ge=1, description="--smoke: rounds between evaluations"
    )


class SweepSpec(_Strict):
    """A sweep file: a base config, the space searched over and how trials run."""

    base: str | dict[str, Any] | None = Field(
        default=None, description="the experiment YAML (relative to this file) or a mapping"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="dotted keys set on the base for every trial"
    )
    space: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="dotted key -> one distribution: choice, grid, uniform, loguniform, "
        "randint, quniform",
    )
    # what a trial reports to Tune (sweep.REPORTED): a name outside it would be NaN in
    # every trial, so it is refused before anything runs
    metric: Literal["mean_accuracy", "mean_loss", "w_within", "w_across"] = Field(
        default="mean_accuracy", description="what trials are ranked by"
    )
    mode: Literal["min", "max"] = Field(default="max", description="the better direction")
    scheduler: SchedulerSpec = Field(
        default_factory=SchedulerSpec, description="early stopping of trials"
    )
    search: Literal["random", "grid", "optuna", "hyperopt"] = Field(
        default="random",
        description="random and grid: Tune's own generator (grid keys expanded, the others "
        "sampled); optuna, hyperopt: model-based search (pip install "
        "'raycobo[tune-search]'), which sample every key ('grid' is refused there)",
    )
    evaluate_on: Literal["validation", "test"] = Field(
        default="validation",
        description="what trials are scored on: each client's validation part, after which "
        "the best configuration runs once on the test split (the sweep's reported result); "
        "or test, choosing on the numbers then reported (marked so in every output)",
    )
    num_samples: int = Field(default=4, ge=1, description="trials (each grid point's)")
    max_concurrent: int | None = Field(
        default=None, ge=1, description="trials at once; null: as the resources allow"
    )
    resources: ResourceSpec = Field(
        default_factory=ResourceSpec, description="what each trial reserves"
    )
    smoke: SmokeSpec = Field(default_factory=SmokeSpec, description="what --smoke runs")
    name: str | None = Field(
        default=None, description="the sweep's folder; null: the base's name + -sweep"
    )
    max_failures: int = Field(
        default=2, ge=0, description="retries of a failed trial from its last checkpoint"
    )
    time_budget_s: float | None = Field(
        default=None, gt=0, description="seconds for the whole sweep; trials then running stop"
    )


def _bounds_values(key: str, dist: dict[str, Any]) -> list[Any]:
    """Validate one distribution; return the values to check against the config schema."""
    if len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
        raise ConfigError(
            f"invalid sweep space 'space.{key}': give one of {', '.join(DISTRIBUTIONS)} "
            f"(got {list(dist)})"
        )
    kind, arg = next(iter(dist.items()))
    where = f"invalid sweep space 'space.{key}'"
    if kind in ("choice", "grid"):
        if not isinstance(arg, list) or not arg:
            raise ConfigError(f"{where}: {kind} needs a non-empty list of values")
        return list(arg)
    if not isinstance(arg, list) or len(arg) != (3 if kind == "quniform" else 2):
        raise ConfigError(f"{where}: {kind} needs [low, high{', q' if kind == 'quniform' else ''}]")
    lo, hi = arg[0], arg[1]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in arg):
        raise ConfigError(f"{where}: {kind} bounds must be numbers (got {arg})")
    if not lo < hi:
        raise ConfigError(f"{where}: {kind} needs low < high (got {arg})")
    if kind == "loguniform" and lo <= 0:
        raise ConfigError(f"{where}: loguniform needs 0 < low (got {arg})")
    if kind == "randint":
        if not (isinstance(lo, int) and isinstance(hi, int)):
            raise ConfigError(f"{where}: randint bounds must be integers (got {arg})")
        return [lo, hi - 1]
    return [lo, hi]


def load_sweep(
    path: str | Path, overrides: list[str] | dict[str, Any] | None = None
) -> tuple[SweepSpec, Config]:
    """Read a sweep YAML, resolve and validate its base config and its search space.

    ``overrides`` (dotted key=value) apply to the base config."""
    p = Path(path)
    spec = read_spec(p)
    if isinstance(spec.base, str):
        base_tree = read_config_tree((p.parent / spec.base).resolve())
    else:
        base_tree = dict(spec.base or {})
    apply_overrides(base_tree, dict(spec.overrides))
    apply_overrides(base_tree, overrides or [])
    base = validate(base_tree)
    check_space(spec, base, p)
    check_search(spec)
    return spec, base


def read_spec(p: Path) -> SweepSpec:
    """A sweep YAML as a SweepSpec (bad keys are one-line errors naming the file)."""
    tree = read_yaml(p)
    try:
        return SweepSpec.model_validate(tree)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"unknown sweep key '{loc}' in {p}") from None
        raise ConfigError(f"invalid sweep key '{loc}' in {p}: {first['msg']}") from None


def check_space(spec: SweepSpec, base: Config, p: Path) -> None:
    """Every key of the space, at its bounds, against the base config and every method
    the space sweeps, as a config and as the method built for the base's rounds."""
    if not spec.space:
        raise ConfigError(f"sweep {p} has an empty 'space': nothing to search")
    # a space that sweeps the method checks every other key against each method
    names = spec.space.get("algorithm.name")
    methods = [None] if names is None else _bounds_values("algorithm.name", names)
    for key, dist in spec.space.items():
        for value in _bounds_values(key, dist):
            for method in methods:
                point = {key: value} if method is None else {"algorithm.name": method, key: value}
                try:
                    cfg = with_overrides(base, point)
                    # the method's own checks against the run (fedavg_ft's ft_steps < rounds)
                    build_algorithm(cfg.algorithm, cfg.rounds, cfg.seed)
                except ConfigError as err:
                    raise ConfigError(f"invalid sweep space 'space.{key}': {err}") from None


def tune_space(spec: SweepSpec) -> dict[str, Any]:
    """The Tune param_space: dotted config keys -> Tune distributions."""
    from ray import tune

    out: dict[str, Any] = {}
    for key, dist in spec.space.items():
        kind, arg = next(iter(dist.items()))
        if kind == "choice":
            out[key] = tune.choice(arg)
        elif kind == "grid":
            out[key] = tune.grid_search(arg)
        elif kind == "uniform":
            out[key] = tune.uniform(*arg)
        elif kind == "loguniform":
            out[key] = tune.loguniform(*arg)
        elif kind == "quniform":
            out[key] = tune.quniform(*arg)
        elif kind == "randint":
            out[key] = tune.randint(*arg)
    return out


def check_search(spec: SweepSpec) -> None:
    """What the searcher and the scheduler can do with this space (before anything runs)."""
    kinds = {key: next(iter(dist)) for key, dist in spec.space.items()}
    grids = [k for k, kind in kinds.items() if kind == "grid"]
    if spec.scheduler.kind == "pbt" and spec.search in MODEL_BASED:
        raise ConfigError(
            f"invalid sweep key 'search': pbt explores by itself; use search: random "
            f"(not {spec.search})"
        )
    if spec.search in MODEL_BASED and grids:
        raise ConfigError(
            f"invalid sweep space 'space.{grids[0]}': search {spec.search} samples every "
            "key and expands no grid; give it as {choice: [...]}, or use search: random"
        )
    if spec.scheduler.kind != "pbt":
        return
    for key in kinds:
        if not key.startswith("algorithm.") or key == "algorithm.name":
            raise ConfigError(
                f"invalid sweep space 'space.{key}': pbt continues a trial from another's "
                "checkpoint with perturbed values, which only a method's own settings "
                "(algorithm.*, not algorithm.name) can change mid-run"
            )
    if not [k for k, kind in kinds.items() if kind != "grid"]:
        raise ConfigError(
            "invalid sweep key 'scheduler': pbt needs a key to perturb (a choice or a "
            "range; grid keys stay fixed per trial)"
        )


VALIDATION_SHARE = 0.2  # held out for scoring where the config holds out nothing


def tuning_base(cfg: Config) -> Config:
    """A config scored on validation data (held out if it held out nothing): what a
    sweep's trials and a comparison's tuning are scored on."""
    share = cfg.validation_fraction() or VALIDATION_SHARE
    return with_overrides(
        cfg, {"data.validation_fraction": share, "data.evaluate_on": "validation"}
    )
