"""Host-resident rows (``engine.rounds: resident``): the coordinator's round policy for the
two-phase, pipelined rounds in which models and pair gradients go host to host and only
W rows, indices and scores pass through the coordinator (the hosts' side is
``resident_host.py``), for any method that steps in rows (``StepsInRows``: CoBo, or a
plugin's); the engine holds none of their equations."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raycobo.algorithms.base import Evaluation, StepsInRows, agreement_of, change_members
from raycobo.engine.ray.errors import HostStateLost, actor_lost
from raycobo.engine.ray.ops import RayClientOps, gather_evaluation
from raycobo.engine.ray.resident_host import GradsRequest, StepAnswer, UpdateRequest
from raycobo.engine.ray.timing import RoundTiming
from raycobo.state import state_tree

RowStep = Any  # the round's row step, the method's (``StepsInRows.row_step``)


@dataclass
class _Pending:
    """A resident round submitted to the hosts: its edges, the clients that step, the
    (answer, new block) references of every live host's phase 2, and all blocks after."""

    t: int
    edges: torch.Tensor
    members: torch.Tensor  # the clients that step
    steps: dict  # live host -> (answer, new block)
    blocks_after: list  # every host's block after the round


@dataclass
class _Endpoints:
    """The 2E endpoint occurrences of a round's edges, grouped by the host that holds
    them: (client, partner) pairs; ``pos`` is each occurrence's row in its host's phase-1
    answer (i-endpoints first, then j-endpoints)."""

    client: torch.Tensor  # (2E,)
    partner: torch.Tensor  # (2E,)
    order: torch.Tensor  # (2E,) occurrences sorted by host
    starts: torch.Tensor  # (H,)
    counts: torch.Tensor  # (H,)
    pos: torch.Tensor  # (2E,)

    @classmethod
    def of(cls, edges: torch.Tensor, owner: torch.Tensor, H: int) -> _Endpoints:
        i, j = edges[:, 0], edges[:, 1]
        client, partner = torch.cat([i, j]), torch.cat([j, i])
        host = owner[client]
        order = torch.argsort(host, stable=True)
        counts = torch.bincount(host, minlength=H)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.empty(client.numel(), dtype=torch.int64)
        pos[order] = torch.arange(client.numel()) - starts[host[order]]
        return cls(client, partner, order, starts, counts, pos)

    def of_host(self, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        sel = self.order[self.starts[h] : self.starts[h] + self.counts[h]]
        return self.client[sel], self.partner[sel]


def _addresses(sources: list[int], hosts: torch.Tensor, rows: torch.Tensor) -> np.ndarray:
    """(k, 2) rows as (position of the host in ``sources``, row in that host's array):
    how a host finds rows among the arrays passed to it."""
    slot = torch.full((max(sources, default=0) + 1,), -1, dtype=torch.int64)
    slot[torch.tensor(sources, dtype=torch.int64)] = torch.arange(len(sources))
    return torch.stack([slot[hosts], rows], dim=1).numpy()


class ResidentRounds:
    """A method stepping in rows with host-resident models: the coordinator keeps W (a
    copy, from the scores the hosts return), the present clients, the method's extras
    and references to the hosts' published models; each round is submitted one ahead."""

    def __init__(self, algo: StepsInRows, ops: RayClientOps, timing: RoundTiming, rounds: int):
        self.algo, self.ops, self.timing, self.rounds = algo, ops, timing, rounds
        self.W: torch.Tensor | None = None
        self.active: torch.Tensor | None = None  # present clients (None: all)
        self.extras: dict[str, Any] = {}  # the rows state's own (CoBo: the cosine's unit)
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
                **state_tree(self.extras),  # CoBo's "scale", as before
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
        extras = getattr(algo, "rows_extras", None)  # optional in the rows protocol
        if extras is not None:
            self.extras = extras(state)
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
                # round t+1's pairs may read W^{t+1} (CoBo's recheck): then it is
                # sampled once round t is in
                present = self.algo.present(self._state())
                if t + 1 < self.rounds and not self.algo.samples_from_w(t + 1, present):
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

    def _submit(
        self, t: int, blocks: list | None = None, pending_edges: torch.Tensor | None = None
    ) -> _Pending:
        """A round with host-resident models and W rows; every host's x^t is in the
        object store (published by its last step). Two calls per host, submitted at once, with
        no wait in between: phase 1 (``res_grads``) computes each host's clients'
        gradients at the midpoints of their sampled pairs and at their own models;
        phase 2 (``res_update``) reads both endpoints' gradients host to host, takes Eq.
        (1) on the host's W rows and Eq. (3) against the published models of the hosts
        its clients collaborate with (w_ik > 0), and publishes x^{t+1}. Only indices,
        scores and losses pass through the coordinator, which keeps a copy of W (for
        restarts, membership changes and the run's outputs) from the returned scores.
        This submits round t from ``blocks`` (default: the committed x^t); with
        ``pending_edges`` (round t-1's, not collected yet) W may still change on those
        pairs, so their hosts count as linked. ``_collect`` waits for the round."""
        ops, n, H = self.ops, self.ops.n_clients, len(self.ops.hosts)
        t0 = time.perf_counter()
        edges, members = self.algo.sample_edges(self.active, t, n, W=self.W)
        ends = _Endpoints.of(edges, ops.owner, H)
        blocks = self.blocks if blocks is None else blocks
        W_host = self._host_links(edges, pending_edges)  # (H, H): h reads k's models
        self.blocks_read[0] += int(W_host.sum())
        self.blocks_read[1] += H * H
        live = ops.live_hosts()  # dropped hosts hold no present client
        hyper = self.algo.row_step(t, self._state())  # the same for every host
        phase1 = {h: self._phase1(h, t, ends, members, blocks, hyper) for h in live}
        grads = {h: refs[0] for h, refs in phase1.items()}
        pulled = blocks  # the models the step pulls toward: x^t, or the stepped ones
        if hyper.at == "stepped":  # published by phase 1 (a dropped host's: x^t)
            pulled = [phase1[k][1] if k in phase1 else blocks[k] for k in range(H)]
        steps = {h: self._phase2(h, hyper, edges, ends, grads, W_host, pulled) for h in live}
        ops.count_time(coordination_s=time.perf_counter() - t0)
        after = list(blocks)  # x^{t+1}: the live hosts' new blocks, the dropped hosts' last
        for h, (_, block) in steps.items():
            after[h] = block
        return _Pending(t, edges, members, steps, after)

    def _phase1(
        self, h: int, t: int, ends: _Endpoints, members: torch.Tensor, blocks: list, hyper: RowStep
    ) -> list:
        """Host h's gradients at its clients' midpoints and models, and its stepped
        models where the pull acts on them (``res_grads``; two references)."""
        owner, local = self.ops.owner, self.ops.local
        cl, pa = ends.of_host(h)
        need = sorted(set(owner[pa].tolist()) | {h})  # blocks of the partners
        return (
            self.ops.hosts[h]
            .res_grads.options(num_returns=2)
            .remote(
                GradsRequest(
                    round=t,
                    own=local[cl].numpy(),
                    partners=_addresses(need, owner[pa], local[pa]),
                    salts=pa.numpy(),
                    members=local[members[owner[members] == h]].numpy(),
                ),
                hyper,
                *(blocks[k] for k in need),
            )
        )

    def _phase2(
        self, h, hyper: RowStep, edges, ends: _Endpoints, grads: dict, W_host, blocks: list
    ) -> tuple:
        """Host h's Eq. (1) on its W rows and Eq. (3) over the models it weighs
        (``res_update``): both endpoints' phase-1 gradients read host to host."""
        E = edges.shape[0]
        hi, hj = self.ops.owner[edges[:, 0]], self.ops.owner[edges[:, 1]]
        e = torch.nonzero((hi == h) | (hj == h)).flatten()
        # phase-1 answers read (its own always: phase 2 must follow this round's phase 1)
        src = sorted(set(hi[e].tolist()) | set(hj[e].tolist()) | {h})
        linked = torch.nonzero(W_host[h]).flatten().tolist()
        present = None if self.active is None else self.active.numpy()
        return (
            self.ops.hosts[h]
            .res_update.options(num_returns=2)
            .remote(
                UpdateRequest(
                    edges=edges[e].numpy(),
                    at_i=_addresses(src, hi[e], ends.pos[e]),
                    at_j=_addresses(src, hj[e], ends.pos[E + e]),
                    report=(hi[e] == h).numpy(),
                    present=present,
                    n_grads=len(src),
                ),
                hyper,
                *(grads[k] for k in src),
                *[x for k in linked for x in (k, blocks[k])],
            )
        )

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
        faded = getattr(self.algo, "faded", None)  # optional in the rows protocol
        if faded is not None:  # every round, as each host fades its rows
            self.W = faded(self._state(), p.t).W
        if E:
            self.W = self.algo.apply_scores(self._state(), p.edges, scores, p.t).W  # Eq. (1)
        loss = torch.cat([torch.tensor(np.asarray(a.losses)) for a in answers])
        p1, p2 = max(a.phase1_s for a in answers), max(a.phase2_s for a in answers)
        ops.count_time(compute_s=p1 + p2)
        self.phase_s[0] += p1
        self.phase_s[1] += p2
        return self.algo.stats(loss, E, p.members, self._state(), ops.dim)

    def _host_links(self, *edge_sets: torch.Tensor | None) -> torch.Tensor:
        """(H, H) bool: the step of host h's present clients reads host k's models --
        some w_ik > 0 (and at least the pull's threshold) between present clients. From
        the committed W: until the step, an entry can only change on a pair sampled since
        (``edge_sets``), so those hosts are linked as well."""
        ops, H = self.ops, len(self.ops.hosts)
        W = self.W
        if self.active is not None:  # only pairs of present clients
            present = self.active.to(W.dtype)
            W = W * present[:, None] * present[None, :]
        onehot = torch.zeros(ops.n_clients, H)
        onehot[torch.arange(ops.n_clients), ops.owner] = 1.0
        weighed = self.algo.rows_read(W)  # the entries the step reads
        links = (onehot.T @ weighed.to(torch.float32) @ onehot) > 0
        for edges in edge_sets:
            if edges is None:
                continue
            hi, hj = ops.owner[edges[:, 0]], ops.owner[edges[:, 1]]
            links[hi, hj] = True
            links[hj, hi] = True
            if self.algo.updates_whole_rows():  # e.g. a row projected onto the simplex
                links[hi] = True
                links[hj] = True
        links[torch.arange(H), torch.arange(H)] = True
        return links
