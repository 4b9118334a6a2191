"""The coordinator actor: the algorithm's state, W and the sampler; rounds, bounded
staleness, evaluations, membership changes, checkpoints and the timing report."""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import torch

from raycobo import rng
from raycobo.algorithms.base import Elastic, ExportsArtifacts, PlansAlignment
from raycobo.engine.ray.errors import HostsLost
from raycobo.engine.ray.ops import AsyncGrads, RayClientOps
from raycobo.engine.ray.resident import ResidentRounds, _Pending


def _between_rounds(method):
    """A coordinator call made between rounds: its time is left out of the round span."""

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        t0, waited = time.perf_counter(), self.ahead_wait_s
        try:
            return method(self, *args, **kwargs)
        finally:
            if self.span:  # once the rounds have started; waiting for a round is the round's
                self.between_s += time.perf_counter() - t0 - (self.ahead_wait_s - waited)

    return timed


class CoordinatorImpl(ResidentRounds):
    """The body of the Coordinator actor: algorithm state, W and the sampler live here."""

    def __init__(self, cfg_dict: dict[str, Any], hosts: list[Any], layout: list[list[int]]):
        from raycobo.algorithms import build_algorithm
        from raycobo.config import validate

        cfg = validate(cfg_dict)
        torch.set_num_threads(cfg.engine.threads or 1)
        e = cfg.engine
        self.ops = RayClientOps(hosts, layout, e.timeout_s, e.max_restarts, e.on_failure)
        self.algo = build_algorithm(cfg.algorithm, cfg.rounds, cfg.seed)
        self.state = None
        self.resident = cfg.engine.resident  # CoBo with the models kept in the hosts
        self.ahead: _Pending | None = None  # resident: the next round, already submitted
        self.rolled_back = 0  # rounds submitted ahead and discarded (membership changed)
        self.phase_s = [0.0, 0.0]  # resident: slowest host's phase-1 / phase-2 compute
        self.blocks_read = [0, 0]  # resident steps: host model blocks read, of H * H
        self.staleness = cfg.engine.staleness
        self.rounds = cfg.rounds
        self.pending: list[tuple[int, Any, AsyncGrads]] = []  # (round, edges, request)
        self.lags: list[int] = []  # rounds each alignment result arrived late
        self.compute_s = 0.0  # wall time of rounds inside the coordinator
        self.round_host_compute_s = 0.0  # of which the slowest host computed
        # from the first round's start to the last round's end, less the calls between
        # rounds (evaluations, outputs, membership): pipelined rounds overlap the gaps
        self.span: list[float] = []
        self.between_s = 0.0
        self.ahead_wait_s = 0.0  # calls between rounds waiting for the round submitted ahead

    def setup(self) -> dict[str, Any]:
        if self.resident:
            from raycobo.algorithms.cobo import initial_weights

            x0 = self.ops.initial_params().numpy()
            self.algo.penalty(self.ops.n_clients)  # an unstable explicit rho stops here
            self.W = initial_weights(self.ops.n_clients, self.algo.cfg.domain)
            self.active: torch.Tensor | None = None  # present clients (None: all)
            self.ops._get(
                [
                    h.res_init.remote(x0, self.W[rows].numpy())
                    for h, rows in zip(self.ops.hosts, self.ops.layout, strict=True)
                ]
            )
            self.blocks = [h.res_block.remote() for h in self.ops.hosts]  # x^0 published
        else:
            self.state = self.algo.init(self.ops)
        return {
            "n_clients": self.ops.n_clients,
            "clusters": self.ops.clusters,
            "host_devices": self.ops.host_devices,
            "host_gpu_ids": self.ops.host_gpu_ids,
            "host_nodes": self.ops.host_nodes,
            "coordinator_node": self.ops.ray.get_runtime_context().get_node_id(),
        }

    def round(self, t: int) -> dict[str, float]:
        t0, c0 = time.perf_counter(), self.ops.critical_compute_s
        if not self.span:
            self.span = [t0, t0]
        asynchronous = self.staleness > 0 and isinstance(self.algo, PlansAlignment)
        while True:
            try:
                if self.resident:
                    stats = self._resident_round_with_restarts(t)
                elif asynchronous:
                    stats = self._stale_round(t)
                else:
                    self.state, stats = self.algo.round(self.state, t, self.ops)
                break
            except HostsLost as lost:  # engine.on_failure=drop: go on without them
                if not isinstance(self.algo, Elastic):
                    raise RuntimeError(
                        f"{lost}, and algorithm '{self.algo.name}' cannot continue without "
                        "them (engine.on_failure=drop needs clients that can leave: cobo)"
                    ) from None
                self.state = self.algo.leave(
                    self.state, lost.clients
                )  # the round reruns without them
                self.ops.events.append(
                    {"event": "clients_dropped", "round": t, "clients": lost.clients}
                )
        self.span[1] = time.perf_counter()
        self.compute_s += self.span[1] - t0
        self.round_host_compute_s += self.ops.critical_compute_s - c0
        return stats

    def _stale_round(self, t: int) -> dict[str, float]:
        """CoBo with bounded staleness: the alignment gradients of round t are requested
        without waiting; the model step goes ahead with W updated by the alignment
        results that have arrived, and waits only for those ``engine.staleness`` rounds
        old (all of them at the last round)."""
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
                self.state = algo.apply_alignment(self.state, edges, req.result())
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

    @_between_rounds
    def evaluate(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        from raycobo.algorithms import evaluate

        if self.resident:
            if self.ahead is not None:  # the hosts finish the round ahead first: its time
                t0 = time.perf_counter()
                refs = [r for r, _ in self.ahead.steps.values()]
                self.ops.ray.wait(refs, num_returns=len(refs))
                self.ahead_wait_s += time.perf_counter() - t0
            ops = self.ops  # the committed models of the live hosts; dropped clients read NaN
            live = ops.live_hosts()
            res = ops._get([ops.hosts[h].res_evaluate.remote(self.blocks[h]) for h in live])
            answers = dict(zip(live, res, strict=True))
            parts = {h: (torch.tensor(ops.layout[h]),) for h in live}
            ev = RayClientOps._gather_eval(ops.n_clients, parts, answers)
            return ev.loss, ev.accuracy

        ev = evaluate(self.algo, self.state, self.ops)
        return ev.loss, ev.accuracy

    def _resident_state(self):
        """The coordinator's W and membership as a CoBoState (models stay in the hosts)."""
        from raycobo.algorithms.cobo import CoBoState

        return CoBoState(torch.empty(self.ops.n_clients, 0), self.W, self.active)

    @_between_rounds
    def collaboration(self) -> torch.Tensor | None:
        if self.resident:
            return self.algo.collaboration(self._resident_state()).clone()
        W = self.algo.collaboration(self.state)
        return None if W is None else W.detach().cpu()

    @_between_rounds
    def eval_params(self) -> torch.Tensor:
        if self.resident:
            blocks = self.ops._get(list(self.blocks))
            return torch.cat([torch.from_numpy(np.array(b)) for b in blocks])
        return self.algo.eval_params(self.state).detach().cpu()

    @_between_rounds
    def artifacts(self) -> dict[str, Any]:
        if self.resident:
            return {}
        exports = isinstance(self.algo, ExportsArtifacts)
        return self.algo.artifacts(self.state) if exports else {}

    @_between_rounds
    def membership(self, kind: str, clients: list[int]) -> None:
        if not isinstance(self.algo, Elastic):
            raise ValueError(f"algorithm '{self.algo.name}' has no clients joining or leaving")
        fn = self.algo.join if kind == "join" else self.algo.leave
        if self.resident:  # W rows and columns change: every host gets its new rows
            self._roll_back()
            state = fn(self._resident_state(), clients)
            self.W, self.active = state.W, state.active
            self._load_hosts(None)
            return
        self.state = fn(self.state, clients)

    @_between_rounds
    def checkpoint_state(self) -> dict[str, Any]:
        """The committed algorithm state as plain data (raycobo.checkpoint): resident
        hosts hand over their published models; alignment requests still in flight
        (engine.staleness) are saved as requests and sent again on restore (their
        minibatches are counter-based, so the answers are the same)."""
        from raycobo.checkpoint import state_tree

        if self.resident:
            X = self.eval_params.__wrapped__(self)
            return {"resident": {"X": X, "W": self.W.clone(), "active": state_tree(self.active)}}
        pending = [
            {"round": r, "edges": edges.clone(), "request": state_tree(list(req.request))}
            for r, edges, req in self.pending
        ]
        return {"state": state_tree(self.state), "pending": pending}

    @_between_rounds
    def restore_state(self, tree: dict[str, Any]) -> None:
        from raycobo.checkpoint import load_into

        if self.resident:
            res = tree["resident"]
            self.ahead = None
            self.W, self.active = res["W"].clone(), res["active"]
            X, ray = res["X"], self.ops.ray
            self.blocks = [ray.put(X[rows].numpy()) for rows in self.ops.layout]
            self._load_hosts(self.blocks)
            return
        self.state = load_into(self.state, tree["state"])
        self.pending = [
            (p["round"], p["edges"], self.ops.grads_async(*p["request"])) for p in tree["pending"]
        ]

    def report(self) -> dict[str, Any]:
        span = self.span[1] - self.span[0] - self.between_s if self.span else 0.0
        return {
            "events": list(self.ops.events),
            "staleness": self.staleness,
            "rounds_rolled_back": self.rolled_back,
            "resident_phase_seconds": self.phase_s if self.resident else None,
            # resident: the share of the hosts' published models that steps read (w_ik > 0)
            "step_blocks_read": (
                self.blocks_read[0] / self.blocks_read[1] if self.blocks_read[1] else None
            ),
            "alignment_lag_max": max(self.lags) if self.lags else None,
            "alignment_lag_mean": float(np.mean(self.lags)) if self.lags else None,
            "round_seconds_in_coordinator": self.compute_s,
            "round_span_seconds": span,
            "host_call_seconds": self.ops.coordination_s,
            "host_wait_seconds": self.ops.wait_s,
            "round_host_compute_seconds": self.round_host_compute_s,
            # the share of the rounds' wall time not spent computing on the (slowest) hosts
            "coordination_share": 1.0 - self.round_host_compute_s / span if span > 0 else None,
        }
