"""How the coordinator runs a round: one policy object, chosen once at start.

- :class:`SyncRounds`: the algorithm's own round over the hosts (``RayClientOps``); every
  round waits for its answers. Every registered method runs this way.
- :class:`StaleRounds` (``engine.rounds: stale``): CoBo with bounded staleness
  (``engine.staleness``): alignment requests are sent ahead and applied when they
  arrive, at most that many rounds late.
- ``ResidentRounds`` (``engine.rounds: resident``, ``resident.py``): CoBo with the models
  kept in the hosts.

:func:`schedule_for` resolves ``engine.rounds`` once into a :class:`Schedule`, which
gives the host class, the hosts' actor options and the policy.

A policy owns its state (the algorithm state, or W and the hosts' published models) and
answers the coordinator's calls; the coordinator keeps the timing and the failure
handling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch

from raycobo import rng
from raycobo.algorithms.base import Elastic, Evaluation, PlansAlignment, StepsInRows
from raycobo.engine.ray.ops import AsyncGrads, RayClientOps
from raycobo.engine.session import LocalSession
from raycobo.state import state_tree


@dataclass
class RoundTiming:
    """The coordinator's measure of the rounds (reported in ``engine_report``)."""

    compute_s: float = 0.0  # wall time of rounds inside the coordinator
    host_compute_s: float = 0.0  # of which the slowest host computed
    # from the first round's start to the last round's end, less the calls between
    # rounds (evaluations, outputs, membership): pipelined rounds overlap the gaps
    span: list[float] = field(default_factory=list)
    between_s: float = 0.0
    ahead_wait_s: float = 0.0  # calls between rounds waiting for a round submitted ahead


class RoundPolicy(Protocol):
    def start(self) -> None: ...
    def restore(self, tree: dict[str, Any]) -> None: ...
    def round(self, t: int) -> dict[str, float]: ...
    def drop(self, clients: list[int], t: int) -> None: ...
    def evaluate(self) -> Evaluation: ...
    def models(self) -> torch.Tensor: ...
    def collaboration(self) -> torch.Tensor | None: ...
    def agreement(self, W: torch.Tensor | None) -> dict[str, float]: ...
    def artifacts(self) -> dict[str, Any]: ...
    def change_membership(self, kind: str, clients: list[int]) -> None: ...
    def snapshot(self) -> dict[str, Any]: ...
    def report(self) -> dict[str, Any]: ...


RoundMode = Literal["sync", "stale", "resident"]


@dataclass(frozen=True)
class Schedule:
    """The run's round schedule on Ray (``engine.rounds``), resolved once by
    :func:`schedule_for` and handed to whatever places hosts or runs rounds: the host
    class, the hosts' actor options and the coordinator's policy all come from here."""

    mode: RoundMode = "sync"
    staleness: int = 0  # stale: rounds a late result may lag
    rounds: int = 0  # the run's length (the last round waits for everything)

    def host_impl(self) -> type:
        """The body of the client host actors."""
        if self.mode == "resident":
            from raycobo.engine.ray.resident_host import ResidentHostImpl

            return ResidentHostImpl
        from raycobo.engine.ray.host import ClientHostImpl

        return ClientHostImpl

    def actor_options(self) -> dict[str, Any]:
        """A stale schedule's hosts take a second call (the step while alignment runs)."""
        return {"max_concurrency": 2 if self.mode == "stale" else 1}

    def policy(self, algo, ops: RayClientOps, timing: RoundTiming) -> RoundPolicy:
        """The coordinator's round policy."""
        if self.mode == "resident":
            from raycobo.engine.ray.resident import ResidentRounds

            return ResidentRounds(algo, ops, timing, self.rounds)
        if self.mode == "stale":
            return StaleRounds(algo, ops, timing, self.staleness, self.rounds)
        return SyncRounds(algo, ops, timing)


def schedule_for(cfg, algo) -> Schedule:
    """``engine.rounds`` for this run, checked against what the method can do: resident
    rounds need a method that steps in rows (``StepsInRows``: CoBo, with the settings its
    ``rows_refusal`` accepts); stale rounds need a method whose alignment is planned
    apart from its step (``PlansAlignment``: CoBo, in the weights-first order). A
    combination that cannot run is refused naming the key."""
    from raycobo.config import ConfigError

    e, a = cfg.engine, cfg.algorithm
    why = None
    if e.rounds == "resident":
        if not isinstance(algo, StepsInRows):
            why = f"algorithm '{a.name}' has no round in rows for hosts to keep (cobo has)"
        else:
            why = algo.rows_refusal()
    elif e.rounds == "stale":
        if not isinstance(algo, PlansAlignment):
            why = (
                f"algorithm '{a.name}' has no alignment requests to send ahead (cobo has); "
                "set engine.rounds=sync"
            )
        elif getattr(a, "order", "weights_first") != "weights_first":
            why = (
                "late alignment results need algorithm.order=weights_first (the "
                "models_first order waits for each round's W)"
            )
    if why is not None:
        raise ConfigError(f"invalid config key 'engine.rounds': {e.rounds}: {why}")
    lag = e.late_rounds() if e.rounds == "stale" else 0
    return Schedule(e.rounds, lag, cfg.rounds)


