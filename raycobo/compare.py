"""``raycobo compare``: several algorithms on the same data setting and seeds, side by side.

For every entry (an algorithm name, or a label of ``compare.variants``) and every seed it
runs ``run_experiment`` into ``OUT/<entry>/`` (one seed) or ``OUT/<entry>/seed<k>/``, then
writes, in OUT:

- ``comparison.md|csv|json`` -- a table like CoBo's Table 2: mean accuracy +- std over
  seeds, loss, Imp.(%) (share of clients beating Local, seed for seed), the fairness
  numbers of L2C's Table 3 (mean accuracy of the worst 10 % / 20 % of clients, std across
  clients), and the rounds to reach ``compare.target_accuracy``;
- ``plots/curves.png`` (accuracy and loss against rounds, mean +- std over seeds),
  ``plots/collaboration.png`` (W of every method at chosen rounds, side by side),
  ``plots/client_accuracy.png`` (per-client accuracy distribution);
- ``report.html`` -- the table, the plots and the resolved configs on one page.
"""

from __future__ import annotations

import contextlib
import csv
import html
import json
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from raycobo.callbacks import Callback, RunContext
from raycobo.config import Config, ConfigError, with_overrides
from raycobo.experiment import Result, RunFailed, run_experiment
from raycobo.run_dir import read_summary

TABLE_COLUMNS = [
    "algorithm",
    "seeds",
    "mean_accuracy",
    "std_accuracy",
    "mean_loss",
    "mean_perplexity",
    "improved_vs_local",
    "worst10_accuracy",
    "worst20_accuracy",
    "client_std_accuracy",
    "rounds_to_target",
    "wall_seconds",
    "megabytes_sent",
]


def entry_config(cfg: Config, entry: str, seed: int | None = None) -> Config:
    """The config of one compared entry: a variant's overrides, or ``algorithm.name`` set
    with ``compare.overrides[name]`` applied; then the seed."""
    if entry in cfg.compare.variants:
        extra = dict(cfg.compare.variants[entry])
    else:
        extra = {"algorithm.name": entry, **cfg.compare.overrides.get(entry, {})}
    if seed is not None:
        extra["seed"] = seed
    return with_overrides(cfg, extra)


def improved_share(summary: dict[str, Any], local: dict[str, Any] | None) -> float | None:
    """Share of clients whose final metric beats Local's (CoBo Table 2, "Imp.(%)")."""
    if local is None:
        return None
    mine, base = summary["clients"], local["clients"]
    key = "accuracy" if summary.get("mean_accuracy") is not None else "loss"
    pairs = [  # clients measured in both runs (a dropped client has no metric)
        (a[key], b[key])
        for a, b in zip(mine, base, strict=True)
        if a[key] is not None and b[key] is not None
    ]
    if not pairs:
        return None
    wins = [a > b if key == "accuracy" else a < b for a, b in pairs]
    return 100.0 * float(np.mean(wins))


def worst_share(values: list[float], share: float) -> float:
    """Mean of the lowest ``share`` of the values (at least one)."""
    v = np.sort(np.asarray(values, dtype=float))
    return float(v[: max(1, int(math.ceil(share * len(v))))].mean())


def rounds_to_target(history: list[dict[str, Any]], target: float | None) -> int | None:
    if target is None:
        return None
    for h in history:
        if h.get("mean_accuracy") is not None and h["mean_accuracy"] >= target:
            return int(h["round"])
    return None


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def finished(r: Result) -> bool:
    return r.summary.get("status") == "completed"


def failure_note(r: Result) -> str:
    """Where a run stopped, for its table row: 'seed 1: FloatingPointError at round 12'."""
    s = r.summary
    kind = (s.get("error") or "failed").split(":")[0]
    return f"seed {s.get('seed')}: {kind} at round {s.get('last_round', 0)}"


