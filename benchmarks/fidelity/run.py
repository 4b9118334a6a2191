"""Run the fidelity claims (``claims.yaml``): each claim's comparison over seeds, plus
the Ditto lambda sweep, then write FIDELITY.md (``report.py``).

Usage: python benchmarks/fidelity/run.py [--quick] [--only ID,...] [--out DIR]
       [--seeds 0,1,2] [--no-sweep]

``--quick``: the claims marked ``quick`` with one seed (minutes on 2 cores). Finished
comparisons are kept: a second call resumes what is missing (``compare --resume``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from raycobo.comparison import run_compare
from raycobo.config import load_config, load_stored_config

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def load_claims() -> list[dict]:
    return yaml.safe_load((HERE / "claims.yaml").read_text())["claims"]


def claim_config(claim: dict):
    over = [*claim.get("overrides", []), "tracking.enabled=false"]
    return load_config(REPO / claim["config"], over)


def run_claim(claim: dict, out: Path, seeds: list[int]) -> None:
    root = out / claim["id"]
    resume = (root / "config.yaml").is_file()
    cfg = load_stored_config(root / "config.yaml") if resume else claim_config(claim)
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
    print("[ditto-sweep] Ditto's lambda x lr on the quickstart", flush=True)
    sweep(spec, base, root, smoke_test=smoke)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "fidelity")
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--no-sweep", action="store_true")
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
    seeds = (
        [int(s) for s in args.seeds.split(",")]
        if args.seeds
        else ([0] if args.quick else [0, 1, 2])
    )
    out = args.out / ("quick" if args.quick else "full")
    for claim in claims:
        if claim.get("config"):
            run_claim(claim, out, seeds)
    if not args.no_sweep and not args.only:
        run_sweep(out, smoke=args.quick)
    from report import write_report

    path = write_report(out, REPO / ("FIDELITY.quick.md" if args.quick else "FIDELITY.md"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
