"""CoBo's alignment gradients with each midpoint's requests sharing it (#36; the local
engine does this since: ``SharedPoints``, ``VectorizedOps`` with the MLP).

A CoBo round asks for 2k gradients at each sampled pair's midpoint z_ij (both ends, k =
``alignment_batches`` minibatches each) and one at every member's model. Engines without
``shares_points`` get every request's point in its own row (2k copies of each midpoint),
and the batched MLP then runs one GEMM of B samples per row, reading 2k copies of each
midpoint's weights. Here the same gradients are computed with the 2k requests of a
midpoint as one GEMM of 2kB samples on one copy of its weights (the weight gradients
still one bmm per request, into their own rows). Both variants are timed in the same
process, interleaved, on the MLP 784-64-10 at batch 32, and their gradients compared
bit for bit (the same request rows in the same order).

Usage: python benchmarks/shared_points.py [--clients 40] [--edges 22] [--batches 2]
       [--threads N] [--repeats 30]

Prints the median milliseconds of one round's gradient request (alignment rows and the
members' rows, minibatch gathers included) each way, their ratio, and whether the
gradients and losses are equal.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from raycobo.models import _mlp_forward, _mlp_loss_grad, mlp_layers

SIZES = [784, 64, 10]


def shared_loss_grad(P, x, y, G, R: int, sizes: list[int] = SIZES) -> torch.Tensor:
    """Mean cross-entropy and its gradient for R requests per point: P (U, d) points, x
    (U, R B, in) and y (U, R B) each point's R minibatches back to back, G (U R, d) the
    gradients written in place (point-major), -> losses (U R,)."""
    U, RB = x.shape[0], x.shape[1]
    B = RB // R
    spec = mlp_layers(sizes)
    acts, h = _mlp_forward(spec, P, x)
    logp = torch.log_softmax(h, dim=-1)
    loss = -logp.gather(-1, y[..., None]).squeeze(-1).view(U * R, B).mean(dim=1)
    delta = logp.exp_()
    delta.scatter_add_(-1, y[..., None], torch.full_like(delta[..., :1], -1.0))
    delta /= B
    for li in range(len(spec) - 1, -1, -1):
        w0, b0, end, a, b = spec[li]
        per = delta.view(U * R, B, b)
        out = G[:, w0:b0].view(U * R, b, a)
        torch.bmm(per.transpose(1, 2), acts[li].view(U * R, B, a), out=out)
        G[:, b0:end] = per.sum(dim=1)
        if li > 0:
            delta = torch.bmm(delta, P[:, w0:b0].view(U, b, a)) * (acts[li] > 0)
    return loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--edges", type=int, default=22, help="sampled pairs in the round")
    ap.add_argument("--batches", type=int, default=2, help="alignment_batches k")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n, E, k, B = args.clients, args.edges, args.batches, args.batch_size
    R, A = 2 * k, 2 * k * args.edges
    d = mlp_layers(SIZES)[-1][2]
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=gen) * 0.05
    data = torch.randn(4000, SIZES[0], generator=gen)
    labels = torch.randint(0, SIZES[-1], (4000,), generator=gen)
    i = torch.randint(0, n, (E,), generator=gen)
    j = (i + 1 + torch.randint(0, n - 1, (E,), generator=gen)) % n
    rows = torch.randint(0, 4000, (A + n, B), generator=gen)  # point-major request rows
    per_row = _mlp_loss_grad(SIZES)

    def midpoints() -> torch.Tensor:
        mid = torch.index_select(X, 0, i)
        return mid.add_(X.index_select(0, j)).mul_(0.5)

    def copied() -> tuple[torch.Tensor, torch.Tensor]:
        """As the engine does today: every request row its own copy of its point."""
        Z = X.new_empty(A + n, d)
        Z[:A].view(E, R, d).copy_(midpoints()[:, None, :].expand(E, R, d))
        Z[A:].copy_(X)
        xb = data.index_select(0, rows.flatten()).view(A + n, B, -1)
        G = torch.empty(A + n, d)
        return G, per_row(Z, xb, labels[rows], G)

    def shared() -> tuple[torch.Tensor, torch.Tensor]:
        """A midpoint's R requests as one GEMM of R B samples on one copy of it."""
        xb = data.index_select(0, rows.flatten())
        yb = labels[rows]
        G, L = torch.empty(A + n, d), torch.empty(A + n)
        x_align = xb[: A * B].view(E, R * B, -1)
        L[:A] = shared_loss_grad(midpoints(), x_align, yb[:A].reshape(E, R * B), G[:A], R)
        L[A:] = per_row(X, xb[A * B :].view(n, B, -1), yb[A:], G[A:])
        return G, L

    (G1, L1), (G2, L2) = copied(), shared()
    same = torch.equal(G1, G2) and torch.equal(L1, L2)
    times: dict[str, list[float]] = {"copied": [], "shared": []}
    for f in (copied, shared, copied, shared):  # warm-up
        f()
    for _ in range(args.repeats):
        for name, f in (("copied", copied), ("shared", shared)):
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    a, b = (1e3 * statistics.median(times[k_]) for k_ in ("copied", "shared"))
    print(
        f"MLP {SIZES}, {n} clients, {E} pairs x {R} requests, batch {B}, "
        f"{torch.get_num_threads()} threads: copied {a:.2f} ms, shared {b:.2f} ms, "
        f"ratio {a / b:.2f}; gradients and losses equal: {same}"
    )


if __name__ == "__main__":
    main()