def summarize(
    entry: str, runs: list[Result], local_runs: list[Result] | None, target: float | None
) -> dict[str, Any]:
    """One table row over an entry's seeds; runs that failed are left out of the numbers
    and named in ``failed``."""
    failed = [failure_note(r) for r in runs if not finished(r)]
    done = [r for r in runs if finished(r)]
    sums = [r.summary for r in done]
    if not sums:
        return {
            **dict.fromkeys(TABLE_COLUMNS),
            "algorithm": entry,
            "seeds": [],
            "wall_seconds": None,
            "failed": failed,
            "run_dirs": [str(r.run_dir) for r in runs],
        }
    accs = [s["mean_accuracy"] for s in sums]
    has_acc = all(a is not None for a in accs)
    local_by_seed = {r.summary["seed"]: r.summary for r in (local_runs or []) if finished(r)}
    imps = (
        [improved_share(s, local_by_seed.get(s["seed"])) for s in sums]
        if local_runs is not None and entry != "local"
        else [None]
    )
    client_acc = [[c["accuracy"] for c in s["clients"]] for s in sums] if has_acc else None
    reach = [rounds_to_target(s["history"], target) for s in sums]
    return {
        "algorithm": entry,
        "seeds": [s["seed"] for s in sums],
        "mean_accuracy": _mean(accs) if has_acc else None,
        "std_accuracy": float(np.std(accs)) if has_acc else None,
        "mean_loss": _mean([s["mean_loss"] for s in sums]),
        "mean_perplexity": _mean([s.get("mean_perplexity") for s in sums]),
        "improved_vs_local": _mean(imps),
        "worst10_accuracy": _mean([worst_share(a, 0.1) for a in client_acc])
        if client_acc
        else None,
        "worst20_accuracy": _mean([worst_share(a, 0.2) for a in client_acc])
        if client_acc
        else None,
        "client_std_accuracy": _mean([float(np.std(a)) for a in client_acc])
        if client_acc
        else None,
        "rounds_to_target": None if any(r is None for r in reach) else float(np.mean(reach)),
        "wall_seconds": float(np.mean([s["wall_seconds"] for s in sums])),
        "megabytes_sent": _mean([s.get("megabytes_sent") for s in sums]),
        "failed": failed,
        "run_dirs": [str(r.run_dir) for r in runs],
    }


def run_compare(
    cfg: Config,
    entries: list[str],
    out: Path | None,
    make_callbacks: Callable[[str], list[Callback]] = lambda name: [],
    make_progress: Callable[[str], Any] = lambda name: None,
    parent: Callback | None = None,
    seeds: list[int] | None = None,
    parallel: bool = False,
    cpus_per_run: float = 1.0,
    resume: bool = False,
) -> tuple[Path, list[dict[str, Any]], dict[str, list[Result]]]:
    """Run every (entry, seed) and write the comparison. A run that fails (diverges) is
    kept as a failed row and the others go on. ``resume``: ``out`` is an earlier
    comparison; finished runs are read back, the others continue from their checkpoints."""
    if not entries:
        raise ConfigError("no algorithms to compare: pass --algorithms or set compare.algorithms")
    for e in entries:
        check_entry(e)
    seeds = seeds or cfg.compare.seeds or [cfg.seed]
    multi = len(seeds) > 1
    cfgs = {(e, s): entry_config(cfg, e, s) for e in entries for s in seeds}  # validate first
    if resume and (out is None or not (out / "config.yaml").is_file()):
        raise ConfigError(f"nothing to resume in {out}: no comparison config.yaml there")
    root = out or Path("runs") / f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.name}-compare"
    root.mkdir(parents=True, exist_ok=True)
    # what --resume needs to run the same comparison: its entries and seeds
    stored = with_overrides(cfg, {"compare.algorithms": entries, "compare.seeds": seeds})
    (root / "config.yaml").write_text(stored.to_yaml())
    pctx = RunContext(cfg, root)
    if parent is not None:
        parent.on_run_start(pctx)

    def run_dir(e: str, s: int) -> Path:
        return root / e / f"seed{s}" if multi else root / e

    try:
        results: dict[str, list[Result]] = {e: [] for e in entries}
        todo: dict[tuple[str, int], bool] = {}  # (entry, seed) -> continue a started run
        known: dict[tuple[str, int], Result] = {}
        for e in entries:
            for s in seeds:
                d = run_dir(e, s)
                old = read_summary(d) if resume else None
                if old is not None and old.get("status") == "completed":
                    known[(e, s)] = Result(d, old)
                else:
                    todo[(e, s)] = resume and (d / "config.yaml").is_file()
        if parallel and todo:
            jobs = {
                k: (cfgs[k], run_dir(*k), make_callbacks(k[0]), again) for k, again in todo.items()
            }
            known.update(run_parallel(jobs, cpus_per_run))
        else:
            for (e, s), again in todo.items():
                label = f"{e} seed {s}" if multi else e
                known[(e, s)] = run_one(
                    cfgs[(e, s)], run_dir(e, s), make_callbacks(e), make_progress(label), again
                )
        for e in entries:
            results[e] = [known[(e, s)] for s in seeds]
        local = results.get("local")
        target = cfg.compare.target_accuracy
        rows = [summarize(e, runs, local, target) for e, runs in results.items()]
        write_tables(root, rows)
        ok = {e: [r for r in runs if finished(r)] for e, runs in results.items()}
        plots = write_compare_plots(
            root, {e: rs for e, rs in ok.items() if rs}, cfg.compare.heatmap_rounds
        )
        write_report(root, cfg, rows, plots, cfgs)
    except BaseException as err:
        if parent is not None:
            status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
            with contextlib.suppress(Exception):
                parent.on_run_end(pctx, {"status": status})
        raise
    if parent is not None:
        log = getattr(parent, "log_files", None)
        if log is not None:
            log([root / "comparison.md", root / "comparison.csv", root / "report.html", *plots])
        failed = any(r.get("failed") for r in rows)
        parent.on_run_end(pctx, {"status": "failed" if failed else "completed", "table": rows})
    return root, rows, results


