"""``raycobo sweep``: Ray Tune over dotted config keys, every trial tracked in MLflow.

Each trial runs the same code as ``raycobo run`` (``run_experiment``) on its sampled
config, reports every evaluation to Tune (so ASHA can stop bad trials early), and logs
an MLflow run nested under the sweep's parent run. At the end the best trial's resolved
config is written as ``best_config.yaml``, which ``raycobo run`` accepts as is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
import typing
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from raycobo.config import (
    Config,
    ConfigError,
    engine_keys_before_rounds,
    validate,
    with_overrides,
)
from raycobo.lifecycle.callbacks import BaseCallback, RunContext
from raycobo.tune.console import console_to_log, sampled_values, trial_lines, trial_number
from raycobo.tune.space import SweepSpec, tune_space

REPORTED = typing.get_args(SweepSpec.model_fields["metric"].annotation)  # what trials report


class TuneReporter(BaseCallback):
    """Reports every evaluation to Tune; ``round`` becomes the scheduler's time axis.
    The sweep's metric is always present (NaN when a diverging run has no value). When
    the run wrote a checkpoint at this round, it goes with the report, so Tune can
    restart the trial from it (a retry, or ``raycobo sweep --resume``)."""

    def __init__(self, metric: str):
        self.metric = metric

    def on_eval(self, ctx: RunContext, round: int, metrics: dict[str, Any]) -> None:
        from ray import tune

        report = {k: metrics[k] for k in REPORTED if metrics.get(k) is not None}
        report.setdefault(self.metric, float("nan"))
        report["round"] = round
        if ctx.checkpoint is None or ctx.checkpoint[0] != round:
            tune.report(report)
            return
        with tempfile.TemporaryDirectory(prefix="raycobo-ckpt-") as tmp:
            path = ctx.checkpoint[1]
            shutil.copy2(path, Path(tmp) / path.name)
            tune.report(report, checkpoint=tune.Checkpoint.from_directory(tmp))


def _take_tune_checkpoint(out: Path, kept: Path | None = None) -> bool:
    """A restarted trial: the checkpoint Tune hands back goes into the run directory's
    checkpoints/; without one, the checkpoints of the trial's own run that the sweep
    folder kept (``kept``: Tune's saved state can miss the newest checkpoint when the
    sweep is stopped while a trial reports it, and the trial would start over). ->
    whether the trial continues a run (resume)"""
    from ray import tune

    from raycobo.lifecycle.checkpoint import list_checkpoints

    def take(folder: Path) -> bool:
        found = list_checkpoints(folder)
        for _, path in found:
            (out / "checkpoints").mkdir(parents=True, exist_ok=True)
            target = out / "checkpoints" / path.name
            if not target.exists():
                shutil.copy2(path, target)
        return bool(found)

    given = tune.get_checkpoint()
    if given is not None:
        with given.as_directory() as d:
            take(Path(d))
        return True
    taken = kept is not None and kept.resolve() != out.resolve() and take(kept / "checkpoints")
    return (out / "config.yaml").is_file() or taken


def trial(params: dict[str, Any]) -> None:
    """The Tune trainable: ``params`` holds the resolved base config and the sampled keys.
    A config the sampled values make invalid ends the trial with its one-line error
    (reported as ``config_error``) instead of raising: a retry could not succeed."""
    from ray import tune

    from raycobo.lifecycle.experiment import run_experiment
    from raycobo.tracking import MLflowTracker

    try:
        base = validate(engine_keys_before_rounds(params["__base__"]))  # a sweep from before
        sampled = {k: v for k, v in params.items() if not k.startswith("__")}
        cfg = with_overrides(base, sampled)
        callbacks: list[Any] = [TuneReporter(params["__metric__"])]
        out = Path(tune.get_context().get_trial_dir()) / "run"
        # the run works in Ray's session folder; Tune keeps it in the sweep's own
        kept = Path(params["__storage__"]) / out.parent.name / "run"
        if cfg.tracking.enabled:
            name = trial_name(cfg.name, tune.get_context().get_trial_id(), sampled)
            callbacks.append(
                MLflowTracker(
                    cfg.tracking, run_name=name, parent=params["__parent__"], run_dir=kept
                )
            )
        run_experiment(cfg, out, callbacks, resume=_take_tune_checkpoint(out, kept))
    except ConfigError as err:
        tune.report({params["__metric__"]: float("nan"), "config_error": str(err)})


def trial_name(base_name: str, trial_id: str, sampled: dict[str, Any]) -> str:
    """A trial's MLflow run name: its number and its sampled values, shortest first
    (``quad #3 lr=0.1 sampling=full``), so the runs list shows what each trial tried."""
    return f"{base_name} #{trial_number(trial_id)} {sampled_values(sampled)}".strip()[:250]


def _scheduler(spec: SweepSpec, base: Config):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    s = spec.scheduler
    if s.kind == "asha":
        evals = max(1, base.rounds // base.eval_every)
        return ASHAScheduler(
            time_attr="training_iteration",
            max_t=s.max_t or evals + 1,
            grace_period=s.grace_period,
            reduction_factor=s.reduction_factor,
        )
    return FIFOScheduler()


def _search(spec: SweepSpec):
    if spec.search == "optuna":
        try:
            from ray.tune.search.optuna import OptunaSearch
        except ImportError:
            raise ConfigError(
                "invalid sweep key 'search': optuna is not installed (pip install optuna)"
            ) from None
        return OptunaSearch()
    return None  # Tune's default generator: random sampling and grid expansion


def _grid_size(spec: SweepSpec) -> int:
    """Trials per sample: Tune expands every grid key (the product of their lengths;
    with optuna, grids are not expanded)."""
    if spec.search == "optuna":
        return 1
    size = 1
    for dist in spec.space.values():
        kind, arg = next(iter(dist.items()))
        if kind == "grid":
            size *= len(arg)
    return size


def _trial_plan(spec: SweepSpec, base: Config):
    """The host layout of a trial on the Ray engine; ``auto`` is sized to the trial's own
    resources (``resources.cpu`` CPUs for its hosts), not to the whole instance."""
    from raycobo.engine.ray import plan_hosts

    n = sum(base.data.partition.cluster_sizes())
    own = {"CPU": max(1.0, spec.resources.cpu), "GPU": spec.resources.gpu}
    return plan_hosts(base.engine, n, own, own, fixed=False)


def _resources(spec: SweepSpec, base: Config):
    from ray import tune

    if base.engine.kind != "ray":
        return {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    # a trial on the Ray engine: one bundle for the trial, one per client host
    plan = _trial_plan(spec, base)
    per_host = {"CPU": plan.cpus_per_actor, "GPU": plan.gpus_per_client * plan.clients_per_actor}
    bundles = [{"CPU": spec.resources.cpu, "GPU": spec.resources.gpu}] + [per_host] * plan.hosts
    return tune.PlacementGroupFactory(bundles)


SWEEP_FILE = "sweep.yaml"  # the resolved sweep: spec, base config, samples (for --resume)
STATE_FILE = "sweep_state.json"  # the MLflow parent run, digests of Tune's files


def _sweep_root(spec: SweepSpec, base: Config, out: Path | None) -> tuple[Path, str]:
    from raycobo.lifecycle.files import fresh_dir

    name = spec.name or f"{base.name}-sweep"
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        return out.resolve(), name
    return fresh_dir(Path("runs") / f"{datetime.now():%Y%m%d-%H%M%S}-{name}").resolve(), name


def run_sweep(
    spec: SweepSpec,
    base: Config,
    out: Path | None = None,
    num_samples: int | None = None,
    smoke_test: bool = False,
) -> dict[str, Any]:
    """A new sweep into ``out`` (default ``runs/<time>-<name>``). Everything it needs to
    be resumed goes into the sweep directory (``sweep.yaml``)."""
    if smoke_test:
        over: dict[str, Any] = {"rounds": min(base.rounds, spec.smoke.rounds)}
        ev = spec.smoke.eval_every or max(1, over["rounds"] // 4)
        over["eval_every"] = min(base.eval_every, ev)
        base = with_overrides(base, over)
        num_samples = min(num_samples or spec.num_samples, spec.smoke.num_samples)
    samples = num_samples or spec.num_samples
    root, name = _sweep_root(spec, base, out)
    if (root / SWEEP_FILE).exists():
        raise ConfigError(
            f"{root} already holds a sweep; continue it with: raycobo sweep --resume {root}"
        )
    base = _trial_base(spec, base)
    record = {"name": name, "num_samples": samples, "spec": spec.model_dump(mode="json")}
    record["base"] = base.to_dict()
    (root / SWEEP_FILE).write_text(yaml.safe_dump(record, sort_keys=False))
    return _launch(spec, base, root, name, samples, False)


def resume_sweep(root: Path, trust_files: bool = False) -> dict[str, Any]:
    """Continue a sweep from its directory alone: the unfinished and failed trials go on
    from their checkpoints with the settings the sweep started with."""
    from raycobo.lifecycle.trust import check_trusted

    root = Path(root).resolve()
    if not (root / SWEEP_FILE).is_file() or not (root / "tune").is_dir():
        raise ConfigError(f"nothing to resume in {root}: no {SWEEP_FILE} and tune/ there")
    check_trusted(root, "sweep directory", tree=True)
    if not trust_files:
        check_tune_files(root)
    record = yaml.safe_load((root / SWEEP_FILE).read_text())
    # the base is the config as given (not pinned): only the renamed engine keys are read
    # as the version that wrote them ran them
    base = validate(engine_keys_before_rounds(record["base"]))
    spec = SweepSpec.model_validate(record["spec"])
    return _launch(spec, base, root, record["name"], record["num_samples"], True)


def tune_digests(root: Path) -> dict[str, str]:
    """Digests of Tune's own files under ``root/tune`` (what Tune unpickles on restore);
    the trials' raycobo run directories (checkpoints read with weights_only) are left out."""
    from raycobo.lifecycle.trust import digests

    return digests(root / "tune", skip=lambda p: "run" in p.relative_to(root / "tune").parts)


def signed_record(root: Path, digests: dict[str, str]) -> dict[str, Any]:
    """What a sweep signs when it stops: Tune's files and the resolved sweep (its base
    config names the plugins a resume imports)."""
    sweep = hashlib.sha256((root / SWEEP_FILE).read_bytes()).hexdigest()
    return {"tune_digests": digests, "sweep_yaml": sweep}


def check_tune_files(root: Path) -> None:
    """Tune's files and sweep.yaml must be those this sweep recorded and signed with
    this user's key when it last stopped; no symbolic link anywhere under the sweep."""
    from raycobo.lifecycle.trust import signed_by_me, symlinks

    links = symlinks(root)
    if links:
        raise ConfigError(
            f"refusing to resume {root}: {links[0]} is a symbolic link (a sweep writes none, "
            "and Tune would read what it points to); --trust-files resumes anyway"
        )
    state = json.loads((root / STATE_FILE).read_text()) if (root / STATE_FILE).is_file() else {}
    recorded = state.get("tune_digests")
    if recorded is None:
        raise ConfigError(
            f"refusing to resume {root}: {STATE_FILE} records no digests of Tune's files (the "
            "sweep was killed before it could write them); if you trust the directory, "
            "resume with --trust-files"
        )
    if not signed_by_me(signed_record(root, recorded), state.get("signature")):
        raise ConfigError(
            f"refusing to resume {root}: its record of Tune's files and {SWEEP_FILE} is not "
            "signed with your key (written by someone else's raycobo, an older version, "
            "or edited); Tune unpickles those files, so they are trusted like code "
            "(--trust-files resumes anyway)"
        )
    now = tune_digests(root)
    changed = sorted(k for k in set(now) | set(recorded) if now.get(k) != recorded.get(k))
    if changed:
        shown = ", ".join(changed[:4]) + (", ..." if len(changed) > 4 else "")
        raise ConfigError(
            f"refusing to resume {root}: Tune's files changed since the sweep stopped "
            f"({shown}); Tune unpickles them, so they are trusted like code (--trust-files "
            "resumes anyway)"
        )


def _launch(spec, base, root: Path, name: str, samples: int, resume: bool) -> dict:
    """The MLflow parent, Tune's fit, and the digests of Tune's files however it ends."""
    from ray import tune

    from raycobo.engine.ray import start_ray

    with console_to_log(root):  # Ray's and Tune's chatter into sweep.log
        start_ray(base)
        return _tracked_fit(spec, base, root, name, samples, resume, tune)


def _tracked_fit(spec, base, root: Path, name: str, samples: int, resume: bool, tune):
    from raycobo.tracking import MLflowTracker, ParentRole

    state = json.loads((root / STATE_FILE).read_text()) if (root / STATE_FILE).is_file() else {}
    parent = None
    if base.tracking.enabled:
        role = ParentRole(
            "sweep",
            {
                "sweep.metric": f"{spec.metric} ({spec.mode})",
                "sweep.search": spec.search,
                "sweep.num_samples": samples,
                **{f"sweep.space.{k}": json.dumps(v) for k, v in spec.space.items()},
            },
            varied=tuple(spec.space),
        )
        parent = MLflowTracker(base.tracking, run_name=name, role=role)
        pctx = RunContext(base, root)
        pctx.resumed_mlflow_run_id = state.get("mlflow_parent") if resume else None
        parent.on_run_start(pctx)
    state = {"mlflow_parent": parent.run_id if parent is not None else None}
    (root / STATE_FILE).write_text(json.dumps(state))
    try:
        lines = trial_lines(tune, samples * _grid_size(spec), spec.metric)
        results = _fit(spec, base, root, samples, resume, state["mlflow_parent"], tune, lines)
        summary = _summarize(spec, root, name, results, state["mlflow_parent"])
    except BaseException as err:
        if parent is not None:
            status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
            with contextlib.suppress(Exception):
                parent.on_run_end(RunContext(base, root), {"status": status})
        raise
    finally:
        with contextlib.suppress(OSError, ConfigError):  # unsigned: resumed only if trusted
            from raycobo.lifecycle.trust import sign

            state["tune_digests"] = tune_digests(root)
            state["signature"] = sign(signed_record(root, state["tune_digests"]))
            (root / STATE_FILE).write_text(json.dumps(state))
    if parent is not None:
        status = "interrupted" if summary["interrupted"] else "completed"
        best = summary["best"]
        if best is not None:
            parent.log_summary_metrics({f"best_{spec.metric}": best["metrics"][spec.metric]})
        parent.on_run_end(RunContext(base, root), {"status": status})
        parent.log_files([root / "sweep_summary.json"])
    summary["root"] = str(root)
    return summary


def _trial_base(spec: SweepSpec, base: Config) -> Config:
    """The base config every trial starts from: tracking locations every process finds,
    and on the Ray engine the host layout that the trial's bundles hold."""
    from raycobo.engine.ray import with_host_plan
    from raycobo.tracking.mlflow_tracker import absolute_locations

    base = with_overrides(base, absolute_locations(base.tracking))
    if base.engine.kind == "ray":
        base = with_host_plan(base, _trial_plan(spec, base))
    return base


def _fit(spec, base, root: Path, samples: int, resume: bool, parent_id, tune, lines=None):
    """Run (or restore) the Tuner; ``lines``: a callback printing each finished trial
    (a restored Tuner keeps its own callbacks). -> its ResultGrid"""
    trainable = tune.with_resources(trial, _resources(spec, base))
    if resume:
        tuner = tune.Tuner.restore(str(root / "tune"), trainable=trainable, resume_errored=True)
    else:
        space = tune_space(spec)
        space["__base__"] = base.to_dict()
        space["__parent__"] = parent_id
        space["__metric__"] = spec.metric
        space["__storage__"] = str(root / "tune")  # where Tune keeps the trials' folders
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                metric=spec.metric,
                mode=spec.mode,
                scheduler=_scheduler(spec, base),
                search_alg=_search(spec),
                num_samples=samples,
                max_concurrent_trials=spec.max_concurrent,
                time_budget_s=spec.time_budget_s,
            ),
            run_config=tune.RunConfig(
                name="tune",
                storage_path=str(root),
                verbose=0,
                callbacks=[lines] if lines is not None else None,
                failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=base.checkpoint.keep),
            ),
        )
    return tuner.fit()


def _saved_statuses(path: Path) -> dict[str, tuple[str, str]]:
    """Every trial's id and status in the saved experiment state, by its folder's name.
    (After a Ctrl-C,
    Tune's live results call the stopped trials terminated; its saved state, which
    --resume reads, keeps them pending.)"""
    from ray.tune import ExperimentAnalysis

    return {Path(t.path).name: (t.trial_id, t.status) for t in ExperimentAnalysis(str(path)).trials}


def _trial_rows(results, statuses: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        metrics = r.metrics or {}
        live = (metrics.get("trial_id"), "TERMINATED" if r.error is None else "ERROR")
        tid, saved = statuses.get(Path(r.path).name, live)
        if r.error is not None or metrics.get("config_error") or saved == "ERROR":
            status = "error"
        elif saved == "TERMINATED":
            status = "completed"
        else:  # stopped before its last round (Ctrl-C, time budget)
            status = "interrupted"
        error = metrics.get("config_error") or (
            str(r.error).strip().splitlines()[-1][:300] if r.error else None
        )
        rows.append(
            {
                "trial_id": tid,
                "config": {k: v for k, v in (r.config or {}).items() if not k.startswith("__")},
                "metrics": {k: metrics.get(k) for k in (*REPORTED, "round")},
                "status": status,
                "error": error,
                "node": metrics.get("node_ip"),  # where its last result came from
                "path": r.path,
            }
        )
    return rows


def _summarize(spec, root: Path, name: str, results, parent_id) -> dict[str, Any]:
    """sweep_summary.json, and best_config.yaml: the config the best finished trial ran."""
    trials = _trial_rows(results, _saved_statuses(root / "tune"))
    ok = [
        t
        for t in trials
        if t["status"] == "completed" and t["metrics"].get(spec.metric) is not None
    ]
    best = None
    (root / "best_config.yaml").unlink(missing_ok=True)  # of an earlier, unfinished fit
    if ok:
        pick = max if spec.mode == "max" else min
        best = pick(ok, key=lambda t: t["metrics"][spec.metric])
        ran = Path(best["path"]) / "run" / "config.yaml"
        (root / "best_config.yaml").write_text(
            f"# raycobo run {root / 'best_config.yaml'}\n"
            f"# the config of the best finished trial of sweep '{name}' by {spec.metric} "
            f"({spec.mode}): {best['metrics'][spec.metric]}\n" + ran.read_text()
        )
    summary = {
        "name": name,
        "metric": spec.metric,
        "mode": spec.mode,
        "num_trials": len(trials),
        "failed": sum(t["status"] == "error" for t in trials),
        "interrupted": sum(t["status"] == "interrupted" for t in trials),
        "best": best,
        "best_config": str(root / "best_config.yaml") if best else None,
        "mlflow_parent_run_id": parent_id,
        "trials": trials,
    }
    (root / "sweep_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
