"""A comparison whose runs execute side by side as separate processes, without Ray.

``raycobo compare --parallel`` spreads runs over a Ray instance; where Ray is not
installed (a borrowed GPU machine, say), this starts one ``raycobo run`` process per
(entry, seed) at once, each into the folder that ``raycobo compare`` would give it, and
then lets ``raycobo compare --resume`` read the finished runs back and write the table,
the CSV and the plots. A run still going after ``--timeout`` seconds is interrupted
(SIGTERM: it checkpoints and ends ``interrupted``; SIGINT would be lost on a run started
from a background job, which inherits SIGINT ignored) and the table is not written;
continue it with ``raycobo compare --resume OUT``. A run that still has not ended a
minute later is killed.

Usage: python benchmarks/fidelity/parallel_compare.py CONFIG --out DIR [--timeout S]
       [key=value ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from raycobo.comparison import entry_config
from raycobo.config import load_config, with_overrides


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=3600.0)
    args = ap.parse_intermixed_args()
    cfg = load_config(args.config, args.overrides)
    entries = list(cfg.compare.algorithms)
    seeds = cfg.compare.seeds or [cfg.seed]
    root = args.out
    root.mkdir(parents=True, exist_ok=True)
    stored = with_overrides(cfg, {"compare.algorithms": entries, "compare.seeds": seeds})
    (root / "config.yaml").write_text(stored.to_yaml())
    procs = {}
    # the machine's cores shared out: oversubscribed torch threads slow every run down
    threads = max(1, (os.cpu_count() or 1) // (len(entries) * len(seeds)))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    for e in entries:
        for s in seeds:
            d = root / e / f"seed{s}" if len(seeds) > 1 else root / e
            d.parent.mkdir(parents=True, exist_ok=True)
            spec = d.parent / f"{d.name}.yaml"
            spec.write_text(entry_config(cfg, e, s).to_yaml())
            log = open(d.parent / f"{d.name}.log", "w")  # noqa: SIM115 - closed at exit
            cmd = [sys.executable, "-m", "raycobo", "run", str(spec), "--out", str(d), "--quiet"]
            procs[(e, s)] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    print(f"{len(procs)} runs started into {root}, {threads} threads each", flush=True)
    deadline = time.monotonic() + args.timeout
    t0 = time.monotonic()
    while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
        time.sleep(1)
    late = [k for k, p in procs.items() if p.poll() is None]
    for k in late:
        procs[k].send_signal(signal.SIGTERM)
    for k, p in procs.items():
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:  # never leave a run behind this script
            print(f"  {k[0]} seed {k[1]}: no end 60 s after SIGTERM; killed", flush=True)
            p.kill()
            p.wait()
    for (e, s), p in procs.items():
        print(f"  {e} seed {s}: exit {p.returncode}", flush=True)
    print(f"all runs ended after {time.monotonic() - t0:.0f} s", flush=True)
    if late or any(p.returncode for p in procs.values()):
        print(f"not all runs completed; continue with: raycobo compare --resume {root}")
        return 1
    done = subprocess.run([sys.executable, "-m", "raycobo", "compare", "--resume", str(root)])
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
