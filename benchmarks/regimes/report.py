"""The regime matrix's table and plot from ``run.py``'s results.

Usage: python benchmarks/regimes/report.py [--out DIR] [--split test|validation]
       [--write REGIMES.md] [--plot PATH]

Per cell and entry: the score (accuracy, or loss for the quadratic cells), the share of
the Local -> Oracle gap closed ((entry - local) / (oracle - local), in the metric's
direction), W within/across at the end and the share of each row's mass inside its
cluster, over seeds (mean; runs that diverged are counted and shown). On a cell without
clusters (its ``baselines``): the margin over the best of its baselines, in points.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def sibling(name: str):
    """benchmarks/regimes/<name>.py as a module of its own name (the fidelity suite has a
    run.py too: both are imported in one test session)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"regimes_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_run = sibling("run")
load_cells, read_results, clients = _run.load_cells, _run.read_results, _run.clients

MIN_GAP = {"accuracy": 0.03, "loss": 0.0}  # cells where Oracle - Local >= 3 points count
# methods whose collaboration matrix has negative weights: their rows' mass_inside counts
# only where it was of |w| (``mass_of``); before that it was no share (below 0, above 1)
SIGNED = ("fedfomo", "apple")


def _mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(xs) if xs else None


def _seed_mean(rows: list[dict], seeds: set, key: str) -> float | None:
    return _mean([r[key] for r in rows if r["seed"] in seeds and not r["diverged"]])


def _on_cpu(row: dict) -> bool:
    return row.get("device", "cpu") == "cpu"


def _one_thread(row: dict) -> bool:
    """A CPU run on one torch thread (rows written before run.py recorded ``threads`` ran
    on one; the one that ran on two has the field, added by hand)."""
    return _on_cpu(row) and row.get("threads", 1) == 1


def current(
    rows: list[dict], shown: list[str] | None = None, only: list[str] | None = None
) -> tuple[list[dict], list[str]]:
    """The rows that count as their entry's run now: a row of the defaults (``cobo``) or
    of a candidate whose recorded settings differ from the entry's settings today (a
    default changed since, where it acts on the row's cell) is left out, so that a cell
    not run again shows no figure rather than an old one under the new name. -> (rows,
    one line per left-out cell and entry, of the entries ``shown`` and the cells ``only``
    where given)"""
    cells = {c["id"]: c for c in load_cells()}
    overrides = {"cobo": {}, **_run.load_candidates()}
    now: dict[tuple[str, str], dict] = {}  # (cell, entry) -> its settings on that cell
    last = {(r["cell"], r["entry"], r["seed"]): r for r in rows}
    stale = defaultdict(list)
    for (cell, entry, seed), r in last.items():
        if entry not in overrides:
            continue
        if (cell, entry) not in now:
            now[(cell, entry)] = _run.entry_settings("cobo", overrides[entry], cells.get(cell))
        if not _run.same_settings(r.get("settings"), now[(cell, entry)], cells.get(cell)):
            stale[(cell, entry)].append(seed)
    kept = [r for r in rows if r["seed"] not in stale.get((r["cell"], r["entry"]), ())]
    notes = [
        f"{cell} {entry} (seeds {', '.join(map(str, sorted(seeds)))})"
        for (cell, entry), seeds in sorted(stale.items())
        if (shown is None or entry in shown) and (only is None or cell in only)
    ]
    return kept, notes


