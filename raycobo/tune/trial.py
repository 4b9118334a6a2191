"""One sweep trial: the Tune trainable that runs ``run_experiment`` on a sampled config.

A trial reports every evaluation to Tune. When Tune ends it before its last round (a
scheduler's decision, the sweep's time budget), the run is recorded ``stopped`` -- by
whom, at which round, with that evaluation's metrics -- and its MLflow run ends
FINISHED with tags saying so; a stop asked for at the last evaluation lets the run
complete. The trainable waits (bounded) for that ending before Tune retires its actor.
Under population-based training a trial may restart from *another* trial's checkpoint
with perturbed settings: that starts a new run from the donor's state, the earlier
segment kept beside it and the step recorded in ``lineage.json``.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import typing
from pathlib import Path
from typing import Any

from raycobo.config import ConfigError, validate, with_overrides
from raycobo.lifecycle.callbacks import BaseCallback, RunContext, StopRun
from raycobo.tune.console import sampled_values, trial_number
from raycobo.tune.space import SweepSpec

REPORTED = typing.get_args(SweepSpec.model_fields["metric"].annotation)  # what trials report
LINEAGE_FILE = "lineage.json"  # a PBT trial's steps: from which trial, at which round
ENDING_S = 120.0  # how long a stopped trial's actor waits for the run to write its ending

log = logging.getLogger("raycobo.tune")


class TuneReporter(BaseCallback):
    """Reports every evaluation to Tune; ``round`` is the schedulers' time axis. The
    sweep's metric is always present (NaN when a diverging run has no value). When the
    run wrote a checkpoint at this round, it goes with the report, so Tune can restart
    the trial from it (a retry, a paused trial, PBT, ``raycobo sweep --resume``).
    ``stopper`` names who may end the trial early; ``deadline`` (epoch seconds) is when
    the sweep's time budget runs out."""

    def __init__(self, metric: str, stopper: str = "tune", deadline: float | None = None):
        self.metric, self.stopper, self.deadline = metric, stopper, deadline

    def on_eval(self, ctx: RunContext, round: int, metrics: dict[str, Any]) -> None:
        report = {k: metrics[k] for k in REPORTED if metrics.get(k) is not None}
        report.setdefault(self.metric, float("nan"))
        report["round"] = round
        try:
            self._report(ctx, round, report)
        except SystemExit:  # Tune ends the trial here (its function API's way of saying so)
            if round >= ctx.cfg.rounds:
                return  # the last evaluation: the run completes as it would have
            late = self.deadline is not None and time.time() >= self.deadline
            raise StopRun("time_budget" if late else self.stopper) from None

    @staticmethod
    def _report(ctx: RunContext, round: int, report: dict[str, Any]) -> None:
        from ray import tune

        if ctx.checkpoint is None or ctx.checkpoint[0] != round:
            tune.report(report)
            return
        with tempfile.TemporaryDirectory(prefix="raycobo-ckpt-") as tmp:
            path = ctx.checkpoint[1]
            shutil.copy2(path, Path(tmp) / path.name)
            tune.report(report, checkpoint=tune.Checkpoint.from_directory(tmp))


def _take_checkpoint(out: Path, given: Path | None) -> bool:
    """A restarted trial: the checkpoint Tune hands back (``given``) goes into the run
    directory's checkpoints/ (beside the newer ones the run may have written since:
    Tune's saved state can miss the newest when the sweep is stopped while a trial
    reports it). -> whether the trial continues a run (resume)"""
    from raycobo.lifecycle.checkpoint import list_checkpoints

    for _, path in list_checkpoints(given) if given is not None else []:
        (out / "checkpoints").mkdir(parents=True, exist_ok=True)
        target = out / "checkpoints" / path.name
        if not target.exists():
            shutil.copy2(path, target)
    return given is not None or (out / "config.yaml").is_file()


def ran_under(out: Path, cfg) -> bool:
    """Whether the run directory ``out`` holds a run of exactly these settings (its
    config.yaml is ``cfg`` as a run records it)."""
    stored = out / "config.yaml"
    return stored.is_file() and stored.read_text() == cfg.pinned().to_yaml()


def finished(out: Path, cfg) -> bool:
    """Whether the run directory ``out`` already ran all its rounds under these settings."""
    from raycobo.lifecycle.run_dir import read_summary

    done = read_summary(out) or {}
    ended = done.get("status") == "completed" and done.get("last_round", 0) >= cfg.rounds
    return ended and ran_under(out, cfg)


def _own(out: Path, given: Path, from_here: bool, cfg) -> bool:
    """Whether the checkpoint Tune hands back continues this trial's run as it is (a
    retry, a paused trial, a resumed sweep): it comes from this trial's folder, was
    written under the settings the trial now has, and so was the run. Otherwise it is
    PBT's exploit step (another trial's state, or this one's from before its values
    were perturbed), continued as a new run."""
    from raycobo.lifecycle.checkpoint import latest_checkpoint, read_checkpoint
    from raycobo.lifecycle.run_dir import config_changes

    if not from_here or ((out / "config.yaml").is_file() and not ran_under(out, cfg)):
        return False
    pinned = cfg.pinned()  # as the run records it
    found = latest_checkpoint(given)
    saved = read_checkpoint(found[1]).get("config") if found is not None else None
    return saved is None or not config_changes(saved, pinned)


