"""Eq. (1)'s score as CoBo reads it: which of the pair scores
(``raycobo.algorithms.pairs``) CoBo floors, the floor's unit (a floored score divides by
at least ``cosine_floor`` times the clients' mean squared gradient norm at x^0, measured
once when the run starts), and each score's own W step (``Step``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from raycobo import rng
from raycobo.algorithms import pairs


@dataclass(frozen=True)
class Step:
    """A score's W step, in its units: gamma, and whether it decays as
    gamma / sqrt(1 + k_t) (``wstep.Schedule``)."""

    gamma: float
    decays: bool


# a score in [-1, 1], the cosine's range: 3 / sqrt(1 + k_t), chosen on the regime matrix
# with the bounded cosine (docs/explanation/cobo.md)
UNIT = Step(3.0, decays=True)
# the inner product, in the gradients' squared units: Algorithm 1's constant gamma, 0.01
# as measured on the cross-device twin (FIDELITY.md)
INNER = Step(0.01, decays=False)
STEPS: dict[str, Step] = {"inner": INNER, "cosine": UNIT, "bounded": UNIT}
FLOORED: set[str] = {"bounded"}


def step_of(score: str) -> Step:
    """The W step of score ``score`` (``UNIT`` for one registered without a step)."""
    return STEPS.get(score, UNIT)


def register_score(
    name: str, floored: bool = False, step: Step = UNIT
) -> Callable[[pairs.ScoreFn], pairs.ScoreFn]:
    """Register a pair score under ``name`` for ``algorithm.alignment`` (``floored``: it
    reads CoBo's floor; ``step``: its W step, what ``gamma`` and ``gamma_decay`` left null
    take -- ``UNIT`` for a score in [-1, 1])."""

    def add(fn: pairs.ScoreFn) -> pairs.ScoreFn:
        pairs.register_score(name)(fn)
        STEPS[name] = step
        if floored:
            FLOORED.add(name)
        return fn

    return add


def initial_scale(ops, X: torch.Tensor) -> torch.Tensor:
    """The clients' mean squared gradient norm at x^0 (one gradient each, on a minibatch
    of stream INIT): the unit of a floored score's floor."""
    G, _ = ops.grads(torch.arange(X.shape[0], device=X.device), X, 0, rng.INIT, 0)
    return G.square().sum(dim=1).mean().detach()
