"""Run the fidelity claims (``claims.yaml``): each claim's comparison over seeds, plus
the Ditto lambda sweep, then write FIDELITY.md (``report.py``).

Usage: python benchmarks/fidelity/run.py [--quick] [--only ID,...] [--out DIR]
       [--seeds 0,1,2] [--no-sweep] [--jobs N] [--ablation]

``--quick``: the claims marked ``quick`` with one seed (minutes on 2 cores). Finished
comparisons are kept: a second call resumes what is missing (``compare --resume``); a
claim's tuning (``tune``) is kept in its ``tuned.json`` and not swept again.
``--jobs N``: N claims at a time in separate processes, heaviest (``minutes``) first,
each with 1/N of the machine's cores (torch threads and its Ray instance's CPUs).
``--ablation``: also the claims marked ``ablation`` (CoBo's settings one at a time on
the cross-device twin; about as long again as the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import yaml

from raycobo.bench.workers import die_with_parent
from raycobo.comparison import run_compare
from raycobo.config import load_config, load_stored_config

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def load_claims() -> list[dict]:
    return yaml.safe_load((HERE / "claims.yaml").read_text())["claims"]


def claim_config(claim: dict, cpus: int | None = None):
    over = [*claim.get("overrides", []), "tracking.enabled=false"]
    if cpus is not None:  # the Ray instance of a tuning sweep takes this many CPUs
        over.append(f"engine.num_cpus={cpus}")
    return load_config(REPO / claim["config"], over)


def tuned_claim_config(claim: dict, root: Path, cpus: int | None = None):
    """The claim's config, its ``tune`` entries swept on validation data first (or their
    values taken from an earlier sweep's ``tuned.json``)."""
    from raycobo.api import tuned, with_tuned

    cfg = claim_config(claim, cpus)
    spaces = claim.get("tune")
    if not spaces:
        return cfg
    saved = root / "tuned.json"
    if saved.is_file():
        picked = json.loads(saved.read_text())
        if set(picked) == set(spaces):
            return with_tuned(cfg, picked)
    entries = list(cfg.compare.algorithms)
    return tuned(cfg, entries, {e: REPO / sp for e, sp in spaces.items()}, root)


def run_claim(claim: dict, out: Path, seeds: list[int], cpus: int | None = None) -> None:
    root = out / claim["id"]
    seeds = claim.get("seeds", seeds)  # a claim may fix its own (the ablations: fewer)
    resume = (root / "config.yaml").is_file()
    if resume:
        cfg = load_stored_config(root / "config.yaml")
    else:
        cfg = tuned_claim_config(claim, root, cpus)
    entries = list(cfg.compare.algorithms)
    t0 = time.perf_counter()
    print(f"[{claim['id']}] {', '.join(entries)}; seeds {seeds}", flush=True)
    _, rows, _ = run_compare(cfg, entries, root, seeds=seeds, resume=resume)
    for r in rows:
        acc = r["mean_accuracy"]
        shown = "-" if acc is None else f"{100 * acc:.2f}"
        print(f"    {r['algorithm']:22s} {shown}", flush=True)
    print(f"    {time.perf_counter() - t0:.0f} s", flush=True)


def run_sweep(out: Path, smoke: bool) -> None:
    """Ditto's lambda x step size on the quickstart (is Ditto below Local for all?)."""
    from raycobo.tune.space import load_sweep
    from raycobo.tune.sweep import run_sweep as sweep

    root = out / "ditto-sweep"
    if (root / "sweep_summary.json").is_file():
        return
    over = ["tracking.enabled=false"]
    spec, base = load_sweep(REPO / "tune_spaces" / "ditto_lambda.yaml", over)
    # a scan of every (lambda, lr) against Local's test accuracy, not a choice: each
    # trial is scored on the test split (the sweep marks it so)
    spec = spec.model_copy(update={"evaluate_on": "test"})
    print("[ditto-sweep] Ditto's lambda x lr on the quickstart", flush=True)
    sweep(spec, base, root, smoke_test=smoke)


def _job(claim: dict, out: Path, seeds: list[int], cpus: int) -> str:
    """One claim in a worker process with ``cpus`` cores' worth of threads."""
    import torch

    torch.set_num_threads(cpus)
    os.environ["OMP_NUM_THREADS"] = str(cpus)
    run_claim(claim, out, seeds, cpus)
    return claim["id"]


def run_claims(claims: list[dict], out: Path, seeds: list[int], jobs: int) -> list[str]:
    """Run ``claims``; -> the ids of those that failed (with --jobs: the rest go on)."""
    if jobs <= 1:
        for claim in claims:
            run_claim(claim, out, seeds)
        return []
    cpus = max(1, (os.cpu_count() or 1) // jobs)
    heaviest = sorted(claims, key=lambda c: -c.get("minutes", 5))
    # spawn: each worker imports torch afresh with its own thread count
    with ProcessPoolExecutor(
        jobs, mp_context=get_context("spawn"), initializer=die_with_parent
    ) as pool:
        futures = {pool.submit(_job, c, out, seeds, cpus): c["id"] for c in heaviest}
        failed = []
        for f, cid in futures.items():
            try:
                f.result()
                print(f"[{cid}] done", flush=True)
            except Exception as err:  # the other claims go on; the report shows what ran
                failed.append(cid)
                print(f"[{cid}] failed: {type(err).__name__}: {err}", flush=True)
    return failed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "fidelity")
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="claims run at a time")
    ap.add_argument("--ablation", action="store_true", help="also the claims marked ablation")
    args = ap.parse_args()
    claims = load_claims()
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {c["id"] for c in claims}
        if unknown:
            print(f"error: --only: no claim {sorted(unknown)[0]}", file=sys.stderr)
            return 2
        claims = [c for c in claims if c["id"] in wanted]
    elif args.quick:
        claims = [c for c in claims if c.get("quick")]
    elif not args.ablation:  # the ablations double the run: make fidelity-ablation
        claims = [c for c in claims if not c.get("ablation")]
    seeds = (
        [int(s) for s in args.seeds.split(",")]
        if args.seeds
        else ([0] if args.quick else [0, 1, 2])
    )
    out = args.out / ("quick" if args.quick else "full")
    failed = run_claims([c for c in claims if c.get("config")], out, seeds, args.jobs)
    if not args.no_sweep and not args.only:
        run_sweep(out, smoke=args.quick)
    from report import write_report

    path = write_report(out, REPO / ("FIDELITY.quick.md" if args.quick else "FIDELITY.md"))
    print(f"wrote {path}")
    if failed:
        print(f"error: claims that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