def _fork(out: Path, given: Path, source: str, sampled: dict[str, Any]) -> Path:
    """PBT's exploit step: this trial continues from a checkpoint written under other
    values (``given``; ``source``: the trial folder it came from) with its new ones. The
    segment run so far is kept as ``run.<k>``, the step appended to ``lineage.json``.
    -> the checkpoint file"""
    from raycobo.lifecycle.checkpoint import latest_checkpoint

    found = latest_checkpoint(given)
    lineage_path = out.parent / LINEAGE_FILE
    lineage = json.loads(lineage_path.read_text()) if lineage_path.is_file() else []
    if out.exists():
        out.rename(out.parent / f"run.{len(lineage)}")
    start = out.parent / "started_from" / f"{len(lineage)}-{found[1].name}"
    start.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(found[1], start)
    lineage.append({"round": found[0], "from_trial": source, "config": sampled})
    lineage_path.write_text(json.dumps(lineage, indent=2))
    return start


def trial(params: dict[str, Any]) -> None:
    """The Tune function: ``params`` holds the resolved base config and the sampled keys.
    A config the sampled values make invalid ends the trial with its one-line error
    (reported as ``config_error``) instead of raising: a retry could not succeed."""
    from ray import tune

    from raycobo.lifecycle.experiment import run_experiment
    from raycobo.tracking import MLflowTracker

    try:
        base = validate(params["__base__"])
        sampled = {k: v for k, v in params.items() if not k.startswith("__")}
        cfg = with_overrides(base, sampled)
        reporter = TuneReporter(
            params["__metric__"], params.get("__stopper__", "tune"), params.get("__deadline__")
        )
        callbacks: list[Any] = []
        # the run is written straight into the trial's folder in the sweep's own (which a
        # cluster shares): Tune's copying of its working folder would race the run's
        # ending, and a stopped trial's actor is retired seconds after its stop
        folder = Path(tune.get_context().get_trial_dir()).name
        out = Path(params["__storage__"]) / folder / "run"
        checkpoint = tune.get_checkpoint()
        start_from = None
        if checkpoint is not None:
            source = Path(checkpoint.path).parent.name
            with checkpoint.as_directory() as d:
                if not _own(out, Path(d), source == folder, cfg):  # PBT's exploit step
                    start_from = _fork(out, Path(d), source, sampled)
        if cfg.tracking.enabled:
            name = trial_name(cfg.name, tune.get_context().get_trial_id(), sampled)
            callbacks.append(
                MLflowTracker(
                    cfg.tracking,
                    run_name=name,
                    parent=params["__parent__"],
                    run_dir=out,
                    tags={"raycobo.sweep_role": "trial"},
                )
            )
        # last: a stop it raises comes after every other callback has seen this evaluation
        callbacks.append(reporter)
        if start_from is not None:
            run_experiment(cfg, out, callbacks, start_from=start_from)
            return
        if finished(out, cfg):  # restarted after its end (PBT's last point): nothing to run
            return
        if checkpoint is not None:
            with checkpoint.as_directory() as d:
                resume = _take_checkpoint(out, Path(d))
        else:
            resume = _take_checkpoint(out, None)
        run_experiment(cfg, out, callbacks, resume=resume)
    except ConfigError as err:  # at the run's end on the schedulers' time axis: it is over
        end = params["__base__"].get("rounds", 0)
        tune.report({params["__metric__"]: float("nan"), "config_error": str(err), "round": end})


def trial_name(base_name: str, trial_id: str, sampled: dict[str, Any]) -> str:
    """A trial's MLflow run name: its number and its sampled values, shortest first
    (``quad #3 lr=0.1 sampling=full``), so the runs list shows what each trial tried."""
    return f"{base_name} #{trial_number(trial_id)} {sampled_values(sampled)}".strip()[:250]


def _let_end(session, thread, trial_id: str) -> None:
    """Tune's function API ends a trial's thread by making its next report raise
    SystemExit(0): the run's own (then its ending is written) and Tune's closing one
    after the function returns. Each time the thread took a stop, give it another, until
    it ends or ENDING_S pass."""
    deadline = time.monotonic() + ENDING_S
    while thread.is_alive() and time.monotonic() < deadline:
        if not session.stop_event.is_set():  # taken: a later report must find one too
            session.stop_event.set()
            session.continue_lock.release()
        thread.join(timeout=0.2)
    if thread.is_alive():
        log.warning(
            "trial %s: its run had not written its ending %.0f s after Tune stopped it; "
            "its summary may say running",
            trial_id,
            ENDING_S,
        )


def trainable():
    """``trial`` as a Tune Trainable class whose actor, when Tune stops it, waits (at most
    ENDING_S) for the run to write its ending -- the stopped summary, the MLflow run's
    end -- before Tune retires the actor (Tune's own cleanup does not wait)."""
    from ray.train._internal.session import get_session
    from ray.tune.trainable.function_trainable import wrap_function

    class Trial(wrap_function(trial)):  # type: ignore[misc]
        def cleanup(self):
            session = get_session()
            thread = session.training_thread if session is not None else None
            if thread is not None and session.training_started:
                _let_end(session, thread, self.trial_id)
            super().cleanup()

    Trial.__name__ = "trial"
    return Trial