def check_entry(entry: str) -> None:
    """An entry becomes a folder under the comparison: a plain name only."""
    from raycobo.config import check_name

    try:
        check_name(entry, "compare entry")
    except ValueError as err:
        raise ConfigError(f"invalid {err}") from None


def run_one(
    cfg: Config, run_dir: Path, callbacks: list[Callback], progress: Any, again: bool
) -> Result:
    """One compared run; a run that fails midway comes back as its failed summary."""
    try:
        return run_experiment(cfg, run_dir, callbacks, progress, resume=again)
    except RunFailed as err:
        return Result(err.run_dir, read_summary(err.run_dir) or {"status": "failed"})


def _run_remote(
    cfg_dict: dict[str, Any], run_dir: str, callbacks: list[Callback], again: bool
) -> Result:
    from raycobo.config import validate

    return run_one(validate(cfg_dict), Path(run_dir), callbacks, None, again)


def run_parallel(
    jobs: dict[tuple[str, int], tuple[Config, Path, list[Callback], bool]], cpus_per_run: float
) -> dict[tuple[str, int], Result]:
    """Run every (entry, seed) as a Ray task of ``cpus_per_run`` CPUs, as many at once as
    the Ray instance (local, bound to 127.0.0.1, or ``engine.address``) has room for."""
    import ray

    from raycobo.engine.ray import start_ray

    first = next(iter(jobs.values()))[0]
    start_ray(first)
    task = ray.remote(num_cpus=cpus_per_run)(_run_remote)
    refs = {
        key: task.remote(cfg.to_dict(), str(path.resolve()), cbs, again)
        for key, (cfg, path, cbs, again) in jobs.items()
    }
    # a bound on the whole batch: every run may take up to engine.timeout_s
    results = ray.get(list(refs.values()), timeout=first.engine.timeout_s * len(jobs))
    return dict(zip(refs, results, strict=True))


def _pct(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{100 * v:.{digits}f}"


def write_tables(root: Path, rows: list[dict[str, Any]]) -> None:
    with (root / "comparison.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*TABLE_COLUMNS, "failed", "run_dirs"])
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    **r,
                    "seeds": " ".join(map(str, r["seeds"])),
                    "failed": "; ".join(r.get("failed", [])),
                    "run_dirs": " ".join(r["run_dirs"]),
                }
            )
    (root / "comparison.json").write_text(json.dumps(rows, indent=2))
    (root / "comparison.md").write_text(markdown_table(rows))


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| algorithm | accuracy (%) | loss | perplexity | Imp. (%) | worst 10 % | worst 20 % | "
        "client std | rounds to target | wall (s) | sent (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = _pct(r["mean_accuracy"])
        if r["mean_accuracy"] is not None and len(r["seeds"]) > 1:
            acc += f" ± {100 * r['std_accuracy']:.1f}"
        imp = "-" if r["improved_vs_local"] is None else f"{r['improved_vs_local']:.0f}"
        reach = "-" if r["rounds_to_target"] is None else f"{r['rounds_to_target']:.0f}"
        loss = "-" if r["mean_loss"] is None else f"{r['mean_loss']:.3f}"
        if not r["seeds"]:
            acc = "failed"
        wall = "-" if r["wall_seconds"] is None else f"{r['wall_seconds']:.1f}"
        lines.append(
            f"| {r['algorithm']} | {acc} | {loss} | {_sig3(r.get('mean_perplexity'))} | {imp} | "
            f"{_pct(r['worst10_accuracy'])} | "
            f"{_pct(r['worst20_accuracy'])} | {_pct(r['client_std_accuracy'])} | {reach} | "
            f"{wall} | {_sig3(r.get('megabytes_sent'))} |"
        )
    notes = [f"- {r['algorithm']} failed: {note}" for r in rows for note in r.get("failed", [])]
    if notes:
        lines += ["", "Runs left out of the numbers (continue them with --resume):", *notes]
    return "\n".join(lines) + "\n"


