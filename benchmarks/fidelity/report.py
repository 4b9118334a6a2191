"""FIDELITY.md from the fidelity runs (``run.py``): per claim, the paper's numbers or
orderings beside ours (mean ± std over seeds), ✓ / ✗ per ordering, and for a ✗ what was
measured about it (``explanations`` in claims.yaml, the Ditto sweep, stored GPU runs).
Nothing in the tables is typed by hand: every number is read from a run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
LOWER_IS_BETTER = {"perplexity"}
UNDECIDED = "undecided"  # an ordering inside the seeds' noise: neither holds nor fails


def load_rows(root: Path) -> dict[str, dict[str, Any]]:
    path = root / "comparison.json"
    if not path.is_file():
        return {}
    return {r["algorithm"]: r for r in json.loads(path.read_text())}


def run_dirs(row: dict[str, Any], root: Path) -> list[Path]:
    """The entry's run directories; a comparison copied from another machine (the GPU
    runs) keeps them beside its comparison.json, under the entry's name."""
    out = []
    for d in row.get("run_dirs", []):
        p = Path(d)
        if not p.is_dir():  # <root>/<entry>, or <root>/<entry>/seed<k> with several seeds
            p = root / p.parent.name / p.name if p.name.startswith("seed") else root / p.name
        out.append(p)
    return out


def per_seed(row: dict[str, Any], key: str, root: Path) -> list[float]:
    """One value per seed from the entry's run directories (summary.json)."""
    out = []
    for d in run_dirs(row, root):
        s = json.loads((d / "summary.json").read_text())
        v = s.get(key)
        if v is not None:
            out.append(float(v))
    return out


def stat(row: dict[str, Any] | None, metric: str, root: Path) -> tuple[float, float] | None:
    """(mean, std over seeds) in the metric's display unit (accuracy in %)."""
    if row is None:
        return None
    if metric == "accuracy":
        if row.get("mean_accuracy") is None:
            return None
        return 100 * row["mean_accuracy"], 100 * (row.get("std_accuracy") or 0.0)
    if metric == "worst10":
        v = per_seed(row, "worst10_accuracy", root) or (
            [row["worst10_accuracy"]] if row.get("worst10_accuracy") is not None else []
        )
        return (100 * float(np.mean(v)), 100 * float(np.std(v))) if v else None
    if metric == "perplexity":
        v = per_seed(row, "mean_perplexity", root) or [row.get("mean_perplexity")]
        v = [x for x in v if x is not None]
        return (float(np.mean(v)), float(np.std(v))) if v else None
    if metric == "megabytes":
        v = row.get("megabytes_sent")
        return (float(v), 0.0) if v is not None else None
    raise ValueError(metric)


def holds(text: str, rows: dict, metric: str, root: Path) -> tuple[bool | None, str]:
    """Evaluate "a > b", "a >= b" or "a < b" on the metric; None when a side is missing."""
    for op in (">=", ">", "<"):
        if f" {op} " in text:
            a, b = (s.strip() for s in text.split(f" {op} "))
            break
    else:
        raise ValueError(f"ordering '{text}': use a > b, a >= b or a < b")
    sa, sb = stat(rows.get(a), metric, root), stat(rows.get(b), metric, root)
    if sa is None or sb is None:
        return None, "no result"
    (ma, da), (mb, db) = sa, sb
    shown = f"{fmt((ma, 0), 1)} vs {fmt((mb, 0), 1)}"
    if op == "<":  # raw comparison (bytes)
        return ma < mb, shown
    noise = max(da, db)
    lead = (mb - ma) if metric in LOWER_IS_BETTER else (ma - mb)  # > 0: a is better
    if op == ">":  # decided only outside one standard deviation over seeds
        if abs(lead) <= noise and noise > 0:
            return UNDECIDED, f"{shown} (within one std, {noise:.2f})"
        return lead > 0, shown + (f" (std {noise:.2f})" if noise > 0 else "")
    return lead > 0 or -lead <= noise, f"{shown} (std {noise:.2f})"


