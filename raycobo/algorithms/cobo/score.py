"""Which of the pair scores (``raycobo.algorithms.pairs``) CoBo floors, and the floor's
unit: a floored score divides by at least ``cosine_floor`` times the clients' mean
squared gradient norm at x^0, measured once when the run starts."""

from __future__ import annotations

from collections.abc import Callable

import torch

from raycobo import rng
from raycobo.algorithms import pairs

FLOORED: set[str] = {"bounded"}


def register_score(name: str, floored: bool = False) -> Callable[[pairs.ScoreFn], pairs.ScoreFn]:
    """Register a pair score under ``name`` for ``algorithm.alignment`` (``floored``: it
    reads CoBo's floor)."""

    def add(fn: pairs.ScoreFn) -> pairs.ScoreFn:
        pairs.register_score(name)(fn)
        if floored:
            FLOORED.add(name)
        return fn

    return add


def initial_scale(ops, X: torch.Tensor) -> torch.Tensor:
    """The clients' mean squared gradient norm at x^0 (one gradient each, on a minibatch
    of stream INIT): the unit of a floored score's floor."""
    G, _ = ops.grads(torch.arange(X.shape[0], device=X.device), X, 0, rng.INIT, 0)
    return G.square().sum(dim=1).mean().detach()
