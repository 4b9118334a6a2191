"""Host-resident CoBo (``engine.resident``): the coordinator's side of the two-phase,
pipelined rounds in which models and alignment gradients go host to host and only W rows,
indices and scores pass through the coordinator."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raycobo.engine.ray.errors import HostStateLost, actor_lost


@dataclass
class _Pending:
    """A resident round submitted to the hosts: its edges, how many clients step, the
    (answer, new block) references of every live host's phase 2, and all blocks after."""

    t: int
    edges: torch.Tensor
    members: int
    steps: dict  # live host -> (answer, new block)
    blocks_after: list  # every host's block after the round


def _addresses(sources: list[int], hosts: torch.Tensor, rows: torch.Tensor) -> np.ndarray:
    """(k, 2) rows as (position of the host in ``sources``, row in that host's array):
    how a host finds rows among the arrays passed to it."""
    slot = torch.full((max(sources, default=0) + 1,), -1, dtype=torch.int64)
    slot[torch.tensor(sources, dtype=torch.int64)] = torch.arange(len(sources))
    return torch.stack([slot[hosts], rows], dim=1).numpy()


class ResidentRounds:
    """The resident policy of the coordinator (mixed into CoordinatorImpl)."""

    def _resident_round_with_restarts(self, t: int) -> dict[str, float]:
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
                if t + 1 < self.rounds:
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
        ops.dead |= set(dead)
        clients = sorted(c for h in dead for c in ops.layout[h])
        state = self.algo.leave(self._resident_state(), clients)
        self.W, self.active = state.W, state.active
        ops.events.append({"event": "clients_dropped", "round": t, "clients": clients})

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
        ops._get(
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
                self._load_hosts(self.blocks)
                return
            except actor_lost():
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _submit(
        self, t: int, blocks: list | None = None, pending_edges: torch.Tensor | None = None
    ) -> _Pending:
        """CoBo with host-resident models and W rows; every host's x^t is in the object
        store (published by its last step). Two calls per host, submitted at once, with
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
        algo, ops, c = self.algo, self.ops, self.algo.cfg
        hosts, n, H = ops.hosts, ops.n_clients, len(ops.hosts)
        owner, local = ops.owner, ops.local
        t0 = time.perf_counter()
        edges, members = algo.sample_edges(self.active, t, n)
        E = edges.shape[0]
        i, j = edges[:, 0], edges[:, 1]
        # the 2E endpoint occurrences, grouped by host: (client, partner); pos = the row of
        # the occurrence's gradient in its host's phase-1 answer
        client, partner = torch.cat([i, j]), torch.cat([j, i])
        occ_host = owner[client]
        order = torch.argsort(occ_host, stable=True)
        counts = torch.bincount(occ_host, minlength=H)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.empty(2 * E, dtype=torch.int64)
        pos[order] = torch.arange(2 * E) - starts[occ_host[order]]
        hi, hj = owner[i], owner[j]
        present = None if self.active is None else self.active.numpy()
        blocks = self.blocks if blocks is None else blocks
        W_host = self._host_links(edges, pending_edges)  # (H, H): h reads k's models
        self.blocks_read[0] += int(W_host.sum())
        self.blocks_read[1] += H * H
        mem_host = owner[members]
        live = ops.live_hosts()  # dropped hosts hold no present client
        grads: dict[int, Any] = {}
        steps: dict[int, tuple] = {}
        for h in live:
            sel = order[starts[h] : starts[h] + counts[h]]
            cl, pa = client[sel], partner[sel]
            need = sorted(set(owner[pa].tolist()) | {h})  # blocks of the partners
            at = _addresses(need, owner[pa], local[pa])
            grads[h] = hosts[h].res_grads.remote(
                t,
                local[cl].numpy(),
                at,
                pa.numpy(),
                local[members[mem_host == h]].numpy(),
                *(blocks[k] for k in need),
            )
        for h in live:
            e = torch.nonzero((hi == h) | (hj == h)).flatten()
            # phase-1 answers read (its own always: phase 2 must follow this round's phase 1)
            src = sorted(set(hi[e].tolist()) | set(hj[e].tolist()) | {h})
            at_i = _addresses(src, hi[e], pos[e])
            at_j = _addresses(src, hj[e], pos[E + e])
            linked = torch.nonzero(W_host[h]).flatten().tolist()
            linked_blocks = [x for k in linked for x in (k, blocks[k])]
            steps[h] = (
                hosts[h]
                .res_update.options(num_returns=2)
                .remote(
                    edges[e].numpy(),
                    at_i,
                    at_j,
                    (hi[e] == h).numpy(),
                    present,
                    (c.lr, algo.penalty(n), c.gamma, c.domain),
                    len(src),
                    *(grads[k] for k in src),
                    *linked_blocks,
                )
            )
        ops.coordination_s += time.perf_counter() - t0
        after = list(blocks)  # x^{t+1}: the live hosts' new blocks, the dropped hosts' last
        for h, (_, block) in steps.items():
            after[h] = block
        return _Pending(t, edges, members.numel(), steps, after)

    def _collect(self, p: _Pending) -> dict[str, float]:
        """Wait for a submitted round; commit its models (the published blocks, also the
        checkpoint a restarted host resumes from) and W (from the returned scores)."""
        from raycobo.algorithms.cobo import update_weights

        ops, c, E = self.ops, self.algo.cfg, p.edges.shape[0]
        hosts = list(p.steps)
        results = ops._get([p.steps[h][0] for h in hosts])
        self.blocks = p.blocks_after  # x^{t+1}
        hi = ops.owner[p.edges[:, 0]]
        scores = torch.zeros(E)
        for h, (sc, *_rest) in zip(hosts, results, strict=True):
            scores[hi == h] = torch.tensor(np.asarray(sc, dtype=np.float32))
        if E:
            self.W = update_weights(self.W, p.edges, scores, c.gamma, c.domain)  # Eq. (1)
        loss = torch.cat([torch.tensor(np.asarray(r[1])) for r in results])
        p1, p2 = max(r[2] for r in results), max(r[3] for r in results)
        ops.critical_compute_s += p1 + p2
        self.phase_s[0] += p1
        self.phase_s[1] += p2
        return self.algo.stats(loss, E, p.members)

    def _host_links(self, *edge_sets: torch.Tensor | None) -> torch.Tensor:
        """(H, H) bool: the step of host h's present clients reads host k's models --
        some w_ik > 0 between present clients. From the committed W: until the step, an
        entry can only turn positive on a pair sampled since (``edge_sets``), so those
        hosts are linked as well."""
        ops, H = self.ops, len(self.ops.hosts)
        W = self.W
        if self.active is not None:  # only pairs of present clients
            present = self.active.to(W.dtype)
            W = W * present[:, None] * present[None, :]
        onehot = torch.zeros(ops.n_clients, H)
        onehot[torch.arange(ops.n_clients), ops.owner] = 1.0
        links = (onehot.T @ (W > 0).to(torch.float32) @ onehot) > 0
        for edges in edge_sets:
            if edges is None:
                continue
            hi, hj = ops.owner[edges[:, 0]], ops.owner[edges[:, 1]]
            links[hi, hj] = True
            links[hj, hi] = True
            if self.algo.cfg.domain == "simplex":  # a projected row can turn any entry >0
                links[hi] = True
                links[hj] = True
        links[torch.arange(H), torch.arange(H)] = True
        return links
