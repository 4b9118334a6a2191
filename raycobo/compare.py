"""Run several algorithms on the same data setting and seed, and put them side by side."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from raycobo.callbacks import Callback, RunContext
from raycobo.config import Config, ConfigError, with_overrides
from raycobo.experiment import Result, run_experiment

TABLE_COLUMNS = ["algorithm", "mean_accuracy", "mean_loss", "improved_vs_local", "wall_seconds"]


def algorithm_config(cfg: Config, name: str) -> Config:
    """``cfg`` with ``algorithm.name`` set and ``compare.overrides[name]`` applied."""
    extra = dict(cfg.compare.overrides.get(name, {}))
    return with_overrides(cfg, {"algorithm.name": name, **extra})


def improved_share(summary: dict[str, Any], local: dict[str, Any] | None) -> float | None:
    """Share of clients whose final metric beats Local's (CoBo Table 2, "Imp.(%)")."""
    if local is None:
        return None
    mine, base = summary["clients"], local["clients"]
    if summary.get("mean_accuracy") is not None:
        wins = [a["accuracy"] > b["accuracy"] for a, b in zip(mine, base, strict=True)]
    else:
        wins = [a["loss"] < b["loss"] for a, b in zip(mine, base, strict=True)]
    return 100.0 * float(np.mean(wins))


def run_compare(
    cfg: Config,
    algorithms: list[str],
    out: Path | None,
    make_callbacks: Callable[[str], list[Callback]] = lambda name: [],
    make_progress: Callable[[str], Any] = lambda name: None,
    parent: Callback | None = None,
) -> tuple[Path, list[dict[str, Any]], dict[str, Result]]:
    if not algorithms:
        raise ConfigError("no algorithms to compare: pass --algorithms or set compare.algorithms")
    cfgs = {a: algorithm_config(cfg, a) for a in algorithms}  # validate all before running
    root = out or Path("runs") / f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.name}-compare"
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(cfg.to_yaml())
    pctx = RunContext(cfg, root)
    if parent is not None:
        parent.on_run_start(pctx)
    results: dict[str, Result] = {}
    for a in algorithms:
        results[a] = run_experiment(cfgs[a], root / a, make_callbacks(a), make_progress(a))
    local = results["local"].summary if "local" in results else None
    rows = []
    for a, res in results.items():
        s = res.summary
        rows.append(
            {
                "algorithm": a,
                "mean_accuracy": s["mean_accuracy"],
                "mean_loss": s["mean_loss"],
                "improved_vs_local": improved_share(s, local) if a != "local" else None,
                "wall_seconds": s["wall_seconds"],
                "run_dir": str(res.run_dir),
            }
        )
    write_tables(root, rows)
    write_compare_plots(root, results)
    if parent is not None:
        parent.on_run_end(pctx, {"status": "completed", "table": rows})
    return root, rows, results


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{100 * v:.1f}" if pct else f"{v:.4g}"
    return str(v)


def write_tables(root: Path, rows: list[dict[str, Any]]) -> None:
    with (root / "comparison.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*TABLE_COLUMNS, "run_dir"])
        w.writeheader()
        w.writerows(rows)
    (root / "comparison.json").write_text(json.dumps(rows, indent=2))
    lines = [
        "| algorithm | accuracy (%) | loss | Imp. (%) | wall (s) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        imp = "-" if r["improved_vs_local"] is None else f"{r['improved_vs_local']:.0f}"
        lines.append(
            f"| {r['algorithm']} | {_fmt(r['mean_accuracy'], pct=True)} | "
            f"{_fmt(r['mean_loss'])} | {imp} | {r['wall_seconds']:.1f} |"
        )
    (root / "comparison.md").write_text("\n".join(lines) + "\n")


def write_compare_plots(root: Path, results: dict[str, Result]) -> None:
    from raycobo import plots

    pdir = root / "plots"
    pdir.mkdir(exist_ok=True)
    plots.plot_curves(pdir / "curves.png", {a: r.summary["history"] for a, r in results.items()})
    mats = {
        a: np.array(r.summary["collaboration"])
        for a, r in results.items()
        if r.summary["collaboration"]
    }
    if mats:
        clusters = next(iter(results.values())).summary["clients"]
        cl = [c["cluster"] for c in clusters]
        plots.plot_matrices(pdir / "collaboration.png", mats, cl)
