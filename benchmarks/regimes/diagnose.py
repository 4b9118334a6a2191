"""Where CoBo's share of the Local -> Oracle gap goes on one cell of the regime matrix:
the defaults run again with their learned W replaced, after every W step, by

- ``true``: the true clusters' blocks (the pull's own ceiling: a W that is right from
  the first round, at the defaults' pull strength);
- ``no-cross``: the learned W with its cross-cluster entries set to 0 (no pair of two
  clusters is ever pulled; the pairs inside a cluster as learned);
- ``full-recall``: the learned W with every pair inside a cluster raised to 1 (every
  pair of a cluster pulled from the first W step; the cross-cluster pairs as learned);
- ``found``: the blocks of the groups the learned W ends with (the connected parts of
  its pulled pairs; the same seed run with ``learned`` first), from the first W step:
  beside ``true``, what CoBo's own grouping costs where it differs from the clusters
  (e.g. two clusters it joins), apart from the cost of learning W;

and, for each run, how many cross-cluster pairs the learned W put into the pull (at or
above ``pull_threshold``), on average over the W steps and at most (in the other modes:
what each W step put there before the replacement). If ``no-cross`` closes
the gap and ``full-recall`` does not, the pairs of different clusters that the pull read
during the run cost the difference; the other way round, the pairs of a cluster that
never reached the threshold or fell below it.

Usage: python benchmarks/regimes/diagnose.py --cell mnist1d-16 [--split test]
       [--seeds 0,1,2] [--modes learned,true,no-cross,full-recall] [--threads 1]
       [--out DIR]

Local and Oracle are read from ``OUT/<split>/results.jsonl`` (run.py's results) for the
same seeds, and run here where missing. The local engine in this process only: the
replacement wraps ``CoBo.apply_scores``, which commits every W step (dense W).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import runpy
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
# run.py's functions by path, not as a module named ``run`` (the fidelity suite has one)
regimes = SimpleNamespace(**runpy.run_path(str(HERE / "run.py")))

MODES = ("learned", "true", "no-cross", "full-recall", "found")


def true_blocks(clusters: list[int]):
    import torch

    c = torch.as_tensor(clusters)
    return (c[:, None] == c[None, :]).float()


def found_groups(W, cut: float) -> list[int]:
    """The groups W's pulled pairs (those the pull reads: ``weights.thresholded``) join,
    as connected parts: one id per client, numbered in order of their first client."""
    import torch
    from scipy.sparse.csgraph import connected_components  # scikit-learn's own dependency

    from raycobo.algorithms.cobo import weights

    pulled = weights.thresholded(torch.as_tensor(W), cut).ne(0)
    _, groups = connected_components(pulled.numpy(), directed=False)
    return groups.tolist()


def replaced(W, mode: str, blocks):
    """The W a mode keeps after a W step (``W``: the step's learned result; ``blocks``:
    the true clusters', or with ``found`` the found groups')."""
    import torch

    B = blocks.to(W.dtype)
    if mode in ("true", "found"):
        return B.clone()
    if mode == "no-cross":
        return W * B
    if mode == "full-recall":
        return torch.maximum(W, B)
    return W


@contextlib.contextmanager
def w_replaced(mode: str, clusters: list[int], groups: list[int] | None = None):
    """CoBo.apply_scores patched for the runs inside: the learned W's cross-cluster pairs
    at or above the pull's threshold counted, then W replaced as ``mode`` says (``found``:
    by the blocks of ``groups``). Yields the counts (one per W step); ValueError where no
    W step went through it (the diagnostic would measure nothing)."""
    import torch

    from raycobo.algorithms.cobo import CoBo, pull_weights

    across = ~true_blocks(clusters).bool()
    if mode == "found" and groups is None:
        raise ValueError("mode found needs the groups a learned run ended with")
    blocks = true_blocks(groups if mode == "found" else clusters)
    counts: list[int] = []
    original = CoBo.apply_scores

    def apply_scores(self, state, edges, scores, t):
        out = original(self, state, edges, scores, t)
        W = out.W
        if not isinstance(W, torch.Tensor) or W.layout != torch.strided:
            raise ValueError("diagnose.py needs a dense W (algorithm.weights: dense)")
        pulled = pull_weights(W, "sum", self.pull.threshold).gt(0)  # what Eq. (3) reads
        counts.append(int((pulled & across.to(W.device)).sum()) // 2)
        return out if mode == "learned" else dataclasses.replace(out, W=replaced(W, mode, blocks))

    CoBo.apply_scores = apply_scores
    try:
        yield counts
    finally:
        CoBo.apply_scores = original
    if not counts:
        raise ValueError("no W step went through CoBo.apply_scores: nothing was diagnosed")


def run_mode(
    cell: dict,
    split: str,
    seed: int,
    mode: str,
    threads: int,
    rounds: int | None = None,
    groups: list[int] | None = None,
) -> dict:
    """One run of the cell with CoBo's defaults and W replaced as ``mode`` says (``rounds``:
    fewer than the cell's, for a quick check; ``groups``: ``found``'s, from a learned
    run's ``groups``). The result's ``groups``: those its final W joins."""
    from raycobo import api
    from raycobo.algorithms.cobo.settings import PresetView, pull_cut

    cfg = regimes.cell_config(cell, split, seed)
    if (cfg.get("engine") or {}).get("kind", "local") != "local":
        raise ValueError(f"{cell['id']}: diagnose.py runs the local engine only")
    cfg["algorithm"] = {**(cfg.get("algorithm") or {}), "name": "cobo"}  # the cell's lr kept
    cfg["engine"] = {**(cfg.get("engine") or {}), "threads": threads}
    if rounds is not None:
        cfg["rounds"], cfg["eval_every"] = rounds, rounds
    clusters = clusters_of(cfg)
    with tempfile.TemporaryDirectory(prefix="diagnose-") as out:
        with w_replaced(mode, clusters, groups) as counts:
            W = api.run(cfg, out=Path(out) / "run", track=False).W
        summary = json.loads((Path(out) / "run" / "summary.json").read_text())
    cut = pull_cut(PresetView(api.load(cfg).algorithm)) or 0.0
    if [c.get("cluster") for c in summary["clients"]] != clusters:
        raise ValueError(f"{cell['id']}: the run's clusters are not its data's")
    return {
        "mode": mode,
        "seed": seed,
        "accuracy": summary.get("mean_accuracy"),
        "loss": summary.get("mean_loss"),
        "cross_pulled_mean": sum(counts) / len(counts),
        "cross_pulled_max": max(counts),
        "cross_pairs": sum(1 for a in clusters for b in clusters if a != b) // 2,
        "groups": found_groups(W, cut),
        **regimes.w_shares(summary),
    }


def clusters_of(cfg: dict) -> list[int]:
    """The clients' clusters, from the cell's data as the run loads it."""
    from raycobo import api
    from raycobo.data import load_data

    data = load_data(api.load(cfg))
    found = getattr(data, "clusters", None)
    if found is None:  # the quadratic problem: one cluster id per client
        found = data.cluster.tolist()
    if any(c is None for c in found):
        raise ValueError(f"{cfg['name']}: its clients have no clusters to compare W with")
    return [int(c) for c in found]


def baselines(cell: dict, split: str, seeds: list[int], out: Path) -> dict:
    """Local's and Oracle's score per seed: the matrix's last rows where they ran with
    today's settings, else run here (``run.plan_jobs`` decides, as for the matrix)."""
    rows = regimes.read_results(out / split / "results.jsonl")
    done = {(r["cell"], r["entry"], r["seed"], r["split"]): r.get("settings") for r in rows}
    entries = {"local": ("local", {}), "oracle": ("oracle", {})}
    rows += [regimes.run_one(j) for j in regimes.plan_jobs([cell], entries, seeds, split, done)]
    last = {
        (r["entry"], r["seed"]): r for r in rows if (r["cell"], r["split"]) == (cell["id"], split)
    }
    return {(entry, seed): last[(entry, seed)][metric(cell)] for entry in entries for seed in seeds}


