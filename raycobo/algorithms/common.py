"""Small pure functions shared by several algorithms."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from raycobo import rng
from raycobo.algorithms.base import ClientOps, LocalSGD, Plan, compute
from raycobo.algorithms.settings import TopKShare


class LocalSteps(Protocol):
    """What ``local_updates`` reads from a method's settings."""

    lr: float
    local_steps: int
    client_rate: float


def top_indices(v: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries along the last dimension, ties going to the lower
    index. ``torch.topk`` breaks ties differently on CPU and CUDA (and integer-valued
    data such as digits' pixels gives exactly equal gradient magnitudes); a stable sort
    picks the same entries on every device."""
    return torch.sort(v, dim=-1, descending=True, stable=True).indices[..., :k]


def sample_clients(n: int, rate: float, seed: int, t: int) -> torch.Tensor:
    """Client ids taking part in round t: each with probability ``rate`` (at least one)."""
    ids = torch.arange(n)
    if rate >= 1.0:
        return ids
    u = rng.uniform(seed, rng.SAMPLER, t, ids, 0x51)
    chosen = ids[u < rate]
    if chosen.numel() == 0:
        chosen = ids[torch.argmin(u)].reshape(1)
    return chosen


def local_sgd(
    ops: ClientOps,
    clients: torch.Tensor,
    start: torch.Tensor,
    lr: float,
    steps: int,
    t: int,
    stream: int,
    prox: float = 0.0,
    anchor: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` SGD steps of each client from its start point (m, d), with a proximal
    term toward ``anchor`` (the start unless given) when ``prox`` > 0 (``LocalSGD``).
    Where the engine runs them (``TrainsLocally``: the Ray hosts, one call), there.

    Returns the end points (m, d) and the first step's minibatch losses (m,)."""
    return compute(ops, LocalSGD(clients, start, lr, steps, stream, prox, anchor), t)


def apply_arrived(current, plan: Plan, arrived: list, update) -> tuple[Any, dict[str, float]]:
    """A ``PlansRounds`` method's global model(s) after the ahead answers that arrived,
    oldest first: ``update(current, p, out, fresh)`` for each, ``fresh`` where the plan is
    this round's and nothing was applied before it (its clients started from
    ``current``). -> (new, {"train_loss": the applied rounds' first-step losses} or {})"""
    losses = []
    for p, (out, loss) in arrived:
        current = update(current, p, out, p.round == plan.round and not losses)
        losses.append(loss)
    return current, ({"train_loss": float(torch.cat(losses).mean())} if losses else {})


def weighted_average(Y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k weights_k Y_k / sum_k weights_k; Y: (m, d), weights: (m,) -> (d,)."""
    w = weights.to(Y.dtype)
    return (w / w.sum()) @ Y  # one GEMV pass over Y


def group_average(
    Y: torch.Tensor, groups: torch.Tensor, weights: torch.Tensor, n_groups: int, old: torch.Tensor
) -> torch.Tensor:
    """Per-group weighted averages of the rows of Y; groups without members keep ``old``.

    Y: (m, d); groups: (m,) in [0, n_groups); weights: (m,); old: (n_groups, d)."""
    w = weights.to(Y.dtype)
    sums = torch.zeros_like(old).index_add_(0, groups, w[:, None] * Y)  # (K, d)
    mass = torch.zeros(n_groups, dtype=Y.dtype, device=Y.device).index_add_(0, groups, w)
    has = mass > 0
    out = old.clone()
    out[has] = sums[has] / mass[has, None]
    return out


def same_group_matrix(groups: torch.Tensor) -> torch.Tensor:
    """W_ij = 1 when clients i and j share a group, else 0. groups: (n,) -> (n, n)."""
    return (groups[:, None] == groups[None, :]).to(torch.float32)


# communication: bytes per sent float32 value / int32 index; the compressed baselines
# (Top-K with error feedback, Count-Sketch)

FLOAT, INDEX = 4, 4


def top_count(cfg: TopKShare, d: int) -> int:
    """K of the top-K compressors, from ``algorithm.topk_fraction``."""
    return max(1, min(d, round(cfg.topk_fraction * d)))


def local_updates(ops: ClientOps, x: torch.Tensor, cfg: LocalSteps, seed: int, t: int):
    """The sampled clients' local SGD updates from the global model x (d,).
    -> (clients (m,), updates y - x (m, d), first-step losses (m,))"""
    clients = sample_clients(ops.n_clients, cfg.client_rate, seed, t).to(x.device)
    start = x.expand(clients.numel(), -1)
    Y, loss = local_sgd(ops, clients, start, cfg.lr, cfg.local_steps, t, rng.STEP)
    return clients, Y - start, loss


# Bits of float32 mantissa that the magnitude ranking of top_k ignores: magnitudes that
# agree to the remaining 11 bits (relative 2^-11, about 5e-4) rank as ties. CPU and CUDA
# sum in different orders, so magnitudes that are equal in exact arithmetic (gradients of
# pixels that are equal across a batch) come out a few ulps apart: on an H200, 9 entries
# of one client's Top-K update were 0.0387636349 on CUDA while 4 of them were
# 0.0387636386 on the CPU, and each device kept a different 2 of them.
RANK_BITS_IGNORED = 12


def rank_key(mag: torch.Tensor) -> torch.Tensor:
    """A monotone coarsening of non-negative magnitudes for ranking: float32 with its
    last RANK_BITS_IGNORED mantissa bits cleared (rounding toward zero keeps the order)."""
    m = mag.float().contiguous()
    mask = ~((1 << RANK_BITS_IGNORED) - 1)
    return (m.view(torch.int32) & mask).view(torch.float32)


def top_k(V: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest-magnitude entries of every row, zero the rest. Magnitudes equal
    up to rounding (``rank_key``) are ties, which go to the lower index on every device."""
    idx = top_indices(rank_key(V.abs()), k)
    return torch.zeros_like(V).scatter_(1, idx, V.gather(1, idx))