def regime_check(claim: dict, rows: dict, metric: str, root: Path):
    """The twin's regime, so that orderings are read where collaboration matters. Either
    a gap: ``regime.high`` (the Oracle) above ``regime.low`` (Local) by at least half the
    paper's gap between ``paper_high`` (default: ``high``; the paper's best method where
    it has no Oracle) and ``low``; or ``match``: our ``low`` within that many points of
    the paper's (a setting without clusters, hence without an Oracle).
    -> (table row, ok) or None"""
    reg = claim.get("regime")
    if not reg:
        return None
    paper = claim.get("paper", {})
    low = reg["low"]
    b = stat(rows.get(low), metric, root)
    if "match" in reg:
        label = f"regime: {low} within {reg['match']:g} points of the paper's {paper[low]:.2f}"
        if b is None:
            return f"| {label} | ? | no result |", None
        ok = abs(b[0] - paper[low]) <= reg["match"]
        return f"| {label} | {'✓' if ok else '✗'} | {b[0]:.2f} |", ok
    high, paper_high = reg["high"], reg.get("paper_high", reg["high"])
    paper_gap = paper[paper_high] - paper[low]
    need = 0.5 * paper_gap
    label = f"regime: {high} − {low} ≥ {need:.2f} (half the paper's {paper_high} − {low})"
    a = stat(rows.get(high), metric, root)
    if a is None or b is None:
        return f"| {label} | ? | no result |", None
    gap = a[0] - b[0]
    ok = gap >= need
    detail = f"{gap:.2f} points (paper {paper_gap:.2f}; our {low} at {b[0]:.2f})"
    return f"| {label} | {'✓' if ok else '✗'} | {detail} |", ok


def closure_check(claim: dict, rows: dict, metric: str, root: Path):
    """``closure: {method, low, high, target}``: the share of the ``low`` -> ``high`` gap
    (Local -> Oracle) that ``method`` closes, ours against the paper's; fails under
    ``target`` %. -> (table row, ok) or None"""
    c = claim.get("closure")
    if not c:
        return None
    method, low, high = c["method"], c["low"], c["high"]
    label = f"{method} closes ≥ {c['target']:g} % of {low} → {high}"
    m, lo, hi = (stat(rows.get(k), metric, root) for k in (method, low, high))
    if m is None or lo is None or hi is None or hi[0] == lo[0]:
        return f"| {label} | ? | no result |", None
    ours = 100 * (m[0] - lo[0]) / (hi[0] - lo[0])
    paper = claim.get("paper", {})
    shown = f"{ours:.0f} %"
    if all(k in paper for k in (method, low, high)):
        theirs = 100 * (paper[method] - paper[low]) / (paper[high] - paper[low])
        shown += f" (paper {theirs:.0f} %)"
    ok = ours >= c["target"]
    return f"| {label} | {'✓' if ok else '✗'} | {shown} |", ok


APART = 0.5  # W within − across at which the true clusters count as told apart


def w_histories(root: Path, entry: str) -> list[tuple[int, list[dict]]] | None:
    """(seed, the evaluations that measured W within and across the true clusters) for
    each of ``entry``'s runs; None when the comparison has no such entry."""
    rows = load_rows(root)
    if entry not in rows:
        return None
    out = []
    for d in run_dirs(rows[entry], root):
        s = json.loads((d / "summary.json").read_text())
        hist = [
            h
            for h in s.get("history", [])
            if h.get("w_within") is not None and h.get("w_across") is not None
        ]
        out.append((s.get("seed"), hist))
    return out


def w_kept(root: Path, share: float, entry: str = "cobo"):
    """W within the true clusters at the last evaluation against its peak once the blocks
    exist (within − across ≥ APART; W⁰ = 1 is no learned peak), every seed: blocks that
    stay (≥ ``share`` of the peak) or fade. -> (table row, ok) or None"""
    kept = []
    for _, hist in w_histories(root, entry) or []:
        blocks = [h["w_within"] for h in hist if h["w_within"] - h["w_across"] >= APART]
        if hist:
            kept.append((hist[-1]["w_within"], max(blocks) if blocks else None))
    if not kept:
        return None
    ok = all(peak is not None and last >= share * peak for last, peak in kept)
    shown = "; ".join(
        f"{last:.2f} of peak {peak:.2f} ({last / peak:.2f})"
        if peak is not None
        else f"{last:.2f}, no blocks"
        for last, peak in kept
    )
    label = f"{entry}'s W within clusters at the end ≥ {share:g} × its peak"
    return f"| {label} | {'✓' if ok else '✗'} | {shown} |", ok


def tuned_line(root: Path) -> str | None:
    """The values the comparison's tuned entries were run with (``tuned.json``)."""
    path = root / "tuned.json"
    if not path.is_file():
        return None
    picked = json.loads(path.read_text())
    shown = "; ".join(
        f"{entry}: "
        + ", ".join(
            f"`{k}` = {v:g}" if isinstance(v, float) else f"`{k}` = {v}" for k, v in values.items()
        )
        for entry, values in picked.items()
    )
    return (
        f"Tuned on validation data first (`compare --tune`; 20 % of each client's training "
        f"samples, test split unseen), then run with: {shown}."
    )


def fmt(s: tuple[float, float] | None, seeds: int) -> str:
    if s is None:
        return "-"
    m, d = s
    spec = ".3g" if abs(m) >= 1e4 else ".2f"
    return f"{m:{spec}} ± {d:{spec}}" if seeds > 1 else f"{m:{spec}}"


