"""The coordinator actor: holds the algorithm through one round policy (synchronous,
bounded staleness or resident; ``policies.py``, ``resident.py``), given by the schedule
the driver resolved once; keeps the timing report and the failure handling (hosts lost
with ``engine.on_failure=drop``)."""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from raycobo.engine.ray.errors import HostsLost
from raycobo.engine.ray.ops import RayClientOps
from raycobo.engine.ray.policies import Schedule
from raycobo.engine.ray.timing import RoundTiming

# what every engine report holds, whatever the policy adds
REPORT_DEFAULTS = {
    "rounds_rolled_back": 0,
    "resident_phase_seconds": None,
    "step_blocks_read": None,
    "ahead_lag_max": None,
    "ahead_lag_mean": None,
}


def _between_rounds(method):
    """A coordinator call made between rounds: its time is left out of the round span."""

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        tm = self.timing
        t0, waited = time.perf_counter(), tm.ahead_wait_s
        try:
            return method(self, *args, **kwargs)
        finally:
            if tm.span:  # once the rounds have started; waiting for a round is the round's
                tm.between_s += time.perf_counter() - t0 - (tm.ahead_wait_s - waited)

    return timed


class CoordinatorImpl:
    """The body of the Coordinator actor (a plain class, testable in-process)."""

    def __init__(
        self,
        cfg_dict: dict[str, Any],
        hosts: list[Any],
        layout: list[list[int]],
        parts: list | None,
        schedule: Schedule,
    ):
        """``schedule``: the run's round schedule, as the driver resolved it."""
        from raycobo.algorithms import build_algorithm
        from raycobo.config import validate

        cfg = validate(cfg_dict)
        torch.set_num_threads(cfg.engine.threads or 1)
        e = cfg.engine
        self.ops = RayClientOps(
            hosts, layout, e.timeout_s, e.max_restarts, e.on_failure, parts=parts
        )
        self.algo = build_algorithm(cfg.algorithm, cfg.rounds, cfg.seed)
        self.schedule = schedule
        self.timing = RoundTiming()
        self.policy = self.schedule.policy(self.algo, self.ops, self.timing)

    def describe(self) -> dict[str, Any]:
        ops = self.ops
        return {
            "n_clients": ops.n_clients,
            "clusters": ops.clusters,
            "host_devices": ops.host_devices,
            "host_gpu_ids": ops.host_gpu_ids,
            "host_nodes": ops.host_nodes,
            "coordinator_node": ops.ray.get_runtime_context().get_node_id(),
        }

    def start(self) -> None:
        self.policy.start()

    def restore(self, tree: dict[str, Any]) -> None:
        self.policy.restore(tree)

    def round(self, t: int) -> dict[str, float]:
        tm = self.timing
        t0, c0 = time.perf_counter(), self.ops.critical_compute_s
        if not tm.span:
            tm.span = [t0, t0]
        while True:
            try:
                stats = self.policy.round(t)
                break
            except HostsLost as lost:  # engine.on_failure=drop: the round reruns without them
                self.policy.drop(lost.clients, t)
        tm.span[1] = time.perf_counter()
        tm.compute_s += tm.span[1] - t0
        tm.host_compute_s += self.ops.critical_compute_s - c0
        return stats

    @_between_rounds
    def evaluate(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        ev = self.policy.evaluate()
        return ev.loss, ev.accuracy

    @_between_rounds
    def collaboration(self) -> torch.Tensor | None:
        return self.policy.collaboration()

    @_between_rounds
    def agreement(self, W: torch.Tensor | None) -> dict[str, float]:
        return self.policy.agreement(W)

    @_between_rounds
    def models(self) -> torch.Tensor:
        return self.policy.models()

    @_between_rounds
    def artifacts(self) -> dict[str, Any]:
        return self.policy.artifacts()

    @_between_rounds
    def change_membership(self, kind: str, clients: list[int], t: int) -> None:
        self.policy.change_membership(kind, clients, t)

    @_between_rounds
    def snapshot(self) -> dict[str, Any]:
        """The committed state as plain data (``raycobo.state``) for a checkpoint."""
        return self.policy.snapshot()

    def report(self) -> dict[str, Any]:
        tm, ops = self.timing, self.ops
        span = tm.span[1] - tm.span[0] - tm.between_s if tm.span else 0.0
        return {
            "events": list(ops.events),
            "rounds": self.schedule.mode,
            "staleness": self.schedule.staleness,
            **REPORT_DEFAULTS,
            **self.policy.report(),
            "round_seconds_in_coordinator": tm.compute_s,
            "round_span_seconds": span,
            "host_call_seconds": ops.coordination_s,
            "host_wait_seconds": ops.wait_s,
            "round_host_compute_seconds": tm.host_compute_s,
            # the share of the rounds' wall time not spent computing on the (slowest)
            # hosts; stale rounds overlap calls, whose compute can add up past the wall
            # time: at least 0
            "coordination_share": max(0.0, 1.0 - tm.host_compute_s / span) if span > 0 else None,
        }
