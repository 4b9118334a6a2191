"""Pair scores without writing the gradients (#73): the MLP's per-sample factors against
the local engine's fused pass.

The local engine answers a pair's score at its midpoint by writing each end's gradient
(the mean over its k minibatches: one row of d floats per end, ``_mlp_loss_grad`` with
``means = k``) and then reducing the two rows to their inner product and norms. For an
MLP the rows need not be written: a layer's weight gradient is D^T A (D the derivatives
at its outputs, A its inputs, one row per sample, S = k B samples an end), so

    <g_i, g_j> = sum over layers of sum((D_i D_j^T) * (A_i A_j^T + 1))

(the + 1 is the bias), and the squared norms are the same with i = j. The scores then
come from S x S products of per-sample factors. At the default width (784-64-10, S = 64)
the first layer's three products cost 3 S^2 784 multiply-adds a pair against the weight
gradients' 2 S 784 64, so the factors trade a pass over the gradient rows for half as
much arithmetic again; they win only where a layer is wider than 1.5 S.

Both are timed in one process, interleaved, on the same pairs (forward, backward and the
scores' inner products and norms; no minibatch gathers), and their scores compared.
``--clients N``: whole CoBo rounds of the local engine instead (``raycobo bench
engine``'s workload, its defaults), each round run from the same state both ways.

Usage: python benchmarks/gram_scores.py [--pairs 20,80] [--hidden 64] [--batches 2]
       [--threads N] [--repeats 25] [--clients N]
"""

from __future__ import annotations

import argparse
import time

import torch

from raycobo.models import PairGrams, _mlp_loss_grad, mlp_layers

B = 32  # samples a minibatch


def written(lg, P, x, y, k: int, d: int):
    """The engine's way: each end's gradient written (2 rows a pair), then reduced."""
    G = torch.empty(2 * P.shape[0], d)
    lg(P, x, y, G, 2 * k, k)
    Gi, Gj = G[0::2], G[1::2]
    norms = torch.linalg.vector_norm(Gi, dim=1) * torch.linalg.vector_norm(Gj, dim=1)
    return torch.linalg.vecdot(Gi, Gj), norms


def factors(grams, P, x, y, k: int, d: int):
    """The scores from the per-sample factors (the engine's ``PairGrams``): no gradient
    row is written."""
    g = grams(P, x, y)
    return g[:, 0], g[:, 1].sqrt() * g[:, 2].sqrt()


def rounds(clients: int, hidden: int, batches: int, repeats: int) -> None:
    """Whole rounds, from the same state each way: the engine's choice against written
    gradients."""
    import copy
    import statistics

    from raycobo.algorithms import build_algorithm
    from raycobo.bench.common import started
    from raycobo.bench.engine import workload
    from raycobo.engine import make_local_ops

    extra = [f"model.hidden=[{hidden}]", f"algorithm.alignment_batches={batches}"]
    cfg, data = workload("mlp", clients, "local", B, extra)
    ops = make_local_ops(cfg, data)
    session = started(build_algorithm(cfg.algorithm, 10**6, 0), ops)
    chosen = ops.scores_by_grams
    for t in range(3):
        session.round(t)
    times: dict[str, list[float]] = {"written": [], "factors": []}
    for t in range(3, 3 + repeats):
        before = copy.deepcopy(session.state)
        for name in ("written", "factors"):
            session.state = copy.deepcopy(before)
            ops.scores_by_grams = chosen if name == "factors" else (lambda k: False)
            start = time.perf_counter()
            session.round(t)
            times[name].append(time.perf_counter() - start)
    w, f = (statistics.median(times[k]) for k in ("written", "factors"))
    print(
        f"{clients} clients, 784-{hidden}-10, {batches} minibatches of {B} an end "
        f"(factors chosen: {chosen(batches)}): written {1e3 * w:.1f} ms a round, "
        f"factors {1e3 * f:.1f} ms (x{f / w:.2f}, medians of {repeats} rounds)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="20,80")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batches", type=int, default=2, help="minibatches an end (k)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--clients", type=int, default=None, help="time whole rounds")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clients:
        return rounds(args.clients, args.hidden, args.batches, args.repeats)
    sizes = [784, args.hidden, 10]
    grams, lg, k = PairGrams(sizes), _mlp_loss_grad(sizes), args.batches
    d = mlp_layers(sizes)[-1][2]
    torch.manual_seed(0)
    print(f"MLP {sizes}, k = {k}, batch {B}, {torch.get_num_threads()} threads")
    for U in (int(p) for p in args.pairs.split(",")):
        P = torch.randn(U, d) * 0.05
        x = torch.randn(2 * k * U, B, 784)
        y = torch.randint(0, 10, (2 * k * U, B))
        (dot_w, nrm_w), (dot_f, nrm_f) = written(lg, P, x, y, k, d), factors(grams, P, x, y, k, d)
        cos_gap = (dot_w / nrm_w - dot_f / nrm_f).abs().max().item()
        times: dict[str, list[float]] = {"written": [], "factors": []}
        for _ in range(args.repeats):
            for name, fn in (("written", written), ("factors", factors)):
                t = time.perf_counter()
                fn(lg if name == "written" else grams, P, x, y, k, d)
                times[name].append(time.perf_counter() - t)
        w, f = min(times["written"]), min(times["factors"])
        print(
            f"{U} pairs: written {1e3 * w:.2f} ms, factors {1e3 * f:.2f} ms "
            f"(x{f / w:.2f}, best of {args.repeats}); largest cosine difference {cos_gap:.1e}"
        )


if __name__ == "__main__":
    main()
