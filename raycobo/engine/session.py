"""One way to run a round: the session every engine offers the run loop.

A session owns an algorithm's state and the client operations it runs on, and answers
the run loop (``raycobo.lifecycle``) with a small surface: ``start`` or ``restore`` the state,
``round``, ``evaluate``, ``collaboration`` and its cluster ``agreement``, membership
changes, ``snapshot`` for checkpoints, ``report`` and ``artifacts`` for the outputs,
``close``. The loop never asks which engine it has.

- :class:`LocalSession` (engines ``local`` and ``loop``): the algorithm's state lives in
  this process, next to the ``ClientOps`` that compute for it.
- ``raycobo.engine.ray.RaySession``: the state lives in the coordinator actor, which runs
  the rounds with one of its round policies (synchronous, bounded staleness, resident).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from raycobo.algorithms.base import (
    Algorithm,
    ClientOps,
    Elastic,
    Evaluation,
    ExportsArtifacts,
    agreement_of,
    change_members,
    evaluate,
    expect,
    round_result,
)
from raycobo.state import load_into, state_tree


@runtime_checkable
class Session(Protocol):
    """What the run loop needs from an engine."""

    n_clients: int
    clusters: list[int | None]
    elastic: bool  # clients may join and leave (the algorithm is Elastic)

    def start(self) -> None:
        """The algorithm's initial state."""
        ...

    def restore(self, tree: Any) -> None:
        """The state of a snapshot (instead of ``start``)."""
        ...

    def round(self, t: int) -> dict[str, float]:
        """Round t (0-based); its statistics."""
        ...

    def evaluate(self) -> Evaluation: ...

    def models(self) -> torch.Tensor:
        """The model each client predicts with, (n, d)."""
        ...

    def collaboration(self) -> torch.Tensor | None: ...

    def agreement(self, W: torch.Tensor | None) -> dict[str, float]:
        """Mean W inside and across the ground-truth clusters (``w_within``/``w_across``)."""
        ...

    def change_membership(self, kind: str, clients: list[int], t: int) -> None:
        """``kind`` 'join' or 'leave' before round t, the next (only when ``elastic``)."""
        ...

    def snapshot(self) -> Any:
        """The state as plain data (``raycobo.state``), for a checkpoint."""
        ...

    def report(self) -> dict[str, Any]:
        """Entries for the run summary (``execution``, ``engine_report``)."""
        ...

    def artifacts(self) -> dict[str, Any]:
        """Learned extras saved beside the run (``<name>.pt``)."""
        ...

    def close(self) -> None: ...


class LocalSession:
    """The local and loop engines: the algorithm's state next to its ClientOps."""

    def __init__(self, algorithm: Algorithm, ops: ClientOps, threads: int | None = None):
        self.algorithm, self.ops = algorithm, ops
        self.n_clients = ops.n_clients
        self.clusters = list(ops.clusters)
        self.elastic = isinstance(algorithm, Elastic)
        self.state: Any = None
        self.threads, self._threads_before = threads, None

    def _take_threads(self) -> None:
        """engine.threads: torch's intra-op pool for the run (restored at close), so that
        runs side by side do not oversubscribe the cores; null leaves torch's own."""
        if self.threads:
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(self.threads)

    def start(self) -> None:
        from raycobo.engine.memory import check_fits

        check_fits(self.algorithm, self.n_clients, self.ops.dim, torch.device(self.ops.device))
        self._take_threads()
        self.state = self.algorithm.init(self.ops)

    def restore(self, tree: Any) -> None:
        self._take_threads()
        self.state = load_into(self.algorithm.init(self.ops), tree)

    def round(self, t: int) -> dict[str, float]:
        self.state, stats = round_result(
            self.algorithm, self.algorithm.round(self.state, t, self.ops)
        )
        return stats

    def evaluate(self) -> Evaluation:
        return evaluate(self.algorithm, self.state, self.ops)

    def models(self) -> torch.Tensor:
        return self.algorithm.eval_params(self.state)

    def collaboration(self) -> torch.Tensor | None:
        W = self.algorithm.collaboration(self.state)
        if W is not None:
            expect(self.algorithm, "collaboration", W, (self.ops.n_clients, self.ops.n_clients))
        return W

    def agreement(self, W: torch.Tensor | None) -> dict[str, float]:
        return agreement_of(self.algorithm, self.state, W, self.clusters)

    def change_membership(self, kind: str, clients: list[int], t: int) -> None:
        algo = self.algorithm
        assert isinstance(algo, Elastic), "the run checks session.elastic first"
        self.state = change_members(algo, self.state, kind, list(clients), t)

    def snapshot(self) -> Any:
        return state_tree(self.state)

    def report(self) -> dict[str, Any]:
        execution = self.ops.execution  # the local engine's plan (None: nothing planned)
        if execution is None:
            return {}
        # torch's threads: float sums are split by them, so they are part of the numbers
        return {"execution": {**execution.as_dict(), "threads": torch.get_num_threads()}}

    def artifacts(self) -> dict[str, Any]:
        if isinstance(self.algorithm, ExportsArtifacts):
            return self.algorithm.artifacts(self.state)
        return {}

    def close(self) -> None:
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
