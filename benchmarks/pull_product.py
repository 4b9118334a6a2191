"""Eq. (3)'s pull product W X at cross-device scale: the dense product against the
sparse one that ``cobo.add_weighted`` takes where at most a tenth of W's entries are
nonzero (rule raycobo: W^0 = 0 and the pull's threshold leave a row about its cluster's
clients), timed in the same process, interleaved.

Usage: python benchmarks/pull_product.py [--clients 400,1000] [--dim 51000]
       [--cluster 10] [--threads N] [--repeats 5]

Prints one line per n: milliseconds per Eq. (3) step (``penalized_rows``) with the dense
and the sparse product, their ratio, and the largest difference between the two results.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from raycobo.algorithms import cobo


def clustered_w(n: int, cluster: int, gen: torch.Generator) -> torch.Tensor:
    """W as the pull reads it late in a run: weights in [0.5, 1] inside clusters of
    ``cluster`` clients, 0 across, 1 on the diagonal."""
    cl = torch.arange(n) // cluster
    W = (cl[:, None] == cl[None, :]).float() * (0.5 + 0.5 * torch.rand(n, n, generator=gen))
    W = (W + W.T) / 2
    return W.fill_diagonal_(1.0)


def step_ms(X, G, W, share: float, repeats: int) -> tuple[float, torch.Tensor]:
    """Median milliseconds of one Eq. (3) step with SPARSE_PULL_SHARE = ``share``."""
    saved = cobo.SPARSE_PULL_SHARE
    cobo.SPARSE_PULL_SHARE = share
    try:
        out = cobo.penalized_rows(X, X, G, W, 0.1, 5.0)  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = cobo.penalized_rows(X, X, G, W, 0.1, 5.0)
            times.append(1000 * (time.perf_counter() - t0))
    finally:
        cobo.SPARSE_PULL_SHARE = saved
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", default="400,1000")
    ap.add_argument("--dim", type=int, default=51_000, help="parameters per model")
    ap.add_argument("--cluster", type=int, default=10, help="clients per cluster")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, d = {args.dim}")
    gen = torch.Generator().manual_seed(0)
    for n in (int(c) for c in args.clients.split(",")):
        X = torch.randn(n, args.dim, generator=gen)
        G = torch.randn(n, args.dim, generator=gen)
        W = clustered_w(n, args.cluster, gen)
        density = float((W != 0).float().mean())
        dense, a = step_ms(X, G, W, 0.0, args.repeats)
        sparse, b = step_ms(X, G, W, cobo.SPARSE_PULL_SHARE, args.repeats)
        print(
            f"n {n}: W {100 * density:.1f} % nonzero; dense {dense:.1f} ms, sparse "
            f"{sparse:.1f} ms per step ({dense / sparse:.1f}x); max |diff| "
            f"{float((a - b).abs().max()):.2e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
