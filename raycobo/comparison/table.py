"""The comparison table: one row per entry over its seeds, one column spec rendered as
CSV/JSON, markdown, HTML and a terminal table.

Columns (``TABLE_COLUMNS``, the CSV's and JSON's keys): mean accuracy +- std over seeds,
loss, perplexity, Imp.(%) (share of clients beating Local, seed for seed; CoBo Table 2),
the fairness numbers of L2C's Table 3 (mean accuracy of the worst 10 % / 20 % of clients,
std across clients), the rounds to reach ``compare.target_accuracy``, wall time and
megabytes sent.
"""

from __future__ import annotations

import csv
import html
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raycobo.lifecycle import Result

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


# -- rows ----------------------------------------------------------------------------------


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
    sums = [r.summary for r in runs if finished(r)]
    row: dict[str, Any] = {**dict.fromkeys(TABLE_COLUMNS), "algorithm": entry, "seeds": []}
    row.update(failed=failed, run_dirs=[str(r.run_dir) for r in runs])
    if not sums:
        return row
    accs = [s["mean_accuracy"] for s in sums]
    has_acc = all(a is not None for a in accs)
    local_by_seed = {r.summary["seed"]: r.summary for r in (local_runs or []) if finished(r)}
    compared = local_runs is not None and entry != "local"
    imps = [improved_share(s, local_by_seed.get(s["seed"])) for s in sums] if compared else []
    reach = [rounds_to_target(s["history"], target) for s in sums]
    row.update(
        seeds=[s["seed"] for s in sums],
        mean_loss=_mean([s["mean_loss"] for s in sums]),
        mean_perplexity=_mean([s.get("mean_perplexity") for s in sums]),
        improved_vs_local=_mean(imps),
        rounds_to_target=None if None in reach else float(np.mean(reach)),
        wall_seconds=float(np.mean([s["wall_seconds"] for s in sums])),
        megabytes_sent=_mean([s.get("megabytes_sent") for s in sums]),
    )
    if has_acc:
        clients = [[c["accuracy"] for c in s["clients"]] for s in sums]
        row.update(
            mean_accuracy=_mean(accs),
            std_accuracy=float(np.std(accs)),
            worst10_accuracy=_mean([worst_share(a, 0.1) for a in clients]),
            worst20_accuracy=_mean([worst_share(a, 0.2) for a in clients]),
            client_std_accuracy=_mean([float(np.std(a)) for a in clients]),
        )
    return row


# -- one column spec, three renderings --------------------------------------------------


def fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    """A number for a table cell; '-' where there is none (a failed run, no metric)."""
    return "-" if value is None else format(scale * value, spec)


def _accuracy(row: dict[str, Any], digits: int) -> str:
    """accuracy (%) with ± std over several seeds; 'failed' for an entry with no run left."""
    if not row["seeds"]:
        return "failed"
    text = fmt(row["mean_accuracy"], f".{digits}f", 100)
    if row["mean_accuracy"] is not None and len(row["seeds"]) > 1:
        text += f" ± {fmt(row['std_accuracy'], f'.{digits}f', 100)}"
    return text


@dataclass(frozen=True)
class Column:
    title: str
    cell: Callable[[dict[str, Any]], str]
    shown: Callable[[list[dict[str, Any]]], bool] = lambda rows: True  # noqa: E731


def _num(key: str, spec: str, scale: float = 1.0) -> Callable[[dict[str, Any]], str]:
    return lambda r: fmt(r.get(key), spec, scale)


