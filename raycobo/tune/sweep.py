"""``raycobo sweep``: Ray Tune over dotted config keys, every trial tracked in MLflow.

Each trial runs the same code as ``raycobo run`` (``run_experiment``, see
``raycobo.tune.trial``) on its sampled config, scored on each client's validation part
unless the spec says ``evaluate_on: test``, and reports every evaluation to Tune (so a
scheduler can stop bad trials early). Each trial is an MLflow run nested under the
sweep's parent run. At the end the best trial's values run once on the test split
(``final/``): that is the sweep's result, and its config is ``best_config.yaml``, which
``raycobo run`` accepts as is; ``sweep_report.html`` shows the trials.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from raycobo.config import (
    WRITTEN_BY,
    Config,
    ConfigError,
    check_written_by,
    read_yaml,
    validate,
    with_overrides,
)
from raycobo.lifecycle.callbacks import RunContext
from raycobo.lifecycle.plugins import check_plugins, write_plugin_record
from raycobo.tune.console import console_to_log, trial_lines
from raycobo.tune.results import final_run, summarize, write_report, write_summary
from raycobo.tune.search import describe, grid_size, scheduler, searcher
from raycobo.tune.space import SweepSpec, check_search, tune_space, tuning_base
from raycobo.tune.trial import trainable
from raycobo.version import __version__


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
    final: bool = True,
) -> dict[str, Any]:
    """A new sweep into ``out`` (default ``runs/<time>-<name>``). Everything it needs to
    be resumed goes into the sweep directory (``sweep.yaml``). ``final``: run the best
    configuration once on the test split when trials were scored on validation (a
    comparison's tuning runs its entries itself)."""
    check_search(spec)
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
    base = _located(spec, base)
    _scored(spec, base)  # a base that cannot hold out validation data: refused now
    record = {"name": name, "num_samples": samples, "final": final}
    record["spec"] = spec.model_dump(mode="json", exclude_unset=True)
    record["base"] = base.to_dict()
    header = f"{WRITTEN_BY}{__version__}\n"  # the version that wrote it (check_written_by)
    (root / SWEEP_FILE).write_text(header + yaml.safe_dump(record, sort_keys=False))
    write_plugin_record(root, _named_code(record))  # what a resume may import
    return _launch(spec, base, root, name, samples, False, final)


def _named_code(record: dict[str, Any]) -> dict[str, Any]:
    """The sweep's base config with its search space beside it (a space can name a
    plugin method as a value): what the plugin record covers."""
    return {**record["base"], "sweep_space": record["spec"]}


def resume_sweep(root: Path, trust_files: bool = False) -> dict[str, Any]:
    """Continue a sweep from its directory alone: the unfinished and failed trials go on
    from their checkpoints with the settings the sweep started with (and then the final
    test run, continued where it stopped)."""
    from raycobo.lifecycle.trust import check_plain_files, check_trusted

    root = Path(root).resolve()
    if not (root / SWEEP_FILE).is_file() or not (root / "tune").is_dir():
        raise ConfigError(f"nothing to resume in {root}: no {SWEEP_FILE} and tune/ there")
    check_trusted(root, "sweep directory", tree=True)
    # a FIFO or device would hang Tune, trusted or not (links: check_tune_files)
    check_plain_files(root, "sweep directory", links=True)
    if not trust_files:
        check_tune_files(root)
    check_written_by(root / SWEEP_FILE)
    record = read_yaml(root / SWEEP_FILE)
    check_plugins(root, _named_code(record), "sweep directory", trust_files)
    base = validate(record["base"])  # the config as given (not pinned)
    spec = SweepSpec.model_validate(_recorded_spec(record["spec"]))
    final = record.get("final", True)
    return _launch(spec, base, root, record["name"], record["num_samples"], True, final)


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


def _recorded_spec(tree: dict[str, Any]) -> dict[str, Any]:
    """A spec as sweep.yaml recorded it; earlier versions wrote every scheduler key,
    also those its kind does not read (which a spec given now may not set)."""
    from raycobo.tune.space import SCHEDULER_KEYS

    sched = dict(tree.get("scheduler") or {})
    kind = sched.get("kind", "fifo")
    reads = SCHEDULER_KEYS.get(kind, set())
    sched = {k: v for k, v in sched.items() if k == "kind" or k in reads}
    return {**tree, "scheduler": sched}


def _launch(spec, base, root: Path, name: str, samples: int, resume: bool, final: bool):
    """The MLflow parent, Tune's fit, the final test run, and the digests of Tune's
    files however it ends."""
    from ray import tune

    from raycobo.engine.ray import start_ray

    print(_start_line(spec, base, root, name, samples, final), file=sys.stderr, flush=True)
    with console_to_log(root):  # Ray's and Tune's chatter into sweep.log
        start_ray(base)
        with _sigterm_as_sigint():
            return _tracked_fit(spec, base, root, name, samples, resume, final, tune)


@contextlib.contextmanager
def _sigterm_as_sigint():
    """SIGTERM (a scheduler, ``kill``) ends a sweep as Ctrl-C does: Tune stops its trials
    and saves its state, the trials read ``interrupted`` and ``--resume`` continues them
    (Ray's own SIGTERM handler, installed by ray.init, printed a stack and left trials
    ``running``)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum, frame):
        handler = signal.getsignal(signal.SIGINT)  # Tune's, while it fits
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _start_line(spec, base: Config, root: Path, name: str, samples: int, final: bool) -> str:
    """What the sweep is about to do, before Ray starts (which takes seconds)."""
    total = samples * grid_size(spec)
    where = "trials scored on the TEST split (evaluate_on: test)"
    if spec.evaluate_on == "validation":
        where = "trials scored on validation" + (", the best then run on test" if final else "")
    res = f"{spec.resources.cpu:g} CPU" + (
        f" + {spec.resources.gpu:g} GPU" if spec.resources.gpu else ""
    )
    at_once = f", {spec.max_concurrent} at once" if spec.max_concurrent else ""
    return (
        f"sweep {name}: {total} trials of {base.rounds} rounds, {describe(spec)}; "
        f"{where}; {res} a trial{at_once}; log: {root / 'sweep.log'}"
    )


def _tracked_fit(spec, base, root: Path, name, samples, resume: bool, final: bool, tune):
    from raycobo.tracking import MLflowTracker, ParentRole

    state = json.loads((root / STATE_FILE).read_text()) if (root / STATE_FILE).is_file() else {}
    parent = None
    if base.tracking.enabled:
        role = ParentRole(
            "sweep",
            {
                "sweep.metric": f"{spec.metric} ({spec.mode})",
                "sweep.search": spec.search,
                "sweep.scheduler": spec.scheduler.kind,
                "sweep.evaluate_on": spec.evaluate_on,
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
        lines = trial_lines(
            tune,
            samples * grid_size(spec),
            spec.metric,
            base.rounds,
            spec.scheduler.kind,
            spec.mode,
        )
        results = _fit(spec, base, root, samples, resume, state["mlflow_parent"], tune, lines)
        summary = summarize(spec, base, root, name, results, state["mlflow_parent"])
        finished = summary["best"] is not None and not summary["interrupted"]
        if final and finished and spec.evaluate_on == "validation":
            summary["test"] = final_run(spec, base, root, name, summary, state["mlflow_parent"])
            write_summary(root, summary)
        write_report(root, summary)
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
        _log_parent(parent, spec, base, root, summary)
    summary["root"] = str(root)
    return summary


def _log_parent(parent, spec: SweepSpec, base: Config, root: Path, summary: dict) -> None:
    """The parent MLflow run: the best trial's score (on the split it was chosen on), the
    final test score, the summary and the report."""
    status = "interrupted" if summary["interrupted"] else "completed"
    best, test = summary["best"], summary.get("test")
    metrics: dict[str, float | None] = {}
    if best is not None:
        metrics[f"best_{spec.metric}"] = best["metrics"][spec.metric]
    if test is not None:
        metrics[f"test_{spec.metric}"] = test[spec.metric]
    parent.log_summary_metrics(metrics)
    parent.on_run_end(RunContext(base, root), {"status": status})
    parent.log_files([root / "sweep_summary.json", root / "sweep_report.html"])


def _located(spec: SweepSpec, base: Config) -> Config:
    """The base config as the sweep keeps it: tracking locations every process finds,
    and on the Ray engine the host layout that the trial's bundles hold."""
    from raycobo.engine.ray import with_host_plan
    from raycobo.tracking.mlflow_tracker import absolute_locations

    base = with_overrides(base, absolute_locations(base.tracking))
    if base.engine.kind == "ray":
        base = with_host_plan(base, _trial_plan(spec, base))
    return base


def _scored(spec: SweepSpec, base: Config) -> Config:
    """The config every trial starts from: scored on validation (held out of each
    client's training data) unless the spec asks for the test split; under PBT, a
    checkpoint at every perturbation point (where it continues trials from)."""
    if spec.evaluate_on == "validation":
        base = tuning_base(base)
    else:
        base = with_overrides(base, {"data.evaluate_on": "test"})
    if spec.scheduler.kind == "pbt":  # a checkpoint at each point PBT may continue from
        every = spec.scheduler.perturbation_interval * base.eval_every
        base = with_overrides(base, {"checkpoint.every": every})
    return base


def _fit(spec, base, root: Path, samples: int, resume: bool, parent_id, tune, lines=None):
    """Run (or restore) the Tuner; ``lines``: a callback printing each finished trial
    (a restored Tuner keeps its own callbacks). -> its ResultGrid"""
    trainable_ = tune.with_resources(trainable(), _resources(spec, base))
    if resume:
        tuner = tune.Tuner.restore(str(root / "tune"), trainable=trainable_, resume_errored=True)
        return tuner.fit()
    space = tune_space(spec)
    space["__base__"] = _scored(spec, base).to_dict()
    space["__parent__"] = parent_id
    space["__metric__"] = spec.metric
    space["__stopper__"] = spec.scheduler.kind
    space["__deadline__"] = time.time() + spec.time_budget_s if spec.time_budget_s else None
    space["__storage__"] = str(root / "tune")  # where Tune keeps the trials' folders
    tuner = tune.Tuner(
        trainable_,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=spec.metric,
            mode=spec.mode,
            scheduler=scheduler(spec, base),
            search_alg=searcher(spec, base),
            num_samples=samples,
            max_concurrent_trials=spec.max_concurrent,
            time_budget_s=spec.time_budget_s,
            reuse_actors=False,  # every trial (and PBT step) starts and ends the same way
        ),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=str(root),
            verbose=0,
            callbacks=[lines] if lines is not None else None,
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            # PBT continues trials from others' checkpoints at its perturbation points
            # (the only ones its trials write): Tune keeps them all
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=None if spec.scheduler.kind == "pbt" else base.checkpoint.keep
            ),
        ),
    )
    return tuner.fit()
