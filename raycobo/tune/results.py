"""What a sweep leaves when Tune's fit returns: every trial's row (how it ended, read
from Tune's saved state and the trial's own run directory), the best trial,
``sweep_summary.json``, ``best_config.yaml``, the best configuration's one run on the
test split (``final/``) and ``sweep_report.html``."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from raycobo.config import Config, with_overrides
from raycobo.tune.space import SweepSpec
from raycobo.tune.trial import LINEAGE_FILE, REPORTED, finished, ran_under

FINAL_DIR = "final"  # the best configuration's run on the test split


def _saved_statuses(path: Path) -> dict[str, tuple[str, str]]:
    """Every trial's id and status in the saved experiment state, by its folder's name.
    (After a Ctrl-C,
    Tune's live results call the stopped trials terminated; its saved state, which
    --resume reads, keeps them pending.)"""
    from ray.tune import ExperimentAnalysis

    return {Path(t.path).name: (t.trial_id, t.status) for t in ExperimentAnalysis(str(path)).trials}


def _run_summary(trial_path: str) -> dict[str, Any]:
    from raycobo.lifecycle.run_dir import read_summary

    return read_summary(Path(trial_path) / "run") or {}


def _trial_rows(results, statuses, rounds: int, stopper: str) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        metrics = r.metrics or {}
        live = (metrics.get("trial_id"), "TERMINATED" if r.error is None else "ERROR")
        tid, saved = statuses.get(Path(r.path).name, live)
        reached = metrics.get("round")
        run = _run_summary(r.path)
        stopped_by = None
        if r.error is not None or metrics.get("config_error") or saved == "ERROR":
            status = "error"
        elif run.get("status") == "completed" or (saved == "TERMINATED" and reached == rounds):
            status = "completed"  # (Tune's last saved state can predate the trial's end)
        elif saved == "TERMINATED":
            status = "stopped"  # by the scheduler, or by the sweep's time budget
            stopped_by = run.get("stopped_by") or stopper
        else:  # stopped before its last round (Ctrl-C, an unfinished sweep)
            status = "interrupted"
            if run.get("status") == "stopped":  # Tune ended it as it ends a stopped trial
                _say_interrupted(Path(r.path) / "run", run)
        error = metrics.get("config_error") or (
            str(r.error).strip().splitlines()[-1][:300] if r.error else None
        )
        lineage = Path(r.path) / LINEAGE_FILE
        rows.append(
            {
                "trial_id": tid,
                "config": {k: v for k, v in (r.config or {}).items() if not k.startswith("__")},
                "metrics": {k: metrics.get(k) for k in (*REPORTED, "round")},
                "status": status,
                "stopped_by": stopped_by,
                "error": error,
                "node": metrics.get("node_ip"),  # where its last result came from
                "path": r.path,
                "lineage": json.loads(lineage.read_text()) if lineage.is_file() else None,
            }
        )
    return rows


def _say_interrupted(run_dir: Path, run: dict[str, Any]) -> None:
    """A trial the sweep's own interruption ended reads ``interrupted`` (Tune stops it as
    it stops a trial its scheduler ends: the trial could not tell); resumed with the
    sweep. The trial's process is gone: the sweep writes its folder now."""
    from raycobo.lifecycle.files import atomic_write_text

    fixed = {**run, "status": "interrupted", "error": "the sweep was interrupted"}
    fixed.pop("stopped_by", None)
    with contextlib.suppress(OSError):
        atomic_write_text(run_dir / "summary.json", json.dumps(fixed, indent=2))


