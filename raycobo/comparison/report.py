"""What a comparison shows besides its table: plots and one HTML page.

- ``plots/curves.png`` (accuracy and loss against rounds, mean +- std over seeds),
  ``plots/collaboration.png`` (W of every method at chosen rounds, side by side),
  ``plots/client_accuracy.png`` (per-client accuracy distribution),
  ``plots/communication.png`` (accuracy against megabytes sent, when counted);
- ``report.html``: the table, the plots and the resolved configs.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from raycobo.comparison.table import html_table
from raycobo.config import Config
from raycobo.lifecycle import Result


def write_compare_plots(
    root: Path, results: dict[str, list[Result]], heat_rounds: list[int] | None
) -> list[Path]:
    from raycobo import plots

    pdir = root / "plots"
    pdir.mkdir(exist_ok=True)
    written = [pdir / "curves.png"]
    plots.plot_curves_band(
        written[0], {e: [r.summary["history"] for r in rs] for e, rs in results.items()}
    )
    first = {e: rs[0] for e, rs in results.items()}
    # entries may differ in their clients (e.g. variants over the number of clusters)
    clusters = {e: [c["cluster"] for c in r.summary["clients"]] for e, r in first.items()}
    snaps: dict[str, dict[int, np.ndarray]] = {}
    for e, r in first.items():
        have = r.W_at()
        if have:
            want = sorted(have) if heat_rounds is None else [x for x in heat_rounds if x in have]
            snaps[e] = {x: have[x] for x in want}
    if snaps:
        written.append(pdir / "collaboration.png")
        plots.plot_matrix_grid(written[-1], snaps, clusters)
    accs = {
        e: [c["accuracy"] for r in rs for c in r.summary["clients"]] for e, rs in results.items()
    }
    if all(None not in a for a in accs.values()):
        written.append(pdir / "client_accuracy.png")
        plots.plot_distribution(written[-1], accs)
    sent = {
        e: (
            np.mean([r.summary["megabytes_sent"] for r in rs]),
            np.mean([r.summary["mean_accuracy"] for r in rs]),
        )
        for e, rs in results.items()
        if all(
            r.summary.get("megabytes_sent") and r.summary["mean_accuracy"] is not None for r in rs
        )
    }
    if len(sent) >= 2:
        written.append(pdir / "communication.png")
        plots.plot_communication(written[-1], sent)
    return written


def write_report(
    root: Path,
    cfg: Config,
    rows: list[dict[str, Any]],
    plot_files: list[Path],
    cfgs: dict[tuple[str, int], Config],
) -> Path:
    esc = html.escape
    imgs = "".join(
        f'<figure><img src="plots/{esc(p.name)}" alt="{esc(p.stem)}"><figcaption>{esc(p.stem)}'
        "</figcaption></figure>"
        for p in plot_files
    )
    configs = "".join(
        f"<details><summary>{esc(e)} (seed {s})</summary><pre>{esc(c.to_yaml())}</pre></details>"
        for (e, s), c in cfgs.items()
    )
    seeds = ", ".join(map(str, sorted({x for r in rows for x in r["seeds"]})))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>raycobo compare: {esc(cfg.name)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}img{{max-width:100%}}</style>
</head><body>
<h1>{esc(cfg.name)}: {esc(", ".join(r["algorithm"] for r in rows))}</h1>
<p>{esc(cfg.data.name)} / {esc(cfg.data.partition.kind)}, {cfg.rounds} rounds, seeds
{esc(seeds)}. Accuracy: mean over clients at the last round (mean over seeds);
Imp.: share of clients beating Local; worst 10/20 %: mean accuracy of the weakest clients;
rounds to target: first evaluation at or above {cfg.compare.target_accuracy}.</p>
<h2>Results</h2>{html_table(rows)}
<h2>Plots</h2>{imgs}
<h2>Resolved configs</h2>{configs}
</body></html>
"""
    path = root / "report.html"
    path.write_text(page)
    return path
