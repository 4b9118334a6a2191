"""``raycobo compare``: several methods on the same data setting and seeds, side by side.

For every entry (a method name, or a label of ``compare.variants``) and every seed it
runs ``run_experiment`` into ``OUT/<entry>/`` (one seed) or ``OUT/<entry>/seed<k>/``,
then writes ``comparison.md|csv|json`` (``table.py``), plots and ``report.html``
(``report.py``) in OUT. In four steps: plan (``plan.py``: entries x seeds -> jobs),
execute (``execute.py``: serial, or Ray tasks), table, report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raycobo.comparison.execute import run_parallel, run_serial
from raycobo.comparison.plan import Plan, entry_config, make_plan
from raycobo.comparison.report import (
    data_of,
    figure_notes,
    write_compare_plots,
    write_report,
)
from raycobo.comparison.table import (
    TABLE_COLUMNS,
    finished,
    improved_share,
    markdown_table,
    summarize,
    terminal_table,
    write_tables,
)
from raycobo.config import Config, with_overrides
from raycobo.lifecycle import Result
from raycobo.lifecycle.callbacks import Callback, RunContext
from raycobo.lifecycle.plugins import write_plugin_record


@dataclass
class Hooks:
    """What observes a comparison: callbacks per compared run (by entry), a progress bar
    per run (by label), and a parent callback for the comparison as a whole."""

    callbacks: Callable[[str], list[Callback]] = field(default=lambda entry: [])
    progress: Callable[[str], Any] = field(default=lambda label: None)
    parent: Callback | None = None


def run_compare(
    cfg: Config,
    entries: list[str],
    out: Path | None = None,
    *,
    seeds: list[int] | None = None,
    parallel: bool = False,
    resume: bool = False,
    hooks: Hooks | None = None,
    cpus_per_run: float = 1.0,
) -> tuple[Path, list[dict[str, Any]], dict[str, list[Result]]]:
    """Run every (entry, seed) and write the comparison. A run that fails (diverges) is
    kept as a failed row and the others go on. ``resume``: ``out`` is an earlier
    comparison; finished runs are read back, the others continue from their checkpoints.
    -> (the comparison's folder, the table's rows, every entry's results by seed)"""
    hooks = hooks or Hooks()
    plan = make_plan(cfg, entries, out, seeds, resume)
    # what --resume needs to run the same comparison: its entries and seeds
    stored = with_overrides(cfg, {"compare.algorithms": entries, "compare.seeds": plan.seeds})
    (plan.root / "config.yaml").write_text(stored.to_yaml())
    write_plugin_record(plan.root, stored.to_dict())  # what a resume may import
    pctx = RunContext(cfg, plan.root)
    if hooks.parent is not None:
        hooks.parent.on_run_start(pctx)
    try:
        results = _execute(plan, hooks, parallel, cpus_per_run)
        rows, files = _write(cfg, plan, results)
    except BaseException as err:
        if hooks.parent is not None:
            status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
            with contextlib.suppress(Exception):
                hooks.parent.on_run_end(pctx, {"status": status})
        raise
    if hooks.parent is not None:  # the parent may keep the files (MLflow logs them)
        status = "failed" if any(r.get("failed") for r in rows) else "completed"
        if hasattr(hooks.parent, "log_summary_metrics"):  # each entry's numbers, seen first
            hooks.parent.log_summary_metrics(
                {f"mean_accuracy/{r['algorithm']}": r.get("mean_accuracy") for r in rows}
                | {f"mean_loss/{r['algorithm']}": r.get("mean_loss") for r in rows}
            )
        hooks.parent.on_run_end(pctx, {"status": status, "table": rows, "files": files})
    return plan.root, rows, results


def _execute(plan: Plan, hooks: Hooks, parallel: bool, cpus: float) -> dict[str, list[Result]]:
    known = dict(plan.done)
    if parallel and plan.jobs:
        known.update(run_parallel(plan.jobs, hooks.callbacks, cpus))
    elif plan.jobs:
        known.update(run_serial(plan.jobs, hooks.callbacks, hooks.progress, len(plan.seeds) > 1))
    return {e: [known[(e, s)] for s in plan.seeds] for e in plan.entries}


def _write(cfg: Config, plan: Plan, results: dict[str, list[Result]]):
    """The table, plots and report. -> (rows, the files written)"""
    local = results.get("local")
    target = cfg.compare.target_accuracy
    rows = [summarize(e, runs, local, target) for e, runs in results.items()]
    write_tables(plan.root, rows)
    ok = {e: [r for r in runs if finished(r)] for e, runs in results.items()}
    plots = write_compare_plots(
        plan.root, {e: rs for e, rs in ok.items() if rs}, cfg.compare.heatmap_rounds
    )
    notes = figure_notes(ok)
    report = write_report(plan.root, cfg, rows, plots, plan.configs, data_of(ok), notes)
    tables = [plan.root / f"comparison.{x}" for x in ("md", "csv")]
    return rows, [*tables, report]  # plots/ goes with the parent run's folder


def tracked_compare(
    cfg: Config,
    entries: list[str],
    out: Path | None,
    make_progress: Callable[[str], Any],
    track: bool = True,
    seeds: list[int] | None = None,
    parallel: bool = False,
    resume: bool = False,
):
    """``run_compare`` with MLflow tracking (when ``track`` and ``tracking.enabled``): one
    parent run for the comparison, each compared run a child of it."""
    hooks = Hooks(progress=make_progress)
    if track and cfg.tracking.enabled:
        from raycobo.tracking import MLflowTracker, ParentRole

        role = ParentRole(
            "compare",
            {"compare.entries": ",".join(entries), "compare.seeds": _seed_list(cfg, seeds)},
            varied=("seed",),
        )
        parent = MLflowTracker(cfg.tracking, run_name=f"{cfg.name}-compare", role=role)
        hooks.parent = parent
        hooks.callbacks = lambda a: [
            MLflowTracker(cfg.tracking, run_name=f"{cfg.name}-{a}", parent=parent)
        ]
    if parallel and cfg.tracking.enabled:
        # runs in other processes must find the same sqlite store and artifact folder
        from raycobo.tracking.mlflow_tracker import absolute_locations

        cfg = with_overrides(cfg, absolute_locations(cfg.tracking))
    return run_compare(
        cfg, entries, out, seeds=seeds, parallel=parallel, resume=resume, hooks=hooks
    )


def _seed_list(cfg: Config, seeds: list[int] | None) -> str:
    chosen = seeds or cfg.compare.seeds or [cfg.seed]  # as make_plan chooses them
    return ",".join(map(str, chosen))


__all__ = [
    "TABLE_COLUMNS",
    "Hooks",
    "entry_config",
    "improved_share",
    "markdown_table",
    "run_compare",
    "summarize",
    "terminal_table",
    "tracked_compare",
]
