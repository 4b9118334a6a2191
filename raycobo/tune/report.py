"""``sweep_report.html``: one self-contained page beside ``sweep_summary.json``.

What it shows: the result (the best trial's score on the split it was chosen on, and the
final test run's), the trials' table (sampled values, how each ended, its metric), the
metric against each swept key (a scatter for numbers, one strip per value for choices),
the learning curves of the best few trials, and the W of the best configuration.
Figures are PNGs under ``plots/`` in the sweep's folder, embedded in the page.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from raycobo.tune.console import trial_number

CURVES = 5  # the best trials drawn in the learning curves


def _trial_history(t: dict[str, Any]) -> list[dict[str, Any]]:
    """A trial's evaluations from its run's summary (every status writes its history)."""
    try:
        data = json.loads((Path(t["path"]) / "run" / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    return data.get("history") or [] if isinstance(data, dict) else []


def _ranked(summary: dict[str, Any]) -> list[dict[str, Any]]:
    metric, sign = summary["metric"], (1 if summary["mode"] == "min" else -1)
    scored = [t for t in summary["trials"] if _number(t["metrics"].get(metric)) is not None]
    return sorted(scored, key=lambda t: sign * t["metrics"][metric])


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def plot_keys(path: Path, summary: dict[str, Any]) -> bool:
    """The metric against each swept key, one panel a key. -> whether one was drawn"""
    import matplotlib.pyplot as plt

    from raycobo import plots  # noqa: F401 - the Agg backend

    metric = summary["metric"]
    trials = [t for t in summary["trials"] if _number(t["metrics"].get(metric)) is not None]
    keys = sorted({k for t in trials for k in t["config"]})
    if not trials or not keys:
        return False
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.2), squeeze=False)
    colours = {"completed": "tab:blue", "stopped": "tab:orange"}
    for ax, key in zip(axes[0], keys, strict=True):
        values = [t["config"].get(key) for t in trials]
        ys = [t["metrics"][metric] for t in trials]
        cs = [colours.get(t["status"], "tab:red") for t in trials]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if numeric:
            ax.scatter(values, ys, c=cs, s=22)
            if min(values) > 0 and max(values) / min(values) >= 20:
                ax.set_xscale("log")
        else:
            labels = sorted({str(v) for v in values})
            xs = [
                labels.index(str(v)) + np.random.default_rng(i).uniform(-0.12, 0.12)
                for i, v in enumerate(values)
            ]
            ax.scatter(xs, ys, c=cs, s=22)
            ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=8)
        ax.set_xlabel(key, fontsize=9)
        ax.set_ylabel(metric, fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(
        "each trial's last reported value (blue: ran to the end; orange: stopped "
        "early; red: failed)",
        fontsize=8,
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def plot_best_curves(path: Path, summary: dict[str, Any]) -> bool:
    """The learning curves of the best few trials. -> whether one was drawn"""
    import matplotlib.pyplot as plt

    metric = summary["metric"]
    drawn = []
    for t in _ranked(summary)[:CURVES]:
        hist = [h for h in _trial_history(t) if _number(h.get(metric)) is not None]
        if hist:
            drawn.append((t, hist))
    if not drawn:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for t, hist in drawn:
        label = f"trial {trial_number(t['trial_id'])}"
        ax.plot([h["round"] for h in hist], [h[metric] for h in hist], marker=".", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric} ({summary['chosen_on']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def plot_best_w(path: Path, summary: dict[str, Any]) -> bool:
    """W of the best configuration: the final test run's, else the best trial's."""
    from raycobo import plots

    best = summary.get("best")
    if best is None:
        return False
    test = summary.get("test") or {}
    for folder, label in (
        (test.get("run_dir"), "final run (test)"),
        (Path(best["path"]) / "run", "best trial"),
    ):
        if folder is None:
            continue
        folder = Path(folder)
        try:
            W = np.load(folder / "collaboration.npy")
            run = json.loads((folder / "summary.json").read_text())
        except (OSError, ValueError):
            continue
        clusters = [c.get("cluster") for c in run.get("clients", [])]
        cut = run.get("collaboration_cut")
        plots.plot_collaboration(path, {run.get("last_round", 0): W}, clusters, label, cut)
        return True
    return False


def _embedded(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _status(t: dict[str, Any]) -> str:
    if t["status"] == "stopped":
        return f"stopped by {t.get('stopped_by')} at round {t['metrics'].get('round')}"
    if t["status"] == "error":
        return f"failed: {t.get('error') or ''}"
    return t["status"]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "—" if v is None else str(v)


def _table(summary: dict[str, Any]) -> str:
    esc, metric = html.escape, summary["metric"]
    keys = sorted({k for t in summary["trials"] for k in t["config"]})
    ranked = _ranked(summary)
    order = ranked + [t for t in summary["trials"] if t not in ranked]
    head = "".join(f"<th>{esc(k)}</th>" for k in ["trial", *keys, metric, "round", "ended"])
    rows = []
    for t in order:
        cells = [trial_number(t["trial_id"])] + [_fmt(t["config"].get(k)) for k in keys]
        cells += [_fmt(t["metrics"].get(metric)), _fmt(t["metrics"].get("round")), _status(t)]
        rows.append("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _result(summary: dict[str, Any]) -> str:
    esc, metric, best = html.escape, summary["metric"], summary.get("best")
    counts = ", ".join(
        f"{summary.get(k, 0)} {k}" for k in ("completed", "stopped", "failed", "interrupted")
    )
    parts = [f"{summary['num_trials']} trials: {counts}."]
    if best is None:
        parts.append("No trial reached its end with the metric.")
    else:
        values = ", ".join(f"{k}={_fmt(v)}" for k, v in best["config"].items())
        parts.append(
            f"Best {metric} on the {summary['chosen_on']} split: "
            f"{_fmt(best['metrics'][metric])} (trial {trial_number(best['trial_id'])}: {values})."
        )
    test = summary.get("test")
    if test is not None:
        parts.append(
            f"That configuration run once on the test split: {metric} "
            f"{_fmt(test.get(metric))} — the sweep's result."
        )
    elif summary["chosen_on"] == "test":
        parts.append(
            "Chosen on the TEST split (the space says evaluate_on: test): the "
            "best figure is optimistic."
        )
    return "<p>" + " ".join(esc(p) for p in parts) + "</p>"


def write_sweep_report(root: Path, summary: dict[str, Any]) -> Path:
    """``root/sweep_report.html`` and its figures under ``root/plots/``."""
    esc = html.escape
    pdir = root / "plots"
    pdir.mkdir(exist_ok=True)
    figures = []
    for name, draw, caption in (
        ("keys", plot_keys, "The metric against each swept key."),
        ("curves", plot_best_curves, f"Learning curves of the best {CURVES} trials."),
        ("collaboration", plot_best_w, "W of the best configuration."),
    ):
        path = pdir / f"{name}.png"
        if draw(path, summary):
            figures.append(
                f'<figure><img src="{_embedded(path)}" alt="{esc(caption)}">'
                f"<figcaption>{esc(caption)}</figcaption></figure>"
            )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>raycobo sweep: {esc(summary["name"])}</title>
<style>body{{font-family:sans-serif;margin:1em auto;max-width:1100px;padding:0 1em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
.scroll{{overflow-x:auto}}img{{max-width:100%}}figcaption{{color:#555;font-size:90%}}</style>
</head><body>
<h1>sweep {esc(summary["name"])}</h1>
<p>{esc(summary["metric"])} ({esc(summary["mode"])}), search {esc(summary["search"])},
scheduler {esc(summary["scheduler"])}.</p>
{_result(summary)}
<h2>Trials</h2><div class=scroll>{_table(summary)}</div>
<h2>Plots</h2>{"".join(figures) or "<p>No trial reported the metric.</p>"}
</body></html>
"""
    path = root / "sweep_report.html"
    path.write_text(page)
    return path