def summarize(rows: list[dict]) -> dict:
    """-> {cell: {entry: {score, gap, diverged, n, w_within, w_across, mass_inside,
    mass_pulled}}}"""
    cells = load_cells()
    metric = {c["id"]: c.get("metric", "accuracy") for c in cells}
    unclustered = {c["id"]: c for c in cells if c.get("baselines")}
    last = {(r["cell"], r["entry"], r["seed"]): r for r in rows}  # a run done again: its last
    by = defaultdict(lambda: defaultdict(list))
    for r in last.values():
        by[r["cell"]][r["entry"]].append(r)
    table = {}
    for cell, entries in by.items():
        key = metric.get(cell, "accuracy")
        if cell in unclustered:
            table[cell] = margins(entries, unclustered[cell], key)
            continue
        score = {e: _mean([r[key] for r in rs if not r["diverged"]]) for e, rs in entries.items()}
        table[cell] = {}
        for e, rs in entries.items():
            s = score[e]
            # over the seeds this entry and both baselines ran (an entry run on fewer
            # seeds is measured against the same ones, and so is one whose baselines
            # ran on fewer)
            seeds = {r["seed"] for r in rs}
            for base in ("local", "oracle"):
                seeds &= {r["seed"] for r in entries.get(base, [])}
            local = _seed_mean(entries.get("local", []), seeds, key)
            oracle = _seed_mean(entries.get("oracle", []), seeds, key)
            mine = _seed_mean(rs, seeds, key)
            gap = None
            if None not in (mine, local, oracle) and oracle != local:
                gap = (mine - local) / (oracle - local)
            table[cell][e] = {
                "score": s,
                "gap": gap,
                "gap_se": gap_se(rs, entries, seeds, key),
                "n": len(rs),
                "diverged": sum(r["diverged"] for r in rs),
                "w_within": _mean([r.get("w_within") for r in rs]),
                "w_across": _mean([r.get("w_across") for r in rs]),
                "mass_inside": _mean([r.get("mass_inside") for r in rs if _a_share(r)]),
                "mass_pulled": _mean([r.get("mass_pulled_inside") for r in rs]),
                # wall time on one CPU thread; rows from a GPU call (several runs at
                # once on one GPU) or on more threads are not that and are left out
                "seconds": _mean([r.get("seconds") for r in rs if _one_thread(r)]),
                "devices": sorted({r.get("device", "cpu") for r in rs}),
                "metric": key,
            }
    return table


def margins(entries: dict[str, list[dict]], cell: dict, key: str) -> dict:
    """A cell without clusters: per entry its score and, for an entry that is not one of
    the cell's baselines, its margin over the best of them: the baseline entry (a grid
    point, on validation) with the best mean over the seeds that it and the entry ran,
    with the paired standard error over those seeds. -> {entry: {score, margin,
    margin_se, best, baseline, n, diverged, seconds, metric, and the other cells' keys
    (gap, W's shares) as None}}"""
    sign = 1.0 if key == "accuracy" else -1.0
    per = {  # entry -> seed -> score (a diverged run scores no seed)
        e: {r["seed"]: r[key] for r in rs if not r["diverged"] and r[key] is not None}
        for e, rs in entries.items()
    }
    out = {}
    for e, rs in entries.items():
        v = {
            "score": _mean(list(per[e].values())),
            "margin": None,
            "margin_se": None,
            "best": None,
            "n": len(rs),
            "diverged": sum(r["diverged"] for r in rs),
            "seconds": _mean([r.get("seconds") for r in rs if _one_thread(r)]),
            "metric": key,
            "baseline": _run.baseline_of(e, cell) is not None,
            "devices": sorted({r.get("device", "cpu") for r in rs}),
            **dict.fromkeys(("gap", "gap_se", "w_within", "w_across", "mass_inside")),
            "mass_pulled": None,
        }
        out[e] = v
        if v["baseline"]:
            continue
        best, best_mean = None, None
        for b in entries:
            seeds = set(per[e]) & set(per[b])
            if _run.baseline_of(b, cell) is None or not seeds:
                continue
            m = statistics.fmean(per[b][s] for s in seeds)
            if best is None or sign * m > sign * best_mean:
                best, best_mean = b, m
        if best is None:
            continue
        diffs = [sign * (per[e][s] - per[best][s]) for s in sorted(set(per[e]) & set(per[best]))]
        v["best"], v["margin"] = best, statistics.fmean(diffs)
        if len(diffs) > 1:
            v["margin_se"] = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return out


def behind(v: dict) -> bool:
    """Whether an entry's margin over the best baseline is below 0 by more than noise
    (twice its standard error; with one seed, any amount)."""
    if v.get("margin") is None:
        return False
    return v["margin"] + 2 * (v.get("margin_se") or 0.0) < 0


def _a_share(row: dict) -> bool:
    """Whether the row's mass_inside is a share of the mass (see SIGNED)."""
    return row.get("method") not in SIGNED or row.get("mass_of") == "abs"