def metric(cell: dict) -> str:
    return cell.get("metric", "accuracy")


def table(results: list[dict], base: dict, seeds: list[int], key: str) -> str:
    """Markdown: per mode the mean score, the share of the gap closed (of the means) and
    the cross-cluster pairs the learned W put into the pull."""
    local = sum(base[("local", s)] for s in seeds) / len(seeds)
    oracle = sum(base[("oracle", s)] for s in seeds) / len(seeds)
    shown = (lambda v: f"{100 * v:.1f} %") if key == "accuracy" else (lambda v: f"{v:.4g}")
    lines = [
        f"Local {shown(local)}, Oracle {shown(oracle)} ({key}, means over seeds "
        f"{','.join(map(str, seeds))})",
        "",
        f"| W after each step | {key} | gap closed | cross-cluster pairs pulled "
        "(mean over W steps / most) |",
        "|---|---|---|---|",
    ]
    for mode in dict.fromkeys(r["mode"] for r in results):
        rs = [r for r in results if r["mode"] == mode]
        score = sum(r[key] for r in rs) / len(rs)
        gap = (score - local) / (oracle - local) if oracle != local else math.nan
        mean = sum(r["cross_pulled_mean"] for r in rs) / len(rs)
        most = max(r["cross_pulled_max"] for r in rs)
        lines.append(
            f"| {mode} | {shown(score)} | {100 * gap:.0f} % | {mean:.1f} / {most} "
            f"of {rs[0]['cross_pairs']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", required=True)
    ap.add_argument("--split", choices=["test", "validation"], default="test")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    cells = {c["id"]: c for c in regimes.load_cells()}
    if args.cell not in cells:
        ap.error(f"--cell: no cell {args.cell!r} in cells.yaml")
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"--modes: unknown {', '.join(unknown)} (known: {', '.join(MODES)})")
    cell, seeds = cells[args.cell], [int(s) for s in args.seeds.split(",")]
    import torch

    torch.set_num_threads(args.threads)
    base = baselines(cell, args.split, seeds, args.out)
    results, learned = [], {}
    for mode in sorted(modes, key=lambda m: m == "found"):  # found reads learned's groups
        for seed in seeds:
            if mode == "found" and seed not in learned:
                learned[seed] = run_mode(cell, args.split, seed, "learned", args.threads)
            groups = learned[seed]["groups"] if mode == "found" else None
            r = run_mode(cell, args.split, seed, mode, args.threads, groups=groups)
            if mode == "learned":
                learned[seed] = r
            print(json.dumps(r), flush=True)
            results.append(r)
    print(f"\n{args.cell}, {args.split} split, CoBo with its defaults:\n")
    print(table(results, base, seeds, metric(cell)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
