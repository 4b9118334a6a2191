"""Eq. (1)'s score of a pair: how well the two clients' gradients at their midpoint
align. A score is a function (G_i, G_j, floor) -> (E,), registered by name with
``register_score`` (CoBo's ``algorithm.alignment``); ``floor`` is the least denominator
a bounded score divides by (0 where the score has no use for one)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from raycobo import rng

ScoreFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
SCORES: dict[str, ScoreFn] = {}
# the scores whose floor is cosine_floor times the clients' mean squared gradient norm at
# x^0 (``initial_scale``), measured once when the run starts
FLOORED: set[str] = set()


def register_score(name: str, floored: bool = False) -> Callable[[ScoreFn], ScoreFn]:
    """Register a score under ``name`` (``floored``: it reads the bounded floor)."""

    def add(fn: ScoreFn) -> ScoreFn:
        SCORES[name] = fn
        if floored:
            FLOORED.add(name)
        return fn

    return add


@register_score("inner")
def inner(G_i: torch.Tensor, G_j: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """<g_i(z_ij), g_j(z_ij)>, as Eq. (1) prints it."""
    return torch.linalg.vecdot(G_i, G_j)


@register_score("cosine")
def cosine(G_i: torch.Tensor, G_j: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """The inner product over ||g_i|| ||g_j|| (in [-1, 1]: every pair moves by at most
    gamma, whatever the gradients' scale)."""
    return _over_norms(G_i, G_j, 0.0)


@register_score("bounded", floored=True)
def bounded(G_i: torch.Tensor, G_j: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """The inner product over max(||g_i|| ||g_j||, floor): the cosine while the gradients
    are large, and once training has shrunk them below the floor the inner product in
    units of the floor (it shrinks with them, as Eq. (1)'s does)."""
    return _over_norms(G_i, G_j, floor)


def _over_norms(G_i: torch.Tensor, G_j: torch.Tensor, floor: float) -> torch.Tensor:
    dot = torch.linalg.vecdot(G_i, G_j)
    norms = torch.linalg.vector_norm(G_i, dim=1) * torch.linalg.vector_norm(G_j, dim=1)
    return dot / norms.clamp_min(max(floor, 1e-12))


def alignment_scores(
    G_i: torch.Tensor, G_j: torch.Tensor, kind: str = "inner", floor: float = 0.0
) -> torch.Tensor:
    """The score ``kind`` of each sampled pair. G_i, G_j: (E, d) -> (E,)"""
    return SCORES[kind](G_i, G_j, floor)


def initial_scale(ops, X: torch.Tensor) -> torch.Tensor:
    """The clients' mean squared gradient norm at x^0 (one gradient each, on a minibatch
    of stream INIT): the unit of a floored score's floor."""
    G, _ = ops.grads(torch.arange(X.shape[0], device=X.device), X, 0, rng.INIT, 0)
    return G.square().sum(dim=1).mean().detach()