def w_blocks(root: Path, entry: str = "cobo") -> str | None:
    """Figure 3: W's mean weight within and across the true clusters (final), and the
    first evaluated round at which they are APART (every seed)."""
    parts = []
    for seed, hist in w_histories(root, entry) or []:
        if not hist:
            return None
        sep = next((h["round"] for h in hist if h["w_within"] - h["w_across"] >= APART), None)
        last = hist[-1]
        where = f"round {sep}" if sep is not None else "not within the run"
        parts.append(
            f"seed {seed}: within {last['w_within']:.2f}, across {last['w_across']:.2f}, "
            f"apart by {APART} at {where}"
        )
    return "; ".join(parts) or None


def catalan_row(root: Path) -> str | None:
    """Figure 4: CoBo's W row of the first client (Catalan) over the saved rounds."""
    npz = root / "cobo" / "collaboration_rounds.npz"
    if not npz.is_file():
        return None
    z = np.load(npz)
    keys = sorted(z.files, key=lambda k: int("".join(c for c in k if c.isdigit()) or 0))
    rows = np.stack([z[k][0] for k in keys])  # (rounds, n)
    names = ["ca", "es", "de", "nl"]
    early = rows[: max(1, len(rows) // 3)].mean(axis=0)
    fav = names[int(np.argmax(early[1:])) + 1]
    seq = ", ".join(
        f"{k.split('_')[-1]}: " + " ".join(f"{v:.2f}" for v in z[k][0][1:]) for k in keys[::5]
    )
    return (
        f"Catalan's row (es de nl) at saved rounds: {seq}. Over the first third of the run "
        f"it favours '{fav}' (the paper: Spanish)."
    )


def ditto_sweep(out: Path, rows: dict) -> str | None:
    path = out / "ditto-sweep" / "sweep_summary.json"
    if not path.is_file():
        return None
    s = json.loads(path.read_text())
    done = [
        t
        for t in s["trials"]
        if t["status"] == "completed" and t["metrics"].get("mean_accuracy") is not None
    ]
    if not done:
        return None
    failed = [t["config"] for t in s["trials"] if t["status"] != "completed"]
    lines = ["| λ | η | Ditto accuracy (%) |", "|---|---|---|"]
    for t in sorted(
        done, key=lambda t: (t["config"]["algorithm.lam"], t["config"]["algorithm.lr"])
    ):
        acc = 100 * t["metrics"]["mean_accuracy"]
        lines.append(
            f"| {t['config']['algorithm.lam']} | {t['config']['algorithm.lr']} | {acc:.2f} |"
        )
    best = max(done, key=lambda t: t["metrics"]["mean_accuracy"])
    root = out / "quickstart-twin"
    local = per_seed(rows["local"], "mean_accuracy", root) if "local" in rows else []
    verdict = ""
    if local:  # the sweep's trials run seed 0: compare with Local's seed-0 run
        b, lo = 100 * best["metrics"]["mean_accuracy"], 100 * local[0]
        side = "above" if b > lo else "below"
        verdict = (
            f" The best Ditto ({b:.2f} %, λ = {best['config']['algorithm.lam']}, η = "
            f"{best['config']['algorithm.lr']}) is {side} Local ({lo:.2f} %, the same seed "
            "in the quickstart claim)."
        )
    if failed:
        shown = ", ".join(f"λ = {c['algorithm.lam']}, η = {c['algorithm.lr']}" for c in failed)
        verdict += f" Trials that did not finish (diverged): {shown}."
    return (
        f"Ditto's λ and step size, swept with `raycobo sweep tune_spaces/ditto_lambda.yaml` "
        f"(quickstart setting, seed 0, {len(done)} finished trials):{verdict}\n\n"
        + "\n".join(lines)
    )


def claim_section(claim: dict, out: Path) -> list[str]:
    root = HERE.parents[1] / claim["results"] if claim.get("results") else out / claim["id"]
    rows = load_rows(root)
    for other in claim.get("rows_from", []):  # another claim's entries, read beside ours
        theirs = load_rows(out / other["claim"])
        for entry in other["entries"]:
            if entry in theirs and rows:
                rows.setdefault(entry, theirs[entry])
    metric = claim.get("metric", "accuracy")
    head = [
        f"### {claim['id']}",
        "",
        f"{claim['source']}. Config: `{claim.get('config') or claim.get('results')}`",
    ]
    if claim.get("overrides"):
        head[-1] += " with " + " ".join(f"`{o}`" for o in claim["overrides"])
    if claim.get("note"):
        head += ["", claim["note"].strip()]
    tuned = tuned_line(root)
    if tuned:
        head += ["", tuned]
    if not rows:
        return [*head, "", "Not run yet.", ""]
    seeds = max(len(r.get("seeds", [])) for r in rows.values())
    unit = "%" if metric == "accuracy" else metric
    lines = [
        *head + [""],
        f"| entry | paper ({unit}) | ours ({unit}, {seeds} seed{'s' if seeds > 1 else ''}) |",
        "|---|---|---|",
    ]
    paper = claim.get("paper", {})
    for name, row in rows.items():
        p = paper.get(name)
        lines.append(
            f"| {name} | {p if p is not None else '-'} | {fmt(stat(row, metric, root), seeds)} |"
        )
    checks = [(o, metric) for o in claim.get("orderings", [])]
    checks += [(o, "worst10") for o in claim.get("worst10_orderings", [])]
    checks += [(o, "megabytes") for o in claim.get("bytes_orderings", [])]
    explain = claim.get("explanations", {})
    lines += ["", "| ordering | holds | ours |", "|---|---|---|"]
    failed = []
    for text, m in checks:
        ok, detail = holds(text, rows, m, root)
        label = text if m in (metric,) else f"{text} ({m})"
        mark = "≈" if ok == UNDECIDED else ("✓" if ok else ("?" if ok is None else "✗"))
        lines.append(f"| {label} | {mark} | {detail} |")
        if ok is False:
            failed.append(label)
    extra = [
        ("regime", regime_check(claim, rows, metric, root)),
        ("closure", closure_check(claim, rows, metric, root)),
        ("w_kept", w_kept(root, claim["w_kept"]) if claim.get("w_kept") else None),
    ]
    for key, found in extra:
        if found is not None:
            lines.append(found[0])
            if found[1] is False:
                failed.append(key)
    if claim.get("w_blocks"):
        found = w_blocks(root)
        if found:
            lines += ["", f"Figure 3 (W against the true clusters, CoBo): {found}."]
    if claim.get("catalan_row"):
        found = catalan_row(root)
        if found:
            lines += ["", f"Figure 4: {found}"]
    notes: dict[str, list[str]] = {}
    for label in failed:  # orderings that share an explanation are listed together
        note = explain.get(label.split(" (")[0])
        notes.setdefault(note.strip() if note else "not explained yet.", []).append(label)
    for note, labels in notes.items():
        lines += ["", f"✗ {'; '.join(labels)}: {note}"]
    return [*lines, ""]


def _shown(out: Path) -> str:
    try:
        return str(out.resolve().relative_to(HERE.parents[1]))
    except ValueError:
        return str(out)


REGIMES_START = "<!-- regimes:start -->"


def write_report(out: Path, path: Path) -> Path:
    claims = yaml.safe_load((HERE / "claims.yaml").read_text())["claims"]
    body = [
        "# Fidelity: the papers' claims, reproduced at CPU scale",
        "",
        "Generated by `benchmarks/fidelity/report.py` from the runs of `make fidelity`",
        f"(`{_shown(out)}`); claims and orderings in `benchmarks/fidelity/claims.yaml`. Our",
        "settings are offline twins (Fashion-MNIST / digits, MLP or small CNN, hundreds of",
        "rounds) of the papers' GPU settings (CIFAR, ResNet-9, tens of thousands of",
        "iterations), so numbers differ; the orderings are what is compared. `a > b` is",
        "decided only when the means differ by more than the larger standard deviation over",
        "seeds (else ≈, within noise); `a >= b` holds when a trails b by at most that. Each",
        "claim's twin must sit in the paper's regime: its gap between Local and the Oracle",
        "(or the paper's best method) at least half the paper's gap, else the claim fails.",
        "",
    ]
    summary = []
    for claim in claims:
        sec = claim_section(claim, out)
        marks = "".join(
            ln.split("|")[2].strip()
            for ln in sec
            if ln.startswith("| ")
            and ln.split("|")[2].strip() in "✓✗?≈"
            and ln.split("|")[2].strip()
        )
        summary.append(
            f"| {claim['id']} | {marks.count('✓')} | {marks.count('≈')} | {marks.count('✗')} |"
        )
        body += sec
    sweep = ditto_sweep(out, load_rows(out / "quickstart-twin"))
    if sweep:
        body += ["## Ditto against Local", "", sweep, ""]
    table = [
        "| claim | holds | within noise | does not hold |",
        "|---|---|---|---|",
        *summary,
        "",
    ]
    intro = body.index("", 2) + 1  # the summary table goes after the opening paragraph
    text = "\n".join(body[:intro] + table + body[intro:])
    text = text if text.endswith("\n") else text + "\n"
    old = path.read_text() if path.is_file() else ""
    if REGIMES_START in old:  # the regime matrix's section (benchmarks/regimes) is kept
        text += "\n" + REGIMES_START + old.split(REGIMES_START, 1)[1]
    path.write_text(text)
    return path


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[1] / "runs" / "fidelity" / "full"
    print(write_report(out, HERE.parents[1] / "FIDELITY.md"))