def elastic_or_stop(algo, why: str) -> Elastic:
    if not isinstance(algo, Elastic):
        raise RuntimeError(
            f"{why}, and algorithm '{algo.name}' cannot continue without them "
            "(engine.on_failure=drop needs clients that can leave: cobo)"
        )
    return algo


class SyncRounds(LocalSession):
    """The algorithm's state in the coordinator; each round is the algorithm's own. The
    local engine's session over the hosts' ClientOps: the same methods, one code (a
    capability such as ``KeepsOwnAgreement`` is honoured on both engines), with what
    only a remote coordinator needs: plain CPU tensors in its answers, results in flight
    in its snapshots (:class:`StaleRounds`), and clients dropped with a lost host."""

    def __init__(self, algo, ops: RayClientOps, timing: RoundTiming):
        super().__init__(algo, ops)
        self.timing = timing

    @property
    def algo(self):
        return self.algorithm

    def restore(self, tree: dict[str, Any]) -> None:
        super().restore(tree["state"])

    def drop(self, clients: list[int], t: int) -> None:
        """Hosts died (engine.on_failure=drop): their clients leave; the round reruns."""
        algo = elastic_or_stop(self.algo, f"client hosts died (clients {clients})")
        self.state = algo.leave(self.state, clients)
        self.ops.events.append({"event": "clients_dropped", "round": t, "clients": clients})

    def models(self) -> torch.Tensor:
        return super().models().detach().cpu()

    def collaboration(self) -> torch.Tensor | None:
        W = super().collaboration()
        return None if W is None else W.detach().cpu()

    def change_membership(self, kind: str, clients: list[int]) -> None:
        if not isinstance(self.algo, Elastic):
            raise ValueError(f"algorithm '{self.algo.name}' has no clients joining or leaving")
        super().change_membership(kind, clients)

    def snapshot(self) -> dict[str, Any]:
        return {"state": super().snapshot(), "pending": []}

    def report(self) -> dict[str, Any]:
        return {}


class StaleRounds(SyncRounds):
    """CoBo with bounded staleness: the alignment gradients of round t are requested
    without waiting; the model step goes ahead with W updated by the alignment results
    that have arrived, and waits only for those ``engine.staleness`` rounds old (all of
    them at the last round). Results in flight are checkpointed as their requests and
    sent again on restore (minibatches are counter-based: the answers are the same)."""

    def __init__(self, algo, ops: RayClientOps, timing: RoundTiming, staleness: int, rounds: int):
        super().__init__(algo, ops, timing)
        self.staleness, self.rounds = staleness, rounds
        self.pending: list[tuple[int, torch.Tensor, AsyncGrads]] = []  # (round, edges, req)
        self.lags: list[int] = []  # rounds each alignment result arrived late

    def round(self, t: int) -> dict[str, float]:
        algo, ops = self.algo, self.ops
        p = algo.plan(self.state, t, ops)
        E = p.edges.shape[0]
        if E:
            req = ops.grads_async(p.align_clients, p.align_points, t, rng.ALIGN, p.align_salts)
            self.pending.append((t, p.edges, req))
        G, L = ops.grads(p.members, self.state.X[p.members], t, rng.STEP, 0)
        last = t == self.rounds - 1
        keep = []
        applied = 0
        for r, edges, req in self.pending:
            if last or r <= t - self.staleness or req.ready():
                self.state = algo.apply_alignment(self.state, edges, req.result(), r)
                self.lags.append(t - r)
                applied += edges.shape[0]
            else:
                keep.append((r, edges, req))
        self.pending = keep
        self.state = algo.step(self.state, p.members, G)
        stats = algo.stats(L, E, p.members.numel())
        stats["alignments_applied"] = float(applied)
        stats["alignments_pending"] = float(sum(e.shape[0] for _, e, _ in keep))
        return stats

    def snapshot(self) -> dict[str, Any]:
        pending = [
            {"round": r, "edges": edges.clone(), "request": state_tree(list(req.request))}
            for r, edges, req in self.pending
        ]
        return {**super().snapshot(), "pending": pending}

    def restore(self, tree: dict[str, Any]) -> None:
        super().restore(tree)
        self.pending = [
            (p["round"], p["edges"], self.ops.grads_async(*p["request"])) for p in tree["pending"]
        ]

    def report(self) -> dict[str, Any]:
        if not self.lags:
            return {}
        return {
            "alignment_lag_max": max(self.lags),
            "alignment_lag_mean": float(np.mean(self.lags)),
        }