def gap_se(rows: list[dict], entries: dict, seeds: set, key: str) -> float | None:
    """The standard error of the gap closed over seeds: the spread of the per-seed gaps
    (each seed's entry against that seed's baselines) over the square root of their
    number; None with fewer than two seeds. A cell whose gap is small in points has a
    large one: a point of one seed's accuracy moves its gap closed a lot."""
    one = {}
    for name in ("local", "oracle"):
        one[name] = {r["seed"]: r[key] for r in entries.get(name, []) if not r["diverged"]}
    per = []
    for r in rows:
        s = r["seed"]
        if s not in seeds or r["diverged"] or s not in one["local"] or s not in one["oracle"]:
            continue
        span = one["oracle"][s] - one["local"][s]
        if span:
            per.append((r[key] - one["local"][s]) / span)
    if len(per) < 2:
        return None
    return statistics.stdev(per) / math.sqrt(len(per))


def counts(table: dict, cell: str) -> bool:
    """Does the cell count for the targets (Oracle - Local >= 3 points of accuracy, or
    any gap in loss)?"""
    t = table[cell]
    if "local" not in t or "oracle" not in t or None in (t["local"]["score"], t["oracle"]["score"]):
        return False
    key = t["local"]["metric"]
    diff = t["oracle"]["score"] - t["local"]["score"]
    return diff >= MIN_GAP[key] if key == "accuracy" else -diff > 0


def fmt_score(v: dict | None) -> str:
    if v is None or v["score"] is None:
        return "diverged" if v and v["diverged"] else "-"
    s = f"{100 * v['score']:.1f}" if v["metric"] == "accuracy" else f"{v['score']:.4f}"
    return s + (f" ({v['diverged']} div.)" if v["diverged"] else "")


def time_over_local(v: dict, local: dict | None) -> float | None:
    """The entry's run time over Local's on the same cell (one CPU thread each; None where
    either has no such row)."""
    if not v.get("seconds") or not local or not local.get("seconds"):
        return None
    return v["seconds"] / local["seconds"]


def _cost(v: dict, local: dict | None) -> str:
    """The cell's ", 2.4× time" (``time_over_local``; "" where there is none)."""
    ratio = time_over_local(v, local)
    return "" if ratio is None else f", {ratio:.1f}× time"


def markdown(table: dict, entries: list[str]) -> str:
    cells = [c["id"] for c in load_cells() if c["id"] in table and not c.get("baselines")]
    head = "| cell | Local | Oracle | " + " | ".join(entries) + " |"
    lines = [head, "|" + "---|" * (3 + len(entries))]
    for cell in cells:
        t = table[cell]
        row = [
            cell + ("" if counts(table, cell) else " (gap < 3)"),
            fmt_score(t.get("local")),
            fmt_score(t.get("oracle")),
        ]
        for e in entries:
            v = t.get(e)
            if v is None:
                row.append("-")
                continue
            gap = "" if v["gap"] is None else f", **{100 * v['gap']:.0f} %**"
            if v["gap"] is not None and v.get("gap_se") is not None:
                gap += f" ± {100 * v['gap_se']:.0f}"
            inside = "" if v["mass_inside"] is None else f", in {v['mass_inside']:.2f}"
            if v.get("mass_pulled") is not None:
                inside += f" (pulled {v['mass_pulled']:.2f})"
            row.append(fmt_score(v) + gap + inside + _cost(v, t.get("local")))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def markdown_unclustered(table: dict, entries: list[str]) -> str:
    """The cells without clusters: the best baseline, and each entry's margin over it
    (points, ± its standard error over seeds); "" where none ran."""
    cells = [c["id"] for c in load_cells() if c["id"] in table and c.get("baselines")]
    if not cells:
        return ""
    lines = [
        "| cell (no clusters) | best baseline | " + " | ".join(entries) + " |",
        "|" + "---|" * (2 + len(entries)),
    ]
    for cell in cells:
        t = table[cell]
        shown = [t[e] for e in entries if e in t and t[e].get("best")]
        best = shown[0]["best"] if shown else None
        row = [cell, "-" if best is None else f"{best}: {fmt_score(t[best])}"]
        for e in entries:
            v = t.get(e)
            if v is None:
                row.append("-")
                continue
            text = fmt_score(v)
            if v.get("margin") is not None:
                scale = 100 if v["metric"] == "accuracy" else 1
                text += f", **{scale * v['margin']:+.1f}**"
                if v.get("margin_se") is not None:
                    text += f" ± {scale * v['margin_se']:.1f}"
                if v["best"] != best:
                    text += f" (vs {v['best']})"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


