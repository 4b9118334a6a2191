"""Choose between CoBo entries on the regime matrix's validation rows by the issue's bar,
the rule fixed before the rows it reads were run.

Usage: python benchmarks/regimes/choose.py --entries A,B[,...] --cells ID,...
       [--out DIR] [--split validation]

Per cell (its seeds where the entry and both baselines ran, as report.py measures the
gap): the share of the Local -> Oracle gap closed and the share of the whole W's mass
inside the clusters. An entry passes a cell where it closes at least 75 % of the gap and
keeps at least 90 % of the mass inside (where the cell has clusters) without diverging.
The entry passing the most cells wins; a tie goes to the higher mean gap over the cells.
Cells where an entry has no row count against it (no pass, no gap closed), and so
does a diverged run.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _report():
    """report.py beside this file, by path (benchmarks/fidelity has a report.py too)."""
    spec = importlib.util.spec_from_file_location("regimes_report", HERE / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_r = _report()
current, read_results, summarize = _r.current, _r.read_results, _r.summarize

GAP, MASS = 0.75, 0.90  # the bar


def passes(score: dict | None) -> bool:
    if not score or score["gap"] is None or score["diverged"]:
        return False
    mass = score["mass_inside"]
    return score["gap"] >= GAP and (mass is None or mass >= MASS)


def choose(table: dict, entries: list[str], cells: list[str]) -> tuple[str, list[str]]:
    """-> (the winning entry, one line per entry and cell, then one per entry)"""
    lines, key = [], {}
    for e in entries:
        gaps, passed = [], 0
        for c in cells:
            s = table.get(c, {}).get(e)
            if s is None:
                gaps.append(0.0)  # a missing run counts as no gap closed
                lines.append(f"{c:18s} {e:26s} no row")
                continue
            gap, mass, ok = s["gap"], s["mass_inside"], passes(s)
            gaps.append(gap if gap is not None else 0.0)
            passed += ok
            lines.append(
                f"{c:18s} {e:26s} seeds {s['n']}  gap "
                + ("-" if gap is None else f"{100 * gap:5.1f} %")
                + "  mass inside "
                + ("-" if mass is None else f"{mass:.3f}")
                + ("  pass" if ok else "")
            )
        mean_gap = statistics.fmean(gaps) if gaps else float("-inf")
        key[e] = (passed, mean_gap)
        lines.append(f"{e}: passes {passed} of {len(cells)} cells, mean gap {100 * mean_gap:.1f} %")
    best = max(entries, key=lambda e: key[e])
    return best, lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", required=True)
    ap.add_argument("--cells", required=True)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--split", choices=["test", "validation"], default="validation")
    args = ap.parse_args()
    rows, _ = current(read_results(args.out / args.split / "results.jsonl"))
    entries, cells = args.entries.split(","), args.cells.split(",")
    best, lines = choose(summarize(rows), entries, cells)
    print("\n".join(lines))
    print(f"chosen: {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
