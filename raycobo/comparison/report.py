"""What a comparison shows besides its table: plots and one HTML page.

- ``plots/curves.png`` (accuracy and loss against rounds, mean +- std over seeds),
  ``plots/collaboration.png`` (W of every method at chosen rounds, side by side),
  ``plots/client_accuracy.png`` (per-client accuracy distribution),
  ``plots/communication.png`` (accuracy against megabytes sent, when counted);
- ``report.html``: one self-contained page: the table, the plots (embedded), the
  settings the entries share and where they differ, and where the result came from.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from raycobo.algorithms.settings import MethodConfig
from raycobo.comparison.table import html_table
from raycobo.config import Config, flat_tree
from raycobo.lifecycle import Result
from raycobo.lifecycle.provenance import describe, provenance


def write_compare_plots(
    root: Path, results: dict[str, list[Result]], heat_rounds: list[int] | None
) -> list[Path]:
    from raycobo import plots

    pdir = root / "plots"
    pdir.mkdir(exist_ok=True)
    written = [pdir / "curves.png"]
    histories = {e: [r.summary["history"] for r in rs] for e, rs in results.items()}
    plots.plot_curves_band(written[0], histories)
    first_run = next(iter(histories.values()))[0]
    for key in ("mean_accuracy", "mean_loss"):  # one panel each: side by side or stacked
        if any(h.get(key) is not None for h in first_run):
            written.append(pdir / f"curves_{key.removeprefix('mean_')}.png")
            plots.plot_curves_band(written[-1], histories, only=key)
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
        cuts = {e: first[e].summary.get("collaboration_cut") for e in snaps}
        plots.plot_matrix_grid(written[-1], snaps, clusters, cuts)
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
    data = data_of(results)
    if data is not None and data.get("label_mix"):
        written.append(pdir / "label_mix.png")
        plots.plot_label_mix(written[-1], data["label_mix"])
    return written


def data_of(results: dict[str, list[Result]]) -> dict[str, Any] | None:
    """The data report of the comparison's first run (its entries share the data)."""
    for rs in results.values():
        for r in rs:
            if r.summary.get("data"):
                return r.summary["data"]
    return None


# what each figure shows, under it in the report (keyed by file stem)
CAPTIONS = {
    "curves": "Mean accuracy (%) and loss over clients against rounds; mean over seeds, "
    "the band one standard deviation.",
    "curves_accuracy": "Mean accuracy (%) over clients against rounds; mean over seeds, "
    "the band one standard deviation.",
    "curves_loss": "Mean loss over clients against rounds; mean over seeds, the band one "
    "standard deviation.",
    "collaboration": "The learned collaboration weights W at chosen rounds (first seed).",
    "client_accuracy": "Each client's accuracy (%) at the last round, all seeds.",
    "communication": "Final mean accuracy (%) against the megabytes sent over the run.",
    "label_mix": "Each client's training labels (first seed): the share of each class.",
}


def _embedded(path: Path) -> str:
    """An image as a data URI: the report is one file, readable wherever it is copied
    (MLflow's artifact view, mail, a supplement)."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"data:image/png;base64,{data}"


def _beside_method(c: Config) -> dict[str, Any]:
    """A config's keys outside its method's section (and its seed), dotted."""
    return flat_tree({k: v for k, v in c.to_dict().items() if k not in ("algorithm", "seed")})


def _settings(c: Config, base: dict[str, Any]) -> dict[str, Any]:
    """A config's keys that say something: the method's own settings (all of them, with
    its rule's values filled in) and every other key that differs from ``base`` (the
    defaults, ``_beside_method(Config())``)."""
    algo = c.algorithm
    own = algo.effective() if isinstance(algo, MethodConfig) else algo.model_dump(mode="json")
    kept = {k: v for k, v in _beside_method(c).items() if k not in base or base[k] != v}
    return {**kept, **{f"algorithm.{k}": v for k, v in own.items()}}


def _show(value: Any) -> str:
    return "null" if value is None else json.dumps(value) if not isinstance(value, str) else value


def settings_tables(cfgs: dict[tuple[str, int], Config]) -> str:
    """What the entries share (one list) and where they differ (one column per entry);
    keys at their defaults that a method or data set does not read are left out."""
    esc = html.escape
    base = _beside_method(Config())
    per_entry: dict[str, dict[str, Any]] = {}
    for (entry, _seed), c in cfgs.items():
        if entry not in per_entry:
            per_entry[entry] = _settings(c, base)
    keys = sorted({k for s in per_entry.values() for k in s})
    shared = {
        k: next(iter(per_entry.values()))[k]
        for k in keys
        if all(k in s for s in per_entry.values())
        and len({json.dumps(s[k], sort_keys=True) for s in per_entry.values()}) == 1
    }
    differ = [k for k in keys if k not in shared]
    out = ["<h3>Shared by every entry</h3><table class=kv>"]
    out += [f"<tr><th>{esc(k)}</th><td>{esc(_show(v))}</td></tr>" for k, v in shared.items()]
    out.append("</table>")
    if differ:
        names = list(per_entry)
        out.append("<h3>Where the entries differ</h3><div class=scroll><table><tr><th>key</th>")
        out += [f"<th>{esc(n)}</th>" for n in names]
        out.append("</tr>")
        for k in differ:
            cells = "".join(
                f"<td>{esc(_show(per_entry[n][k])) if k in per_entry[n] else ''}</td>"
                for n in names
            )
            out.append(f"<tr><th>{esc(k)}</th>{cells}</tr>")
        out.append("</table></div><p class=note>blank: the key is not one of that method's.</p>")
    return "".join(out)


def _figures(plot_files: list[Path], notes: dict[str, str]) -> str:
    """The figures with their captions: the curves' panels side by side where the page
    is wide and stacked where it is narrow, W at a readable size (scrolled on a phone)."""
    curves = [p for p in plot_files if p.stem.startswith("curves_")]
    shown = [p for p in plot_files if p not in curves and not (p.stem == "curves" and curves)]
    out = [f"<div class=row>{''.join(_figure(p, notes) for p in curves)}</div>"] if curves else []
    for p in shown:
        fig = _figure(p, notes)
        out.append(f"<div class='scroll wide'>{fig}</div>" if p.stem == "collaboration" else fig)
    return "".join(out)


def _figure(p: Path, notes: dict[str, str]) -> str:
    caption = CAPTIONS.get(p.stem, p.stem.replace("_", " "))
    if p.stem in notes:
        caption += " " + notes[p.stem]
    return (
        f'<figure><img src="{_embedded(p)}" alt="{html.escape(caption)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def figure_notes(results: dict[str, list[Result]]) -> dict[str, str]:
    """What the W figure's note says, as the compared runs are (clusters, a cut)."""
    from raycobo.plots import heatmap_note

    firsts = [rs[0].summary for rs in results.values() if rs]
    clustered = any(c.get("cluster") is not None for s in firsts for c in s.get("clients", []))
    cut = any(s.get("collaboration_cut") for s in firsts)
    return {"collaboration": heatmap_note(clustered, cut)}


