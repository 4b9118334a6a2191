"""The grid's table (and plot) from its runs, beside PFLlib's published figures.

Usage: python benchmarks/pfl_grid/report.py [--results benchmarks/pfl_grid/results] [--quick]

The metric is PFLlib's: the sample-weighted mean test accuracy (every client's correct
answers over all the clients' test samples) of an evaluation, read from each run's
``metrics.csv`` with the clients' test sizes from its partition as the run ends
(``weighted_accuracy``; run.py records it in ``results/<setting>.jsonl``). "best" is the best
evaluation of a run (what PFLlib's table reports), "last" its last; each is the mean
over seeds +- the standard deviation. A difference from PFLlib's figure counts when it
is larger than twice our standard deviation over seeds and PFLlib's own together.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
START, END = "<!-- pfl-grid:start -->", "<!-- pfl-grid:end -->"

# pfllib.com/benchmark (2025-03): FMNIST, the 4-layer CNN, mean +- std of the best round
PFLLIB = {
    "pathological": {
        "fedavg": (80.41, 0.08),
        "ditto": (99.44, 0.06),
        "fedfomo": (99.46, 0.01),
        "fedamp": (99.42, 0.03),
        "apple": (99.30, 0.01),
        "fedala": (99.57, 0.01),
    },
    "dir0.1": {
        "fedavg": (85.85, 0.19),
        "ditto": (97.47, 0.04),
        "fedfomo": (97.21, 0.02),
        "fedamp": (97.20, 0.06),
        "apple": (97.06, 0.07),
        "fedala": (97.66, 0.02),
    },
}
TITLES = {"pathological": "pathological (2 classes a client)", "dir0.1": "Dirichlet(0.1)"}


@cache
def _test_sizes(config: str) -> tuple[int, ...]:
    """The clients' test sizes of a run's partition (runs of one seed share it)."""
    from raycobo.config import load_stored_config
    from raycobo.data import load_data

    data = load_data(load_stored_config(Path(config)))
    return tuple(t.numel() for t in data.test_idx)


def weighted_accuracy(run_dir: Path) -> dict[int, float]:
    """round -> sample-weighted mean test accuracy, from the run's metrics.csv."""
    cfg_text = (run_dir / "config.yaml").read_text()
    sizes = _test_sizes_of(run_dir, cfg_text)
    sums: dict[int, list[float]] = {}
    with (run_dir / "metrics.csv").open() as f:
        for row in csv.DictReader(f):
            if row["accuracy"] in ("", "None"):
                continue
            r, c = int(row["round"]), int(row["client"])
            s = sums.setdefault(r, [0.0, 0.0])
            s[0] += float(row["accuracy"]) * sizes[c]
            s[1] += sizes[c]
    return {r: a / n for r, (a, n) in sorted(sums.items()) if n}


def _test_sizes_of(run_dir: Path, cfg_text: str) -> tuple[int, ...]:
    """Test sizes keyed by the run's data section and seed, not its folder."""
    import yaml

    cfg = yaml.safe_load(cfg_text)
    key = json.dumps({"data": cfg.get("data"), "seed": cfg.get("seed")}, sort_keys=True)
    return _sizes_by_key(key, str(run_dir / "config.yaml"))


_SIZES: dict[str, tuple[int, ...]] = {}


def _sizes_by_key(key: str, config: str) -> tuple[int, ...]:
    if key not in _SIZES:
        _SIZES[key] = _test_sizes(config)
    return _SIZES[key]


