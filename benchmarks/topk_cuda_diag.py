"""Where Top-K with error feedback parts ways between two devices (issue: CUDA != CPU).

Runs the GPU test's setting (digits, 4 clients, full participation) for a few rounds on
two devices, records every call of the Top-K selection (its input V and the entries it
kept) and prints, round by round:

- how far the inputs V already differ (max |V_a - V_b|),
- which coordinates one device kept and the other did not, with their |V| on each device
  and the k-th largest |V| (the threshold), and whether they are exact ties on a device,
- whether device a's selection rule, applied to device b's V, picks device b's entries
  (if so, the selection is consistent and only the inputs differ).

Usage: python benchmarks/topk_cuda_diag.py [--a cpu] [--b cuda] [--rounds 4] [--threads 2]
(``--b cpu --threads-b 1`` runs it without a GPU: one thread count against another).
"""

from __future__ import annotations

import argparse

import torch

from raycobo.algorithms import common, topk_ef
from raycobo.config import load_config, with_overrides
from tests.helpers import DIGITS, run_local

BASE = [*DIGITS, "algorithm.name=topk_ef"]  # the GPU test's setting


def record(device: str, rounds: int, threads: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    calls = []
    original = topk_ef.top_k

    def spy(V, k):
        out = original(V, k)
        calls.append((V.detach().cpu().clone(), (out != 0).cpu().clone(), k))
        return out

    torch.set_num_threads(threads)
    topk_ef.top_k = spy
    try:
        cfg = with_overrides(load_config(None, BASE), {"engine.device": device})
        X, _, _ = run_local(cfg, rounds)
    finally:
        topk_ef.top_k = original
    return calls, X.cpu()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", default="cpu")
    ap.add_argument("--b", default="cuda")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--threads-b", type=int, default=None)
    args = ap.parse_args()
    ca, Xa = record(args.a, args.rounds, args.threads)
    cb, Xb = record(args.b, args.rounds, args.threads_b or args.threads)
    print(
        f"{args.a} vs {args.b}: {len(ca)} Top-K calls; final models differ in "
        f"{int((Xa != Xb).sum())} of {Xa.numel()} entries (max |diff| "
        f"{float((Xa - Xb).abs().max()):.3g})"
    )
    for t, ((Va, Sa, k), (Vb, Sb, _)) in enumerate(zip(ca, cb, strict=True)):
        dv = float((Va - Vb).abs().max())
        differ = (Sa != Sb).nonzero().tolist()
        consistent = torch.equal(common.top_k(Vb, k) != 0, Sb)
        print(
            f"round {t}: k={k} of d={Va.shape[1]}; max |V_a - V_b| = {dv:.3g}; "
            f"{len(differ)} selections differ; a's rule on b's V picks b's entries: "
            f"{consistent}"
        )
        for row in sorted({r for r, _ in differ}):
            ta = Va[row].abs().sort(descending=True).values[k - 1]
            tb = Vb[row].abs().sort(descending=True).values[k - 1]
            ties_a = int((Va[row].abs() == ta).sum())
            ties_b = int((Vb[row].abs() == tb).sum())
            print(
                f"  client {row}: threshold |V|_(k) a={ta:.9g} ({ties_a} entries equal to "
                f"it) b={tb:.9g} ({ties_b} equal)"
            )
            for _, j in [p for p in differ if p[0] == row][:8]:
                print(
                    f"    coord {j:5d}: kept a={bool(Sa[row, j])} b={bool(Sb[row, j])} "
                    f"|V_a|={float(Va[row, j].abs()):.9g} |V_b|={float(Vb[row, j].abs()):.9g}"
                )


if __name__ == "__main__":
    main()
