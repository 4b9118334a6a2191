"""Submitting a resident round (``engine.rounds: resident``): which host needs which
published models and phase-1 answers, as the two calls of every host (``res_grads``,
``res_update``; the hosts' side is ``resident_host.py``), submitted at once."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raycobo.engine.ray.resident_host import GradsRequest, UpdateRequest

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


class RoundSubmission:
    """The submitting half of ``ResidentRounds`` (a mixin: it reads the coordinator's
    ``algo``, ``ops``, ``W``, ``active``, ``blocks`` and ``scores_pairs``)."""

    def _submit(
        self, t: int, blocks: list | None = None, pending_edges: torch.Tensor | None = None
    ) -> _Pending:
        """A round with host-resident models and W rows; every host's x^t is in the
        object store (published by its last step). Two calls per host, submitted at once,
        with no wait in between: phase 1 (``res_grads``) computes each host's clients'
        gradients at the points of their sampled pairs and at their own models; phase 2
        (``res_update``) reads both ends' gradients host to host, scores the pairs and
        updates the host's W rows, steps its clients over the published models of the
        hosts their rows read, and publishes x^{t+1}. Only indices, scores and losses
        pass through the coordinator, which keeps a copy of W (for restarts, membership
        changes and the run's outputs) from the returned scores.
        This submits round t from ``blocks`` (default: the committed x^t); with
        ``pending_edges`` (round t-1's, not collected yet) W may still change on those
        pairs, so their hosts count as linked. ``_collect`` waits for the round."""
        ops, n, H = self.ops, self.ops.n_clients, len(self.ops.hosts)
        t0 = time.perf_counter()
        members = torch.arange(n) if self.active is None else torch.nonzero(self.active).flatten()
        edges = torch.zeros(0, 2, dtype=torch.int64)
        if self.scores_pairs:
            edges = self.algo.round_pairs(self.active, t, n, self.W)
        ends = _Endpoints.of(edges, ops.owner, H)
        blocks = self.blocks if blocks is None else blocks
        W_host = self._host_links(edges, pending_edges)  # (H, H): h reads k's models
        self.blocks_read[0] += int(W_host.sum())
        self.blocks_read[1] += H * H
        live = ops.live_hosts()  # dropped hosts hold no present client
        hyper = self.algo.row_step(t, self._state())  # the same for every host
        phase1 = {h: self._phase1(h, t, ends, members, blocks, hyper) for h in live}
        grads = {h: refs[0] for h, refs in phase1.items()}
        read = blocks  # the models the step reads: x^t, or those phase 1 published
        if hyper.reads_published:  # published by phase 1 (a dropped host's: x^t)
            read = [phase1[k][1] if k in phase1 else blocks[k] for k in range(H)]
        steps = {h: self._phase2(h, hyper, edges, ends, grads, W_host, read) for h in live}
        ops.count_time(coordination_s=time.perf_counter() - t0)
        after = list(blocks)  # x^{t+1}: the live hosts' new blocks, the dropped hosts' last
        for h, (_, block) in steps.items():
            after[h] = block
        return _Pending(t, edges, members, steps, after)

    def _phase1(
        self, h: int, t: int, ends: _Endpoints, members: torch.Tensor, blocks: list, hyper: RowStep
    ) -> list:
        """Host h's gradients at its clients' pair points and models, and the models it
        publishes for the others' step (``res_grads``; two references)."""
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
        """Host h's pair scores and W rows' update and its step over the models it reads
        (``res_update``): both ends' phase-1 gradients read host to host."""
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
                    scores_pairs=self.scores_pairs,
                ),
                hyper,
                *(grads[k] for k in src),
                *[x for k in linked for x in (k, blocks[k])],
            )
        )

    def _host_links(self, *edge_sets: torch.Tensor | None) -> torch.Tensor:
        """(H, H) bool: the step of host h's present clients reads host k's models --
        an entry its rows read (``rows_read``) between present clients. From
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
