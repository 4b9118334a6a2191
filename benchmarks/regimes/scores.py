"""How well one alignment score separates a cell's clusters: at chosen rounds of a run
with CoBo's defaults, every pair (at most ``--pairs``) scored at its midpoint as Eq. (1)
scores it -- each end's gradient on one minibatch -- and with each end's gradient the
mean of ``--batches`` minibatches, and that mean centred (each end's gradient less the
mean over all the measured ends: the component every client's gradient shares taken
out), with the mean and spread of the scores inside the clusters and across them, d' =
(mean inside - mean across) / their pooled spread, and the share of each whose W step
that round (gamma_t x score) would take a weight from 0 to the pull's threshold.

Usage: python benchmarks/regimes/scores.py --cell mnist1d-16 [--split validation]
       [--seed 1] [--at 0,8,25,100,300] [--batches 16] [--pairs 4000]

The local engine in this process; the run's own W steps are left as they are (the
scores are measured beside them, on draws of their own).
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
regimes = SimpleNamespace(**runpy.run_path(str(HERE / "run.py")))
diagnose = SimpleNamespace(**runpy.run_path(str(HERE / "diagnose.py")))

# the measurement's own salts, past any batch_salts of alignment_batches
SALT_BASE = 1 << 28


def separation(scores, inside, first_step: float | None = None) -> dict:
    """Mean and spread of the scores inside and across the clusters, and d'; with
    ``first_step`` (the score a pair's first W step needs to reach the pull's threshold)
    the share of each that reaches it."""
    w, c = scores[inside], scores[~inside]
    pooled = float(((w.var() + c.var()) / 2).sqrt())
    reach = {}
    if first_step is not None:
        reach = {
            "inside_reach": round(float((w >= first_step).float().mean()), 2),
            "across_reach": round(float((c >= first_step).float().mean()), 2),
        }
    return {
        **reach,
        "inside": round(float(w.mean()), 3),
        "inside_sd": round(float(w.std()), 3),
        "across": round(float(c.mean()), 3),
        "across_sd": round(float(c.std()), 3),
        "d": round(float(w.mean() - c.mean()) / pooled, 2) if pooled > 0 else None,
    }


def first_step(cobo, t: int, n: int) -> float | None:
    """The score whose W step in round t among n clients (gamma_t, the step of a pair the
    pull does not read yet) takes a weight from 0 to the pull's threshold (None without
    one)."""
    cut = cobo.pull.threshold
    return cut / cobo.w_step(t, n).gamma if cut else None


def other_signals(X, X0, i, j) -> dict:
    """A score read off the models alone: the cosine of the two clients' updates since
    the first measured round (pFedGraph's similarity when that round is 0)."""
    import torch

    U = X - X0
    return {"updates_cosine": torch.nn.functional.cosine_similarity(U[i], U[j], dim=1)}


def mean_model_signal(ops, X, i, j, t: int, kind: str, floor, batches: int) -> dict:
    """Eq. (1)'s score with both ends' gradients at the clients' mean model instead of
    the pair's midpoint (a point neither end has fit), one minibatch an end."""
    import torch

    from raycobo import rng
    from raycobo.algorithms.cobo import alignment_scores

    n, E = X.shape[0], i.numel()
    ends, partners = torch.cat([i, j]), torch.cat([j, i])
    Z = X.mean(dim=0, keepdim=True).expand(2 * E, -1).contiguous()
    salts = partners + SALT_BASE + 2 * batches * n  # past loss_signals' draws
    G, _ = ops.grads(ends, Z, t, rng.ALIGN, salts)
    return {"at_mean_model": alignment_scores(G[:E], G[E:], kind, floor)}


def loss_signals(ops, X, Z, i, j, t: int, batches: int) -> dict:
    """Scores from forward-only minibatch losses (the mean of ``batches`` an end), each a
    pair's loss gain, larger when the two should collaborate: ``midpoint_gain``, minus
    what each end's loss rises by from its own model to the midpoint (a finite step of
    the objective Eq. (1) linearises); ``swap_gain``, minus what it rises by from its own
    model to its partner's."""
    import torch

    from raycobo import rng

    n = X.shape[0]
    ends, partners = torch.cat([i, j]), torch.cat([j, i])
    E = i.numel()

    def loss(points):
        return torch.stack(
            [
                ops.losses(ends, points, t, rng.ALIGN, partners + SALT_BASE + (batches + b) * n)
                for b in range(batches)
            ]
        ).mean(dim=0)

    own, mid, other = loss(X[ends]), loss(Z.repeat(2, 1)), loss(X[partners])
    relative = (own - mid) / (own + mid).clamp_min(1e-12)
    return {
        "own_loss": own[:E] + own[E:],
        "midpoint_loss": mid[:E] + mid[E:],
        "midpoint_gain": -0.5 * ((mid - own)[:E] + (mid - own)[E:]),
        "relative_gain": 0.5 * (relative[:E] + relative[E:]),
        "swap_gain": -0.5 * ((other - own)[:E] + (other - own)[E:]),
    }


def measure(
    cfg: dict, at: list[int], batches: int, pairs: int, signals: bool = False
) -> list[dict]:
    """Run ``cfg`` (CoBo) up to the last round of ``at``, measuring at each (``signals``:
    also the scores that are not Eq. (1)'s, ``other_signals`` and ``loss_signals``)."""
    import torch

    from raycobo import api, rng
    from raycobo.algorithms.cobo import CoBo, alignment_scores

    clusters = torch.tensor(diagnose.clusters_of(cfg))
    original = CoBo.round
    start: dict = {}  # the models at the first measured round (x^0 when it is 0)
    rows: list[dict] = []

    def round_(self, state, t, ops):
        if t in at:
            n = state.X.shape[0]
            i, j = torch.triu_indices(n, n, 1)
            if i.numel() > pairs:  # a fixed subset of the pairs
                keep = torch.randperm(i.numel(), generator=torch.Generator().manual_seed(0))
                i, j = i[keep[:pairs]], j[keep[:pairs]]
            E = i.numel()
            Z = (0.5 * (state.X[i] + state.X[j])).repeat(2, 1)
            ends, partners = torch.cat([i, j]), torch.cat([j, i])
            floor = self.floor(state)
            G = None  # the draws' sum, one draw held at a time (2E x d each)
            for b in range(batches):
                g = ops.grads(ends, Z, t, rng.ALIGN, partners + SALT_BASE + b * n)[0]
                if G is None:
                    one = alignment_scores(g[:E], g[E:], self.cfg.alignment, floor)
                    G = g.clone()  # an engine may reuse its output buffer
                else:
                    G.add_(g)
                del g
            G.div_(batches)
            mean = alignment_scores(G[:E], G[E:], self.cfg.alignment, floor)
            G.sub_(G.mean(dim=0))
            centred = alignment_scores(G[:E], G[E:], self.cfg.alignment, floor)
            inside = clusters[i] == clusters[j]
            first = first_step(self, t, n)
            row = {
                "round": t,
                "one_batch": separation(one, inside, first),
                f"mean_of_{batches}": separation(mean, inside, first),
                f"centred_mean_of_{batches}": separation(centred, inside, first),
            }
            if signals:
                if "X" not in start:  # cloned once, not at every measured round
                    start["X"] = state.X.clone()
                row.update(other_signals(state.X, start["X"], i, j))
                row.update(
                    mean_model_signal(ops, state.X, i, j, t, self.cfg.alignment, floor, batches)
                )
                row.update(loss_signals(ops, state.X, Z[:E], i, j, t, batches))
                row = {
                    k: separation(v, inside) if torch.is_tensor(v) else v for k, v in row.items()
                }
            rows.append(row)
        return original(self, state, t, ops)

    cfg = {**cfg, "rounds": max(at) + 1, "eval_every": max(at) + 1}
    CoBo.round = round_
    try:
        with tempfile.TemporaryDirectory(prefix="scores-") as out:
            api.run(cfg, out=Path(out) / "run", track=False)
    finally:
        CoBo.round = original
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", required=True)
    ap.add_argument("--split", choices=["test", "validation"], default="validation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--at", default="0,8,25,100,300", help="rounds to measure at")
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--signals", action="store_true", help="also scores that are not Eq. (1)'s")
    args = ap.parse_args(argv)
    cells = {c["id"]: c for c in regimes.load_cells()}
    if args.cell not in cells:
        ap.error(f"--cell: no cell {args.cell!r} in cells.yaml")
    if args.batches < 2:
        ap.error("--batches: at least 2 (the mean is compared with one minibatch)")
    at = sorted({int(a) for a in args.at.split(",")})
    import torch

    torch.set_num_threads(args.threads)
    cfg = regimes.cell_config(cells[args.cell], args.split, args.seed)
    cfg["algorithm"] = {**(cfg.get("algorithm") or {}), "name": "cobo"}  # the cell's lr kept
    for row in measure(cfg, at, args.batches, args.pairs, args.signals):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