def _sig3(v: float | None) -> str:
    """Three significant digits, or - (megabytes, perplexity)."""
    return "-" if v is None else f"{v:.3g}"


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
        path = r.run_dir / "collaboration_rounds.npz"
        if path.exists():
            with np.load(path) as z:
                have = {int(k.split("_")[1]): z[k] for k in z.files}
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
    head = [c for c in TABLE_COLUMNS if c != "seeds"]
    table = ["<table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in head) + "</tr>"]
    for r in rows:
        cells = []
        for c in head:
            v = r[c]
            if isinstance(v, float) and c.endswith("accuracy"):
                v = f"{100 * v:.2f}"
            elif isinstance(v, float):
                v = f"{v:.4g}"
            cells.append(f"<td>{esc('-' if v is None else str(v))}</td>")
        table.append("<tr>" + "".join(cells) + "</tr>")
    table.append("</table>")
    imgs = "".join(
        f'<figure><img src="plots/{esc(p.name)}" alt="{esc(p.stem)}"><figcaption>{esc(p.stem)}'
        "</figcaption></figure>"
        for p in plot_files
    )
    configs = "".join(
        f"<details><summary>{esc(e)} (seed {s})</summary><pre>{esc(c.to_yaml())}</pre></details>"
        for (e, s), c in cfgs.items()
    )
    failures = "".join(
        f"<p>{esc(r['algorithm'])} failed: {esc(note)}</p>"
        for r in rows
        for note in r.get("failed", [])
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
<h2>Results</h2>{"".join(table)}{failures}
<h2>Plots</h2>{imgs}
<h2>Resolved configs</h2>{configs}
</body></html>
"""
    path = root / "report.html"
    path.write_text(page)
    return path


# -- what the command line shows and tracks ------------------------------------------------


def results_table(rows: list[dict[str, Any]]):
    """The comparison as a rich table for the terminal (accuracy ± std over seeds, loss,
    share of clients improved over Local, wall time; bytes and perplexity when present)."""
    from rich.table import Table

    t = Table(title="results (final round, mean over clients and seeds)")
    sent = any(r.get("megabytes_sent") is not None for r in rows)
    ppl = any(r.get("mean_perplexity") is not None for r in rows)
    cols = ["algorithm", "accuracy (%)", "loss", "Imp. vs local (%)", "wall (s)"]
    for col in cols + (["sent (MB)"] if sent else []) + (["perplexity"] if ppl else []):
        t.add_column(col, justify="right" if col != "algorithm" else "left")
    for r in rows:
        acc = "-" if r["mean_accuracy"] is None else f"{100 * r['mean_accuracy']:.2f}"
        if not r["seeds"]:
            acc = "failed:"
        if r["mean_accuracy"] is not None and len(r.get("seeds", [])) > 1:
            acc += f" ± {100 * r['std_accuracy']:.2f}"
        if r.get("failed"):
            acc += f" (failed: {'; '.join(r['failed'])})" if r["seeds"] else " ".join(r["failed"])
        imp = "-" if r["improved_vs_local"] is None else f"{r['improved_vs_local']:.0f}"
        cells = [r["algorithm"], acc, _fmt(r["mean_loss"], ".4f"), imp]
        cells.append(_fmt(r["wall_seconds"], ".1f"))
        if sent:
            cells.append(_fmt(r.get("megabytes_sent"), ".3g"))
        if ppl:
            cells.append(_fmt(r.get("mean_perplexity"), ".2f"))
        t.add_row(*cells)
    return t


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


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
    parent = None
    cbs: Callable[[str], list[Callback]] = lambda a: []  # noqa: E731
    if track and cfg.tracking.enabled:
        from raycobo.tracking import MLflowTracker

        parent = MLflowTracker(cfg.tracking, run_name=f"{cfg.name}-compare")

        def cbs(a: str) -> list[Callback]:
            return [MLflowTracker(cfg.tracking, run_name=f"{cfg.name}-{a}", parent=parent)]

    if parallel and cfg.tracking.enabled:
        # runs in other processes must find the same sqlite store and artifact folder
        from raycobo.tracking.mlflow_tracker import resolve_uri

        art = cfg.tracking.artifact_root
        cfg = with_overrides(
            cfg,
            {
                "tracking.uri": resolve_uri(cfg.tracking.uri),
                "tracking.artifact_root": art if "://" in art else str(Path(art).resolve()),
            },
        )
    return run_compare(
        cfg, entries, out, cbs, make_progress, parent, seeds, parallel, resume=resume
    )