def _pick_best(spec: SweepSpec, trials: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best trial that ran its whole length (with the metric); only when none did
    and every trial has ended, the best of those a scheduler stopped (e.g. ``max_t``
    below the run's length)."""
    ended = not any(t["status"] == "interrupted" for t in trials)
    for status in ("completed", "stopped") if ended else ("completed",):
        ok = [
            t for t in trials if t["status"] == status and t["metrics"].get(spec.metric) is not None
        ]
        if ok:
            pick = max if spec.mode == "max" else min
            return pick(ok, key=lambda t: t["metrics"][spec.metric])
    return None


def summarize(spec, base: Config, root: Path, name: str, results, parent_id) -> dict[str, Any]:
    """sweep_summary.json, and best_config.yaml: the config of the best trial's values
    on the base's own split (the config the final test run runs)."""
    statuses = _saved_statuses(root / "tune")
    trials = _trial_rows(results, statuses, base.rounds, spec.scheduler.kind)
    best = _pick_best(spec, trials)
    (root / "best_config.yaml").unlink(missing_ok=True)  # of an earlier, unfinished fit
    if best is not None:
        chosen = _final_config(spec, base, best)
        (root / "best_config.yaml").write_text(
            f"# raycobo run {root / 'best_config.yaml'}\n"
            f"# the best trial of sweep '{name}' by {spec.metric} ({spec.mode}) on the "
            f"{spec.evaluate_on} split: {best['metrics'][spec.metric]}\n" + chosen.to_yaml()
        )
    summary = {
        "name": name,
        "metric": spec.metric,
        "mode": spec.mode,
        "search": spec.search,
        "scheduler": spec.scheduler.kind,
        "chosen_on": spec.evaluate_on,
        "num_trials": len(trials),
        "completed": sum(t["status"] == "completed" for t in trials),
        "stopped": sum(t["status"] == "stopped" for t in trials),
        "failed": sum(t["status"] == "error" for t in trials),
        "interrupted": sum(t["status"] == "interrupted" for t in trials),
        "best": best,
        "best_config": str(root / "best_config.yaml") if best else None,
        "test": None,
        "mlflow_parent_run_id": parent_id,
        "trials": trials,
    }
    write_summary(root, summary)
    return summary


def write_summary(root: Path, summary: dict[str, Any]) -> None:
    body = {k: v for k, v in summary.items() if k != "root"}
    (root / "sweep_summary.json").write_text(json.dumps(body, indent=2, default=str))


def _final_config(spec: SweepSpec, base: Config, best: dict[str, Any]) -> Config:
    """The best trial's values on the base config as given (its own split and data: no
    validation part held out when the base holds out none)."""
    cfg = with_overrides(base, best["config"])
    return with_overrides(cfg, {"data.evaluate_on": "test"}) if spec.evaluate_on == "test" else cfg


def final_run(spec, base: Config, root: Path, name: str, summary, parent_id) -> dict[str, Any]:
    """The best configuration run once on the test split, into ``final/`` (a resumed
    sweep continues or keeps it). -> its test figures"""
    from raycobo.lifecycle.experiment import run_experiment
    from raycobo.lifecycle.run_dir import read_summary
    from raycobo.tracking import MLflowTracker

    cfg = _final_config(spec, base, summary["best"])
    out = root / FINAL_DIR
    done = read_summary(out) or {}
    if not finished(out, cfg):
        if out.exists() and not ran_under(out, cfg):  # the best changed (a resume): anew
            import shutil

            shutil.rmtree(out)
        print(
            f"best on validation: {spec.metric} {summary['best']['metrics'][spec.metric]:.4g}; "
            f"running it once on the test split ({out})",
            file=sys.stderr,
            flush=True,
        )
        callbacks: list[Any] = []
        if cfg.tracking.enabled:
            callbacks.append(
                MLflowTracker(
                    cfg.tracking,
                    run_name=f"{name} best on test",
                    parent=parent_id,
                    run_dir=out,
                    tags={"raycobo.sweep_role": "final_test"},
                )
            )
        resume = (out / "config.yaml").is_file()
        from raycobo.lifecycle.progress import RoundProgress

        shown = RoundProgress(f"{name} best on test")  # a bar on a terminal, else lines
        done = run_experiment(cfg, out, callbacks, shown, resume=resume).summary
    return {
        "mean_accuracy": done.get("mean_accuracy"),
        "mean_loss": done.get("mean_loss"),
        "w_within": (done.get("cluster_agreement") or {}).get("w_within"),
        "w_across": (done.get("cluster_agreement") or {}).get("w_across"),
        "run_dir": str(out),
    }


def write_report(root: Path, summary: dict[str, Any]) -> None:
    from raycobo.tune.report import write_sweep_report

    with contextlib.suppress(OSError):  # a report is a view: the summary stands without it
        write_sweep_report(root, summary)
