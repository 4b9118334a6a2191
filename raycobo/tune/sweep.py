"""``raycobo sweep``: Ray Tune over dotted config keys, every trial tracked in MLflow.

Each trial runs the same code as ``raycobo run`` (``run_experiment``) on its sampled
config, reports every evaluation to Tune (so ASHA can stop bad trials early), and logs
an MLflow run nested under the sweep's parent run. At the end the best trial's resolved
config is written as ``best_config.yaml``, which ``raycobo run`` accepts as is.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from raycobo.callbacks import BaseCallback, RunContext
from raycobo.config import Config, ConfigError, validate, with_overrides
from raycobo.tune.space import SweepSpec, tune_space

REPORTED = ("mean_accuracy", "mean_loss", "w_within", "w_across")


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


def _take_tune_checkpoint(out: Path) -> bool:
    """A restarted trial: the checkpoint Tune hands back goes into the run directory's
    checkpoints/. -> whether the trial continues a run (resume)."""
    from ray import tune

    from raycobo.checkpoint import list_checkpoints

    given = tune.get_checkpoint()
    if given is not None:
        with given.as_directory() as d:
            for _, path in list_checkpoints(Path(d)):
                (out / "checkpoints").mkdir(parents=True, exist_ok=True)
                target = out / "checkpoints" / path.name
                if not target.exists():
                    shutil.copy2(path, target)
    return (out / "config.yaml").is_file() or given is not None


def trial(params: dict[str, Any]) -> None:
    """The Tune trainable: ``params`` holds the resolved base config and the sampled keys."""
    from ray import tune

    from raycobo.experiment import run_experiment
    from raycobo.tracking import MLflowTracker

    base = validate(params["__base__"])
    sampled = {k: v for k, v in params.items() if not k.startswith("__")}
    cfg = with_overrides(base, sampled)
    callbacks: list[Any] = [TuneReporter(params["__metric__"])]
    if cfg.tracking.enabled:
        name = f"{cfg.name}-trial-{tune.get_context().get_trial_id()}"
        callbacks.append(MLflowTracker(cfg.tracking, run_name=name, parent=params["__parent__"]))
    out = Path(tune.get_context().get_trial_dir()) / "run"
    run_experiment(cfg, out, callbacks, resume=_take_tune_checkpoint(out))


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


def run_sweep(
    spec: SweepSpec,
    base: Config,
    out: Path | None = None,
    num_samples: int | None = None,
    smoke_test: bool = False,
    resume: Path | None = None,
    echo=print,
) -> dict[str, Any]:
    from ray import tune

    from raycobo.engine.ray import start_ray
    from raycobo.tracking import MLflowTracker

    if smoke_test:
        over: dict[str, Any] = {"rounds": min(base.rounds, spec.smoke.rounds)}
        ev = spec.smoke.eval_every or max(1, over["rounds"] // 4)
        over["eval_every"] = min(base.eval_every, ev)
        base = with_overrides(base, over)
        num_samples = min(num_samples or spec.num_samples, spec.smoke.num_samples)
    samples = num_samples or spec.num_samples
    name = spec.name or f"{base.name}-sweep"
    root = (resume or out or Path("runs") / f"{datetime.now():%Y%m%d-%H%M%S}-{name}").resolve()
    if resume is not None and not tune.Tuner.can_restore(str(root / "tune")):
        raise ConfigError(f"nothing to resume in {root / 'tune'}")
    root.mkdir(parents=True, exist_ok=True)
    start_ray(base)

    parent = None
    parent_id = None
    state_file = root / "sweep_state.json"  # the parent MLflow run, for --resume
    if base.tracking.enabled:
        parent = MLflowTracker(base.tracking, run_name=name)
        pctx = RunContext(base, root)
        if resume is not None and state_file.is_file():
            pctx.resumed_mlflow_run_id = json.loads(state_file.read_text()).get("mlflow_parent")
        parent.on_run_start(pctx)
        parent_id = parent.run_id
    state_file.write_text(json.dumps({"mlflow_parent": parent_id}))
    try:
        summary = _fit(spec, base, root, name, samples, resume, parent_id, tune)
    except BaseException as err:
        if parent is not None:
            status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
            with contextlib.suppress(Exception):
                parent.on_run_end(RunContext(base, root), {"status": status})
        raise
    if parent is not None:
        status = "interrupted" if summary["interrupted"] else "completed"
        parent.on_run_end(RunContext(base, root), {"status": status})
        if parent.enabled and parent.client is not None:
            with contextlib.suppress(Exception):
                parent.client.log_artifact(parent.run_id, str(root / "sweep_summary.json"))
    summary["root"] = str(root)
    return summary


def _unfinished_trials(path: Path) -> int:
    """Trials of the saved experiment state that neither ended nor failed. (After a
    Ctrl-C, Tune's live results call the stopped trials terminated; its saved state,
    which --resume reads, keeps them pending.)"""
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(str(path)).trials
    return sum(t.status not in ("TERMINATED", "ERROR") for t in trials)


def _fit(spec, base, root: Path, name: str, samples: int, resume, parent_id, tune):
    """Run (or restore) the Tuner; write best_config.yaml and sweep_summary.json."""

    # trials must find the sqlite store and artifacts whatever their working directory
    from raycobo.tracking.mlflow_tracker import resolve_uri

    base = with_overrides(
        base,
        {
            "tracking.uri": resolve_uri(base.tracking.uri),
            "tracking.artifact_root": str(Path(base.tracking.artifact_root).resolve())
            if "://" not in base.tracking.artifact_root
            else base.tracking.artifact_root,
        },
    )
    if base.engine.kind == "ray":  # trials place exactly the hosts their bundles hold
        plan = _trial_plan(spec, base)
        base = with_overrides(
            base,
            {
                "engine.clients_per_actor": plan.clients_per_actor,
                "engine.cpus_per_actor": plan.cpus_per_actor,
            },
        )
    trainable = tune.with_resources(trial, _resources(spec, base))
    if resume is not None:
        tuner = tune.Tuner.restore(str(root / "tune"), trainable=trainable, resume_errored=True)
    else:
        space = tune_space(spec)
        space["__base__"] = base.to_dict()
        space["__parent__"] = parent_id
        space["__metric__"] = spec.metric
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
                failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=base.checkpoint.keep),
            ),
        )
    results = tuner.fit()

    trials = []
    for r in results:
        sampled = {k: v for k, v in (r.config or {}).items() if not k.startswith("__")}
        metrics = {k: r.metrics.get(k) for k in (*REPORTED, "round") if r.metrics}
        trials.append(
            {
                "trial_id": (r.metrics or {}).get("trial_id"),
                "config": sampled,
                "metrics": metrics,
                "status": "error" if r.error else "completed",
                "error": str(r.error).strip().splitlines()[-1][:300] if r.error else None,
                "path": r.path,
            }
        )
    ok = [
        t
        for t in trials
        if t["status"] == "completed" and t["metrics"].get(spec.metric) is not None
    ]
    best = None
    if ok:
        pick = max if spec.mode == "max" else min
        best = pick(ok, key=lambda t: t["metrics"][spec.metric])
        best_cfg = with_overrides(base, best["config"])
        (root / "best_config.yaml").write_text(
            f"# raycobo run {root / 'best_config.yaml'}\n"
            f"# best of sweep '{name}' by {spec.metric} ({spec.mode}): "
            f"{best['metrics'][spec.metric]}\n" + best_cfg.to_yaml()
        )
    summary = {
        "name": name,
        "metric": spec.metric,
        "mode": spec.mode,
        "num_trials": len(trials),
        "failed": sum(t["status"] == "error" for t in trials),
        "best": best,
        "best_config": str(root / "best_config.yaml") if best else None,
        "mlflow_parent_run_id": parent_id,
        # trials neither finished nor failed: Tune stopped (Ctrl-C) before they ended
        "interrupted": _unfinished_trials(root / "tune") > 0,
        "trials": trials,
    }
    (root / "sweep_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