COST_BAR = 2.0  # issue #67: a run at most this many times Local's on the same cell


def _dear(cells: list[tuple], beside: str | None = None) -> str:
    """The cells over ``COST_BAR``: "cell 2.7× (paper 2.2×)" each, with ``beside``'s
    ratio where it has one."""
    return _names(
        [
            f"{cell} {ratio:.1f}×" + ("" if other is None else f" ({beside} {other:.1f}×)")
            for cell, ratio, other in cells
        ]
    )


def verdict(table: dict, entry: str, beside: str | None = None) -> dict:
    """The issue's targets for one entry over the counted cells (``beside``: an entry
    whose time over Local's is shown beside this one's where this one's is over
    ``COST_BAR``)."""
    gaps, worst, below_local, short, low_mass, low_whole, div = [], None, [], [], [], [], []
    cost = []  # the entry's seconds over Local's on the same cell (one CPU thread each)
    dear = []  # (cell, that ratio, beside's there) where the ratio is over COST_BAR
    unclustered, short_of_best = [], []
    for cell in table:
        v = table[cell].get(entry)
        if v is not None and "margin" in v:
            if v["margin"] is not None:
                unclustered.append(cell)
                if behind(v):
                    short_of_best.append(cell)
            continue
        if v is None or not counts(table, cell):
            continue
        local = table[cell]["local"]
        ratio = time_over_local(v, local)
        if ratio is not None:
            cost.append(ratio)
            if round(ratio, 1) > COST_BAR:  # as the table shows it
                other = table[cell].get(beside) if beside else None
                dear.append((cell, ratio, time_over_local(other, local) if other else None))
        if v["diverged"]:
            div.append(cell)
        if v["gap"] is not None:
            gaps.append(v["gap"])
            worst = v["gap"] if worst is None else min(worst, v["gap"])
            if v["gap"] < 0:
                below_local.append(cell)
            if v["gap"] < 0.75:
                short.append(cell)
        mass = v["mass_inside"] if v.get("mass_pulled") is None else v["mass_pulled"]
        if mass is not None and mass < 0.9:  # the weights the pull reads, where it cuts
            low_mass.append(cell)
        if v["mass_inside"] is not None and v["mass_inside"] < 0.9:  # the whole of W
            low_whole.append(cell)
    return {
        "cells": len(gaps),
        "median_gap": statistics.median(gaps) if gaps else None,
        "worst_gap": worst,
        "below_local": below_local,
        "below_0.75": short,
        "mass_below_0.9": low_mass,
        "whole_mass_below_0.9": low_whole,
        "diverged": div,
        "median_cost": statistics.median(cost) if cost else None,
        "over_cost_bar": dear,
        "unclustered": unclustered,
        "behind_best": short_of_best,
    }


def _names(cells: list[str]) -> str:
    return ", ".join(cells) or "none"