def _how_to_read(rows: list[dict[str, Any]], target: float | None) -> list[str]:
    """The notes under the table: what each column means (only those shown)."""
    reads = [
        "Accuracy: mean over clients at the last round, in % (mean over seeds).",
        "Imp.: the share of clients (%) whose accuracy beats their Local model's.",
        "Worst 10/20 %: mean accuracy (%) of the weakest clients.",
    ]
    if target is not None:
        reads.append(f"Rounds to target: the first evaluation at or above {100 * target:g} %.")
    sent = [r.get("megabytes_sent") is None for r in rows]
    if any(sent) and not all(sent):
        reads.append("Sent: n/a where a method does not count what it sends.")
    reads.append(
        "Wall: seconds per entry; the first entry run in a process also pays the one-time "
        "start-up (imports, data loading)."
    )
    return reads


def _data_section(data: dict[str, Any] | None, cfg: Config) -> str:
    """The data report: one line of counts and the warnings about it."""
    if data is None:
        return ""
    from raycobo.data.report import describe, warnings

    lines = [describe(data).removeprefix("data: "), *warnings(data, cfg)]
    body = "<br>".join(html.escape(x) for x in lines)
    return f"<h2>Data</h2><p class=note>{body}</p>"


def write_report(
    root: Path,
    cfg: Config,
    rows: list[dict[str, Any]],
    plot_files: list[Path],
    cfgs: dict[tuple[str, int], Config],
    data: dict[str, Any] | None = None,
    notes: dict[str, str] | None = None,
) -> Path:
    """``report.html``: one self-contained page (images embedded) with the table, the
    plots, the data the clients got, the settings and where the result came from."""
    esc = html.escape
    seeds = ", ".join(map(str, sorted({x for r in rows for x in r["seeds"]})))
    reads = _how_to_read(rows, cfg.compare.target_accuracy)
    record = provenance()
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>raycobo compare: {esc(cfg.name)}</title>
<style>body{{font-family:sans-serif;margin:1em auto;max-width:1100px;padding:0 1em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
table.kv th,table.kv td{{text-align:left}}.scroll{{overflow-x:auto}}img{{max-width:100%}}
.row{{display:flex;flex-wrap:wrap;gap:1em}}.row figure{{flex:1 1 420px;margin:0}}
.wide img{{min-width:640px}}figure{{margin:1em 0}}
.note,figcaption,.prov{{color:#555;font-size:90%}}</style>
</head><body>
<h1>{esc(cfg.name)}: {esc(", ".join(r["algorithm"] for r in rows))}</h1>
<p class=prov>{esc(describe(record))}<br>command: <code>{esc(record["command"])}</code></p>
<p>{esc(cfg.data.name)} / {esc(cfg.data.partition.kind)}, {cfg.rounds} rounds, seeds
{esc(seeds)}.</p>
<h2>Results</h2><div class=scroll>{html_table(rows)}</div>
<p class=note>{"<br>".join(esc(x) for x in reads)}</p>
<h2>Plots</h2>{_figures(plot_files, notes or {})}
{_data_section(data, cfg)}
<h2>Settings</h2>{settings_tables(cfgs)}
<p class=note>Each run's full resolved config is config.yaml in its run directory.</p>
</body></html>
"""
    path = root / "report.html"
    path.write_text(page)
    return path