def _stats(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0
    return m, sd


def last_rows(record: Path) -> dict[tuple[str, int], dict]:
    """(entry, seed) -> its last line in a setting's record (a run done again wins)."""
    rows = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return {(r["entry"], r["seed"]): r for r in rows}


def collect(results: Path) -> dict[str, dict[str, dict]]:
    """setting -> entry -> {best, last: (mean, std) in %, seeds, failed}, from the
    record of each setting's runs (``results/<setting>.jsonl``: a run's last line)."""
    grid: dict[str, dict[str, dict]] = {}
    for record in sorted(
        results.glob("*.jsonl"),
        key=lambda p: list(TITLES).index(p.stem) if p.stem in TITLES else len(TITLES),
    ):
        runs: dict[str, list[dict]] = {}
        for (entry, _), row in last_rows(record).items():
            runs.setdefault(entry, []).append(row)
        table: dict[str, dict] = {}
        for entry, rows in runs.items():
            done = [r["accuracy"] for r in rows if r["status"] == "completed" and r["accuracy"]]
            if not done:
                continue
            best = [100 * max(acc.values()) for acc in done]
            last = [100 * acc[max(acc, key=int)] for acc in done]
            table[entry] = {
                "best": _stats(best),
                "last": _stats(last),
                "seeds": len(done),
                "failed": sorted(r["seed"] for r in rows if r["status"] != "completed"),
            }
        grid[record.stem] = table
    return grid


def verdict(ours: tuple[float, float], theirs: tuple[float, float] | None, seeds: int = 3) -> str:
    if theirs is None:
        return ""
    diff = ours[0] - theirs[0]
    if seeds < 2:
        return f"{diff:+.1f} (one seed: no noise measured)"
    noise = 2 * math.hypot(ours[1], theirs[1])
    return f"{diff:+.1f}" + (" (outside noise)" if abs(diff) > noise else " (within noise)")


def table(grid: dict[str, dict[str, dict]]) -> str:
    lines = []
    for setting in [*TITLES, *(s for s in grid if s not in TITLES)]:
        rows = grid.get(setting)
        if not rows:
            lines += [f"**{TITLES.get(setting, setting)}**: no run recorded yet.", ""]
            continue
        ref = PFLLIB.get(setting, {})
        lines += [
            f"**{TITLES.get(setting, setting)}**",
            "",
            "| method | seeds | best (ours) | last (ours) | PFLlib (best) | ours − PFLlib |",
            "|---|---|---|---|---|---|",
        ]
        order = sorted(rows, key=lambda e: -rows[e]["best"][0])
        for e in order:
            r = rows[e]
            theirs = ref.get(e)
            shown = "–" if theirs is None else f"{theirs[0]:.2f} ± {theirs[1]:.2f}"
            said = verdict(r["best"], theirs, r["seeds"])
            seeds = str(r["seeds"]) + (
                f" ({', '.join(map(str, r['failed']))} failed)" if r["failed"] else ""
            )
            lines.append(
                f"| {e} | {seeds} | {r['best'][0]:.1f} ± {r['best'][1]:.1f} | "
                f"{r['last'][0]:.1f} ± {r['last'][1]:.1f} | {shown} | {said} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(grid: dict[str, dict[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(grid), figsize=(6 * len(grid), 4.5), squeeze=False)
    for ax, (setting, rows) in zip(axes[0], grid.items(), strict=True):
        names = sorted(rows, key=lambda e: -rows[e]["best"][0])
        xs = range(len(names))
        ax.bar(
            xs,
            [rows[e]["best"][0] for e in names],
            yerr=[rows[e]["best"][1] for e in names],
            color="tab:blue",
            label="ours, best evaluation",
        )
        ax.scatter(
            xs,
            [rows[e]["last"][0] for e in names],
            color="black",
            marker="_",
            s=200,
            label="ours, last",
            zorder=3,
        )
        ref = PFLLIB.get(setting, {})
        pts = [(i, ref[e][0]) for i, e in enumerate(names) if e in ref]
        if pts:
            ax.scatter(
                *zip(*pts, strict=True),
                color="tab:red",
                marker="D",
                label="PFLlib (best)",
                zorder=4,
            )
        ax.set_xticks(list(xs), names, rotation=60, ha="right")
        ax.set_ylabel("sample-weighted test accuracy (%)")
        ax.set_title(TITLES.get(setting, setting))
        ax.set_ylim(0, 100)
        ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(grid: dict[str, dict[str, dict]]) -> str:
    intro = (HERE / "intro.md").read_text().strip()
    return (
        f"{START}\n{intro}\n\n{table(grid)}\n![the grid](benchmarks/pfl_grid/pfl_grid.png)\n{END}"
    )


def write_report(results: Path, quick: bool = False) -> Path:
    """The table into FIDELITY.md (its pfl-grid section) and the plot beside this file;
    ``quick``: both into ``results`` instead."""
    grid = collect(results)
    if quick:
        (results / "pfl_grid.md").write_text(table(grid))
        plot(grid, results / "pfl_grid.png")
        return results / "pfl_grid.md"
    plot(grid, HERE / "pfl_grid.png")
    target = REPO / "FIDELITY.md"
    text = target.read_text()
    new = section(grid)
    if START in text:
        text = text[: text.index(START)] + new + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n" + new + "\n"
    target.write_text(text)
    return target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=None, help="the runs' record folder")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    quick = REPO / "runs" / "pfl-grid" / "quick" / "results"
    results = args.results or (quick if args.quick else HERE / "results")
    print(f"wrote {write_report(results, args.quick)}")


if __name__ == "__main__":
    main()
