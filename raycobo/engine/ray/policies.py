"""How the coordinator runs a round: one policy object, chosen once at start.

- :class:`SyncRounds`: the algorithm's own round over the hosts (``RayClientOps``); every
  round waits for its answers. Every registered method runs this way.
- :class:`StaleRounds` (``engine.rounds: stale``): bounded staleness
  (``engine.staleness``) for any method that plans its rounds (``PlansRounds``: pair
  scores, local updates, a plugin's requests): the plans' ahead requests are sent
  without waiting and applied when they arrive, at most that many rounds late.
- ``ResidentRounds`` (``engine.rounds: resident``, ``resident.py``): a method that steps
  in rows (``StepsInRows``) with the models kept in the hosts.

:func:`schedule_for` resolves ``engine.rounds`` once into a :class:`Schedule`, which
gives the host class, the hosts' actor options and the policy.

A policy owns its state (the algorithm state, or W and the hosts' published models) and
answers the coordinator's calls; the coordinator keeps the timing and the failure
handling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch

from raycobo.algorithms.base import (
    Elastic,
    Evaluation,
    Gradients,
    LocalSGD,
    Plan,
    PlansRounds,
    StepsInRows,
    compute,
    round_result,
)
from raycobo.algorithms.pairs import PairScores
from raycobo.engine.ray.ops import InFlight, RayClientOps, Scored
from raycobo.engine.ray.timing import RoundTiming
from raycobo.engine.session import LocalSession
from raycobo.state import state_tree


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
    def change_membership(self, kind: str, clients: list[int], t: int) -> None: ...
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
    rounds need a method that steps in rows (``StepsInRows``, with the settings its
    ``rows_refusal`` accepts); stale rounds need a method that plans its rounds
    (``PlansRounds``, with settings its ``plan_refusal`` accepts). A combination that
    cannot run is refused naming the key."""
    from raycobo.config import ConfigError

    e, a = cfg.engine, cfg.algorithm
    why = None
    if e.rounds == "resident":
        if not isinstance(algo, StepsInRows):
            why = (
                f"algorithm '{a.name}' does not step in rows for hosts to keep "
                f"(raycobo.StepsInRows: {_having(StepsInRows)} do)"
            )
        else:
            why = algo.rows_refusal()
    elif e.rounds == "stale":
        if not isinstance(algo, PlansRounds):
            why = (
                f"algorithm '{a.name}' does not plan its rounds (raycobo.PlansRounds: "
                f"{_having(PlansRounds)} do); set engine.rounds=sync"
            )
        else:
            why = algo.plan_refusal()
    if why is not None:
        raise ConfigError(f"invalid config key 'engine.rounds': {e.rounds}: {why}")
    lag = e.late_rounds() if e.rounds == "stale" else 0
    return Schedule(e.rounds, lag, cfg.rounds)


def _having(capability: type) -> str:
    """The built-in methods with a capability, for a message."""
    from raycobo.algorithms import METHODS

    names = [
        n
        for n, m in METHODS.items()
        if isinstance(m.build, type) and issubclass(m.build, capability)
    ]
    return ", ".join(names) or "none"


def elastic_or_stop(algo, why: str) -> Elastic:
    if not isinstance(algo, Elastic):
        raise RuntimeError(
            f"{why}, and algorithm '{algo.name}' cannot continue without them "
            f"(engine.on_failure=drop needs clients that can leave: {_having(Elastic)})"
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

    def change_membership(self, kind: str, clients: list[int], t: int) -> None:
        if not isinstance(self.algo, Elastic):
            raise ValueError(f"algorithm '{self.algo.name}' has no clients joining or leaving")
        super().change_membership(kind, clients, t)

    def snapshot(self) -> dict[str, Any]:
        return {"state": super().snapshot(), "pending": []}

    def report(self) -> dict[str, Any]:
        return {}


class StaleRounds(SyncRounds):
    """Bounded staleness for any method that plans its rounds (``PlansRounds``): round
    t's ``ahead`` request is sent without waiting; the round applies its ``now`` result
    and the ahead results that have arrived, waiting only for those ``engine.staleness``
    rounds old (all of them at the last round, and where the plan ``drain``s). Plans in
    flight are checkpointed as plain data and sent again on restore (minibatches are
    counter-based: the answers are the same)."""

    def __init__(self, algo, ops: RayClientOps, timing: RoundTiming, staleness: int, rounds: int):
        super().__init__(algo, ops, timing)
        self.staleness, self.rounds = staleness, rounds
        self.pending: list[tuple[Plan, InFlight | Scored]] = []
        self.lags: list[int] = []  # rounds each ahead result arrived late

    def round(self, t: int) -> dict[str, float]:
        algo, ops = self.algo, self.ops
        plan = algo.plan_round(self.state, t, ops)
        if plan.ahead is not None:
            self.pending.append((plan, ops.submit(plan.ahead, t)))
        now = None if plan.now is None else compute(ops, plan.now, t)
        last = t == self.rounds - 1 or plan.drain
        arrived, keep = [], []
        for p, req in self.pending:
            if last or p.round <= t - self.staleness or req.ready():
                arrived.append((p, req.result()))
                self.lags.append(t - p.round)
            else:
                keep.append((p, req))
        self.pending = keep
        self.state, stats = round_result(algo, algo.apply_round(self.state, plan, now, arrived))
        stats["ahead_applied"] = float(len(arrived))
        stats["ahead_pending"] = float(len(keep))
        return stats

    def snapshot(self) -> dict[str, Any]:
        pending = [
            {  # the plan's ahead request and keep (its now was computed in its round)
                "round": p.round,
                "kind": type(p.ahead).__name__,
                "ahead": state_tree(
                    {f.name: getattr(p.ahead, f.name) for f in dataclasses.fields(p.ahead)}
                ),
                "keep": state_tree(p.keep),
            }
            for p, _ in self.pending
        ]
        return {**super().snapshot(), "pending": pending}

    def restore(self, tree: dict[str, Any]) -> None:
        super().restore(tree)
        self.pending = []
        for saved in tree["pending"]:
            plan = plan_from_tree(saved)
            self.pending.append((plan, self.ops.submit(plan.ahead, plan.round)))

    def report(self) -> dict[str, Any]:
        if not self.lags:
            return {}
        return {"ahead_lag_max": max(self.lags), "ahead_lag_mean": float(np.mean(self.lags))}


def plan_from_tree(tree: dict[str, Any]) -> Plan:
    """A checkpointed plan in flight (its ``ahead`` request and ``keep``; ``now`` was
    computed in its own round)."""
    kinds = {"Gradients": Gradients, "LocalSGD": LocalSGD, "PairScores": PairScores}
    if tree["kind"] == "PairScores" and "points" in tree["ahead"]:
        raise ValueError(
            "this checkpoint's pair scores in flight are kept as raycobo 0.3.0 kept them (their "
            "points, not the models): resume it with raycobo 0.3.0"
        )
    ahead = kinds[tree["kind"]](**tree["ahead"])
    return Plan(tree["round"], ahead, None, dict(tree["keep"]))
