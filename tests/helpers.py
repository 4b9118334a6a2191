"""Small helpers shared by the tests."""

from __future__ import annotations


def run_rounds(algo, ops, rounds: int, state=None, start: int = 0):
    """Advance ``algo`` from ``state`` (or its initial state) for ``rounds`` rounds."""
    state = algo.init(ops) if state is None else state
    for t in range(start, start + rounds):
        state, _ = algo.round(state, t, ops)
    return state