def plot(table: dict, entries: list[str], path: Path) -> Path:
    """Gap closed per cell (cells ordered by clients, then rounds), one bar per entry."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in load_cells() if c["id"] in table and counts(table, c["id"])]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(cells) + 2), 4))
    width = 0.8 / max(len(entries), 1)
    for k, e in enumerate(entries):
        xs, ys = [], []
        for x, c in enumerate(cells):
            v = table[c["id"]].get(e)
            if v is not None and v["gap"] is not None:
                xs.append(x + (k - (len(entries) - 1) / 2) * width)
                ys.append(100 * max(v["gap"], -1.0))  # below -100 % drawn at -100
        ax.bar(xs, ys, width, label=e)
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(75, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(cells)), [c["id"] for c in cells], rotation=30, ha="right")
    ax.set_ylabel("Local -> Oracle gap closed (%)")
    ax.set_ylim(-100, 110)
    ax.set_title("CoBo on the regime matrix (0 = Local, 100 = Oracle; dashed: 75 %)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scaling(table: dict, entry: str = "cobo", min_clients: int = 80) -> str:
    """The cross-device cells (at least ``min_clients``) by n: the entry's score, gap
    closed, W within/across, the pulled mass inside, and seconds per round of its run
    (wall time over rounds, evaluations included, one torch thread)."""
    head = (
        "| n | cell | rounds | Local | Oracle | CoBo | gap closed | W within / across | "
        "pulled mass inside | s / round (1 CPU thread) | run on |"
    )
    lines, missing = [head, "|" + "---|" * 11], []
    cells = [(clients(c), c) for c in load_cells() if c["id"] in table]
    for n, c in sorted((x for x in cells if x[0] and x[0] >= min_clients), key=lambda x: x[0]):
        t, v = table[c["id"]], table[c["id"]].get(entry)
        if v is None:
            missing.append(c["id"])
            continue
        gap = "-" if v["gap"] is None else f"{100 * v['gap']:.0f} %"
        w = "-" if v["w_within"] is None else f"{v['w_within']:.2f} / {v['w_across']:.3f}"
        mass = v.get("mass_pulled") if v.get("mass_pulled") is not None else v["mass_inside"]
        sec = "-" if v["seconds"] is None else f"{v['seconds'] / c['config']['rounds']:.3f}"
        lines.append(
            f"| {n} | {c['id']} | {c['config']['rounds']} | {fmt_score(t.get('local'))} | "
            f"{fmt_score(t.get('oracle'))} | {fmt_score(v)} | {gap} | {w} | "
            f"{'-' if mass is None else f'{mass:.2f}'} | {sec} | {', '.join(v['devices'])} |"
        )
    if missing:
        lines += ["", f"Not run with `{entry}`'s settings of now: {', '.join(missing)}."]
    return "\n".join(lines)


def plot_scaling(table: dict, entries: list[str], path: Path, min_clients: int = 80) -> Path:
    """Gap closed and seconds per round against n on the cross-device cells (the longest
    run of each n), one line per entry."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    longest: dict[int, dict] = {}
    for c in load_cells():
        n = clients(c)
        if c["id"] not in table or not n or n < min_clients:
            continue
        if n not in longest or c["config"]["rounds"] > longest[n]["config"]["rounds"]:
            longest[n] = c
    fig, (gap_ax, sec_ax) = plt.subplots(1, 2, figsize=(9, 3.6))
    for e in entries:
        pts = [(n, table[c["id"]].get(e), c) for n, c in sorted(longest.items())]
        pts = [(n, v, c) for n, v, c in pts if v is not None and v["gap"] is not None]
        if not pts:
            continue
        ns = [n for n, _, _ in pts]
        gap_ax.plot(ns, [100 * v["gap"] for _, v, _ in pts], "o-", label=e)
        timed = [(n, v["seconds"] / c["config"]["rounds"]) for n, v, c in pts if v["seconds"]]
        sec_ax.plot([n for n, _ in timed], [s for _, s in timed], "o-", label=e)
    gap_ax.axhline(75, color="grey", lw=0.8, ls="--")
    gap_ax.set(xscale="log", xlabel="clients n", ylabel="Local -> Oracle gap closed (%)")
    sec_ax.set(xscale="log", yscale="log", xlabel="clients n", ylabel="seconds per round")
    gap_ax.legend(fontsize=8)
    fig.suptitle(
        "CoBo against n (cross-device cells, each n's longest run; s/round: one CPU thread)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


BLOCK = "regimes"  # FIDELITY.md's block: between <!-- regimes:start --> and its end


def tuned_points(rows: list[dict]) -> str:
    """Which sweep point each cell's ``tuned`` entry ran (its last rows')."""
    chosen = {r["cell"]: r["overrides"] for r in rows if r["entry"] == "tuned"}
    ids = [c["id"] for c in load_cells() if c["id"] in chosen]
    points = "; ".join(
        f"{cell} " + ", ".join(f"{k} {v}" for k, v in chosen[cell].items()) for cell in ids
    )
    return f"`tuned`, the sweep point best on each cell's validation split: {points}."


def write_block(path: Path, text: str, name: str = BLOCK) -> None:
    """Put ``text`` between the markers of block ``name`` in ``path`` (appended if
    absent)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    old = path.read_text() if path.is_file() else ""
    block = f"{start}\n{text.rstrip()}\n{end}\n"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        new = head + block + rest.split(end, 1)[1].lstrip("\n")
    else:
        new = old.rstrip("\n") + "\n\n" + block
    path.write_text(new)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--split", choices=["test", "validation"], default="test")
    ap.add_argument("--entries", default="", help="columns (default: every CoBo entry)")
    ap.add_argument("--write", type=Path, default=None, help="put the table in this file")
    ap.add_argument("--plot", type=Path, default=None, help="the gap-closed plot (PNG)")
    ap.add_argument("--scaling-plot", type=Path, default=None, help="gap and s/round vs n")
    ap.add_argument("--intro", type=Path, default=None, help="text above the table")
    ap.add_argument("--cells", default="", help="only these cells (default: every cell run)")
    ap.add_argument("--block", default=BLOCK, help="the block of --write's file to replace")
    ap.add_argument("--no-scaling", action="store_true", help="leave out CoBo's defaults against n")
    args = ap.parse_args()
    shown = args.entries.split(",") if args.entries else None
    only = args.cells.split(",") if args.cells else None
    rows, stale = current(read_results(args.out / args.split / "results.jsonl"), shown, only)
    table = summarize(rows)
    if only:
        table = {cell: t for cell, t in table.items() if cell in only}
    entries = shown or sorted(
        {
            e
            for t in table.values()
            for e, v in t.items()
            if not e.startswith(_run.SWEEP) and not v.get("baseline")
        }
        - {"local", "oracle"}
    )
    lines = [markdown(table, entries), ""]
    if unclustered := markdown_unclustered(table, entries):
        lines += [unclustered, ""]
    cobo = {r["entry"] for r in rows if r.get("method") == "cobo"} - {"paper"}
    for e in entries:
        beside = "paper" if e in cobo else None
        v = verdict(table, e, beside)
        med = "-" if v["median_gap"] is None else f"{100 * v['median_gap']:.0f} %"
        worst = "-" if v["worst_gap"] is None else f"{100 * v['worst_gap']:.0f} %"
        cost = "-" if v["median_cost"] is None else f"{v['median_cost']:.1f}x"
        lines.append(
            f"- `{e}`: {v['cells']} cells with a gap, median closed {med}, worst {worst}; "
            f"time a run against Local's (median over the cells) {cost}, over "
            f"{COST_BAR:g}× on {_dear(v['over_cost_bar'], beside)}; "
            f"below Local: {_names(v['below_local'])}; under 75 % of the gap: "
            f"{_names(v['below_0.75'])}; pulled mass inside < 0.9: "
            f"{_names(v['mass_below_0.9'])}; whole-W mass inside < 0.9: "
            f"{_names(v['whole_mass_below_0.9'])}; diverged: {_names(v['diverged'])}"
            + (
                f"; {len(v['unclustered'])} cells without clusters, behind the best "
                f"baseline by more than noise: {_names(v['behind_best'])}"
                if v["unclustered"]
                else ""
            )
        )
    if stale:
        lines += [
            "",
            "Not run again since their entry's settings changed where they act (left out "
            "above): " + "; ".join(stale) + ".",
        ]
    if "tuned" in entries:
        lines += ["", tuned_points(rows)]
    lines += (
        []
        if args.no_scaling
        else [
            "",
            "**CoBo's defaults against n** (the cross-device cells; seconds per round are each "
            "CPU run's wall time over its rounds, evaluations included, one torch thread, two "
            "runs sharing the 2 cores: a measure of cost, not a benchmark; rows run on the GPU "
            "machine, several at once, show none; the plot: each n's longest run):",
            "",
            scaling(table),
            "",
            "![gap closed and seconds per round against n](benchmarks/regimes/scaling.png)",
        ]
    )
    text = "\n".join(lines)
    print(text)
    if args.plot:
        print(f"wrote {plot(table, entries, args.plot)}")
    if args.scaling_plot:
        print(f"wrote {plot_scaling(table, entries, args.scaling_plot)}")
    if args.write:
        intro = args.intro.read_text() if args.intro else ""
        write_block(args.write, intro + "\n" + text + "\n", args.block)
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