def _present(key: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda rows: any(r.get(key) is not None for r in rows)


def _sent(r: dict[str, Any]) -> str:
    """Megabytes sent, in human units; a dash for nothing sent (Local), n/a for a
    method that does not count them (a plugin's)."""
    mb = r.get("megabytes_sent")
    if mb is None:
        return "n/a" if r["seeds"] else "-"
    if mb == 0:
        return "—"
    return f"{mb / 1000:.3g} GB" if mb >= 1000 else f"{mb:.3g} MB"


IMPROVED = "Imp. vs Local (%)"

# the markdown and HTML table (the columns some row has a value in)
FULL = [
    Column("algorithm", lambda r: r["algorithm"]),
    Column("accuracy (%)", lambda r: _accuracy(r, 1)),
    Column("loss", _num("mean_loss", ".3f"), _present("mean_loss")),
    Column("perplexity", _num("mean_perplexity", ".3g"), _present("mean_perplexity")),
    Column(IMPROVED, _num("improved_vs_local", ".0f"), _present("improved_vs_local")),
    Column("worst 10 % (%)", _num("worst10_accuracy", ".1f", 100), _present("worst10_accuracy")),
    Column("worst 20 % (%)", _num("worst20_accuracy", ".1f", 100), _present("worst20_accuracy")),
    Column(
        "client std (%)", _num("client_std_accuracy", ".1f", 100), _present("client_std_accuracy")
    ),
    Column("rounds to target", _num("rounds_to_target", ".0f"), _present("rounds_to_target")),
    Column("wall (s)", _num("wall_seconds", ".1f")),
    Column("sent", _sent, _present("megabytes_sent")),
]


def _terminal_accuracy(r: dict[str, Any]) -> str:
    text = _accuracy(r, 2)
    if r.get("failed"):
        notes = "; ".join(r["failed"])
        text = f"failed: {notes}" if not r["seeds"] else f"{text} (failed: {notes})"
    return text


# the terminal's short table (columns that have values only)
SHORT = [
    Column("algorithm", lambda r: r["algorithm"]),
    Column("accuracy (%)", _terminal_accuracy),
    Column("loss", _num("mean_loss", ".4f")),
    Column(IMPROVED, _num("improved_vs_local", ".0f")),
    Column("wall (s)", _num("wall_seconds", ".1f")),
    Column("sent", _sent, _present("megabytes_sent")),
    Column("perplexity", _num("mean_perplexity", ".2f"), _present("mean_perplexity")),
]


def _cells(columns: list[Column], rows: list[dict[str, Any]]):
    shown = [c for c in columns if c.shown(rows)]
    return [c.title for c in shown], [[c.cell(r) for c in shown] for r in rows]


def _failures(rows: list[dict[str, Any]]) -> list[str]:
    return [f"{r['algorithm']} failed: {note}" for r in rows for note in r.get("failed", [])]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    titles, body = _cells(FULL, rows)
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    notes = [f"- {n}" for n in _failures(rows)]
    if notes:
        lines += ["", "Runs left out of the numbers (continue them with --resume):", *notes]
    return "\n".join(lines) + "\n"


def html_table(rows: list[dict[str, Any]]) -> str:
    esc = html.escape
    titles, body = _cells(FULL, rows)
    out = ["<table><tr>" + "".join(f"<th>{esc(t)}</th>" for t in titles) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>" for cells in body]
    out.append("</table>")
    out += [f"<p>{esc(n)}</p>" for n in _failures(rows)]
    return "".join(out)


def terminal_table(rows: list[dict[str, Any]]):
    """The comparison as a rich table (columns with values only)."""
    from rich.table import Table

    t = Table(title="results (final round, mean over clients and seeds)")
    titles, body = _cells(SHORT, rows)
    for title in titles:
        t.add_column(title, justify="left" if title == "algorithm" else "right")
    for cells in body:
        t.add_row(*cells)
    return t


def write_tables(root: Path, rows: list[dict[str, Any]]) -> None:
    """comparison.csv (TABLE_COLUMNS + failed + run_dirs), .json and .md."""
    with (root / "comparison.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*TABLE_COLUMNS, "failed", "run_dirs"])
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    **{k: r.get(k) for k in TABLE_COLUMNS},
                    "seeds": " ".join(map(str, r["seeds"])),
                    "failed": "; ".join(r.get("failed", [])),
                    "run_dirs": " ".join(r["run_dirs"]),
                }
            )
    (root / "comparison.json").write_text(json.dumps(rows, indent=2))
    (root / "comparison.md").write_text(markdown_table(rows))
