"""Host-resident rows (``engine.rounds: resident``): the coordinator's round policy for the
two-phase, pipelined rounds in which models and pair gradients go host to host and only
W rows, indices and scores pass through the coordinator (the hosts' side is
``resident_host.py``, the submission of a round ``resident_round.py``), for any method
that steps in rows (``StepsInRows``, and ``ScoresPairsInRows`` for one whose W learns
from pair scores); the engine holds none of their equations."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from raycobo.algorithms.base import (
    Evaluation,
    ScoresPairsInRows,
    StepsInRows,
    agreement_of,
    change_members,
)
from raycobo.engine.ray.errors import HostStateLost, actor_lost
from raycobo.engine.ray.ops import RayClientOps, gather_evaluation
from raycobo.engine.ray.resident_host import StepAnswer
from raycobo.engine.ray.resident_round import RoundSubmission, _Pending
from raycobo.engine.ray.timing import RoundTiming
from raycobo.state import state_tree


class ResidentRounds(RoundSubmission):
    """A method stepping in rows with host-resident models: the coordinator keeps W (a
    copy, from the scores the hosts return), the present clients, the method's extras
    and references to the hosts' published models; each round is submitted one ahead."""

    def __init__(self, algo: StepsInRows, ops: RayClientOps, timing: RoundTiming, rounds: int):
        self.algo, self.ops, self.timing, self.rounds = algo, ops, timing, rounds
        self.scores_pairs = isinstance(algo, ScoresPairsInRows)
        self.W: torch.Tensor | None = None
        self.active: torch.Tensor | None = None  # present clients (None: all)
        self.extras: dict[str, Any] = {}  # the rows state's own, by name
        self.blocks: list = []  # every host's published models, x^t (object references)
        self.ahead: _Pending | None = None  # the next round, already submitted
        self.rolled_back = 0  # rounds submitted ahead and discarded (membership changed)
        self.phase_s = [0.0, 0.0]  # slowest host's phase-1 / phase-2 compute
        self.blocks_read = [0, 0]  # host model blocks read by steps, of H * H

    def start(self) -> None:
        ops = self.ops
        x0 = ops.initial_params().numpy()
        self.W, self.extras = self.algo.rows_start(ops)
        ops.get(
            [
                h.res_init.remote(x0, self.W[rows].numpy())
                for h, rows in zip(ops.hosts, ops.layout, strict=True)
            ]
        )
        self.blocks = [h.res_block.remote() for h in ops.hosts]  # x^0 published

    def restore(self, tree: dict[str, Any]) -> None:
        res = tree["resident"]
        self.ahead = None
        self.W, self.active = res["W"].clone(), res["active"]
        self.extras = {k: v for k, v in res.items() if k not in ("X", "W", "active")}
        X = res["X"]
        self.blocks = [self.ops.ray.put(X[rows].numpy()) for rows in self.ops.layout]
        self._load_hosts(self.blocks)

    def snapshot(self) -> dict[str, Any]:
        """The committed state: the hosts' published models, W and the present clients."""
        return {
            "resident": {
                "X": self.models(),
                "W": self.W.clone(),
                "active": state_tree(self.active),
                **state_tree(self.extras),
            }
        }

    def _state(self):
        """The method's rows state (its state without the models, which stay in the
        hosts)."""
        return self.algo.rows_state(self.W, self.active, self.extras)

    def evaluate(self) -> Evaluation:
        """The committed models of the live hosts; dropped clients read NaN. A round
        submitted ahead is finished first (its time is the round's, not the evaluation's)."""
        ops = self.ops
        if self.ahead is not None:
            t0 = time.perf_counter()
            refs = [r for r, _ in self.ahead.steps.values()]
            ops.ray.wait(refs, num_returns=len(refs))
            self.timing.ahead_wait_s += time.perf_counter() - t0
        live = ops.live_hosts()
        res = ops.get([ops.hosts[h].res_evaluate.remote(self.blocks[h]) for h in live])
        parts = {h: (torch.tensor(ops.layout[h]),) for h in live}
        return gather_evaluation(ops.n_clients, parts, dict(zip(live, res, strict=True)))

    def models(self) -> torch.Tensor:
        blocks = self.ops.get(list(self.blocks))
        return torch.cat([torch.from_numpy(np.array(b)) for b in blocks])

    def collaboration(self) -> torch.Tensor | None:
        return self.algo.collaboration(self._state()).clone()

    def agreement(self, W: torch.Tensor | None) -> dict[str, float]:
        return agreement_of(self.algo, self._state(), W, self.ops.clusters)

    def artifacts(self) -> dict[str, Any]:
        return {}

    def change_membership(self, kind: str, clients: list[int], t: int) -> None:
        """W rows and columns change before round t: the round ahead is rolled back and
        every host gets its new rows."""
        self._roll_back()
        algo = self.algo
        state = change_members(algo, self._state(), kind, clients, t)
        self.W, self.active = state.W, state.active
        self.extras = algo.rows_extras(state)
        self._load_hosts(None)

    def drop(self, clients: list[int], t: int) -> None:
        """Clients of dead hosts leave (W rows and columns as for a schedule leave)."""
        state = self.algo.leave(self._state(), clients)
        self.W, self.active = state.W, state.active
        self.ops.events.append({"event": "clients_dropped", "round": t, "clients": clients})

    def report(self) -> dict[str, Any]:
        read, of = self.blocks_read
        return {
            "rounds_rolled_back": self.rolled_back,
            "resident_phase_seconds": self.phase_s,
            # the share of the hosts' published models that steps read (w_ik > 0)
            "step_blocks_read": read / of if of else None,
        }

    def round(self, t: int) -> dict[str, float]:
        """A resident round, pipelined: round t+1 is submitted before round t is
        collected (its inputs are round t's published blocks, still references), so the
        hosts find their next calls queued and the coordinator's and driver's latency
        overlaps their compute; a membership change in between rolls it back. A host
        that dies is restarted by Ray; every host is reset to the committed x^t (its
        published models, kept in the object store) and W rows, and the round redone."""
        lost = (*actor_lost(), HostStateLost)
        for attempt in range(self.ops.retries + 1):
            try:
                ahead = self.ahead
                pending = ahead if ahead is not None and ahead.t == t else self._submit(t)
                self.ahead = None
                # round t+1's pairs may read W^{t+1}: then it is sampled once round t is in
                if t + 1 < self.rounds and not self._reads_w(t + 1):
                    self.ahead = self._submit(t + 1, pending.blocks_after, pending.edges)
                return self._collect(pending)
            except Exception as err:  # noqa: BLE001 - a lost host, or a task that needed it
                if not isinstance(err, lost) and not isinstance(getattr(err, "cause", None), lost):
                    raise
                self.ops.events.append(
                    {
                        "event": "host_failed",
                        "round": t,
                        "attempt": attempt,
                        "error": type(err).__name__,
                    }
                )
                self.ahead = None
                if self.ops.on_failure == "drop":
                    self._drop_dead_hosts(t)
                self._restore_hosts()
        raise RuntimeError(f"resident round {t} failed {self.ops.retries + 1} times")

    def _reads_w(self, t: int) -> bool:
        """Whether round t's pairs read W^t (a method that scores pairs says)."""
        present = self.algo.present(self._state())
        return self.scores_pairs and self.algo.samples_from_w(t, present)

    def _drop_dead_hosts(self, t: int, probe_s: float = 10.0) -> None:
        """engine.on_failure=drop with resident hosts: the hosts that no longer answer are
        given up on and their clients leave (W rows and columns as for a schedule leave);
        their last committed models stay in the object store for the run's outputs."""
        from ray.exceptions import GetTimeoutError

        ops = self.ops
        pings = {h: ops.hosts[h].info.remote() for h in ops.live_hosts()}
        dead = []
        for h, ref in pings.items():
            try:
                ops.ray.get(ref, timeout=probe_s)
            except (*actor_lost(), GetTimeoutError):
                dead.append(h)
        if not dead:
            return  # a passing failure: the round is retried with every host
        ops.give_up(dead)
        self.drop(sorted(c for h in dead for c in ops.layout[h]), t)

    def _roll_back(self) -> None:
        """Discard the round submitted ahead: hosts return to the committed models and W."""
        if self.ahead is not None:
            self.ahead = None
            self.rolled_back += 1
            self._restore_hosts()

    def _load_hosts(self, blocks: list | None) -> None:
        """Every live host gets its W rows from the coordinator's W, and its models from
        ``blocks`` (None: it keeps them)."""
        ops = self.ops
        ops.get(
            [
                ops.hosts[h].res_load.remote(
                    None if blocks is None else blocks[h], self.W[ops.layout[h]].numpy()
                )
                for h in ops.live_hosts()
            ]
        )

    def _restore_hosts(self, wait_s: float = 60.0) -> None:
        """Reset every host to the committed models and W, waiting while Ray restarts one."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.ops.reattach(self.ops.live_hosts())
                self._load_hosts(self.blocks)
                return
            except actor_lost():
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _collect(self, p: _Pending) -> dict[str, float]:
        """Wait for a submitted round; commit its models (the published blocks, also the
        checkpoint a restarted host resumes from) and W (from the returned scores)."""
        ops, E = self.ops, p.edges.shape[0]
        hosts = list(p.steps)
        answers: list[StepAnswer] = ops.get([p.steps[h][0] for h in hosts])
        self.blocks = p.blocks_after  # x^{t+1}
        hi = ops.owner[p.edges[:, 0]]
        scores = torch.zeros(E)
        for h, a in zip(hosts, answers, strict=True):
            scores[hi == h] = torch.tensor(np.asarray(a.scores, dtype=np.float32))
        if self.scores_pairs:  # every round, as each host updates its rows
            self.W = self.algo.rows_update(self._state(), p.edges, scores, p.t).W
        loss = torch.cat([torch.tensor(np.asarray(a.losses)) for a in answers])
        p1, p2 = max(a.phase1_s for a in answers), max(a.phase2_s for a in answers)
        ops.count_time(compute_s=p1 + p2)
        self.phase_s[0] += p1
        self.phase_s[1] += p2
        return self.algo.stats(loss, E, p.members, self._state(), ops.dim)
