"""The client host of host-resident rows (``engine.rounds: resident``): a
:class:`ClientHostImpl` that also keeps its clients' models and W rows. A round is two
calls, ``res_grads`` (phase 1) then ``res_update`` (phase 2), whose equations are the
method's row step (``StepsInRows.row_step``); see ``raycobo.engine.ray.resident``. Pair
gradients are drawn as ``pairs.rows_of`` draws them (stream ALIGN, salted by the
partner), the members' on stream STEP, as a synchronous round draws them."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np
import torch

from raycobo import rng
from raycobo.algorithms import pairs
from raycobo.engine.ray.errors import HostStateLost
from raycobo.engine.ray.host import ClientHostImpl
from raycobo.engine.ray.layout import host_layout

RowStep = Any  # the method's row step (``StepsInRows.row_step``)


class GradsRequest(NamedTuple):
    """Phase 1's question to a host (``res_grads``): the points its clients need
    gradients at this round."""

    round: int
    own: np.ndarray  # local index of the i end of each sampled pair this host serves
    partners: np.ndarray  # (k, 2): (published block among the call's, row) of each j end
    salts: np.ndarray  # the pairs' alignment salts (global j ids)
    members: np.ndarray  # local indices of its clients that take the model step


class UpdateRequest(NamedTuple):
    """Phase 2's question to a host (``res_update``): the sampled pairs that touch it
    and where both ends' phase-1 gradients lie among the call's arrays."""

    edges: np.ndarray  # (e, 2) global ids
    at_i: np.ndarray  # (e, 2): (phase-1 answer, row) of g_i(z_ij)
    at_j: np.ndarray  # and of g_j(z_ij)
    report: np.ndarray  # (e,) bool: pairs whose i end is this host's (it reports their scores)
    present: np.ndarray | None  # (n,) bool, None: every client present
    n_grads: int  # how many of the call's arrays are phase-1 answers (the rest: blocks)
    scores_pairs: bool  # the method's rows learn from pair scores (ScoresPairsInRows)


class StepAnswer(NamedTuple):
    """A resident host's answer to phase 2 (beside its new block of models)."""

    scores: np.ndarray  # of the sampled pairs this host reports (its own i ends)
    losses: np.ndarray  # its present clients' step losses
    phase1_s: float  # seconds of compute in phase 1
    phase2_s: float  # and in phase 2


class ResidentHostImpl(ClientHostImpl):
    """The body of a resident ClientHost actor: models X (k, d) and W rows (k, n) of its
    k clients, and phase 1's step gradients until phase 2 uses them."""

    def __init__(self, cfg_dict: dict[str, Any], clients: list[int], *args, **kwargs):
        super().__init__(cfg_dict, clients, *args, **kwargs)
        self.layout = host_layout(self.n_total, self.cfg.engine.clients_per_actor)
        self.ids = torch.tensor(clients, device=self.device)
        self.X: torch.Tensor | None = None  # None: restarted by Ray, not restored yet
        self.W: torch.Tensor | None = None
        # (members, G, L, stepped models or None) between the two phases
        self.pending_step: tuple | None = None
        self.phase1_s = 0.0

    def res_init(self, x0, W_rows) -> None:
        self.X = self._in(x0).expand(len(self.clients), -1).clone()
        self.W = self._in(W_rows)

    def res_load(self, block, W_rows) -> None:
        """Models (None: keep them) and W rows from the coordinator: a restart's restore,
        or W after clients joined or left."""
        if block is not None:
            self.X = self._in(block)
        self.W = self._in(W_rows)

    def _models(self) -> torch.Tensor:
        if self.X is None:
            raise HostStateLost(f"host of clients {self.clients} lost its models")
        return self.X

    def res_block(self):
        """This host's models, published once per round for the other hosts."""
        return self._models().cpu().numpy()

    def _rows_of(self, arrays, at) -> torch.Tensor:
        """Rows gathered from published arrays: ``at`` is (k, 2) of (array, row); one
        vectorised gather per source array."""
        at = np.asarray(at, dtype=np.int64).reshape(-1, 2)
        out = torch.empty(at.shape[0], self.ops.dim)
        for a in np.unique(at[:, 0]):
            sel = np.nonzero(at[:, 0] == a)[0]
            out[torch.from_numpy(sel)] = torch.from_numpy(np.asarray(arrays[a])[at[sel, 1]])
        return out.to(self.device)

    def res_grads(self, req: GradsRequest, hp: RowStep, *blocks):
        """Phase 1 of a resident round: this host's clients' gradients at the points
        ``hp.points(x_i, x_j)`` of their sampled pairs (x_j read from the partner host's
        published block among ``blocks``), each the mean of ``hp.batches`` minibatches,
        and at their own models (the step's, kept here for phase 2): one batched request,
        or, where the ops takes shared points (the MLP), the ends' as one gradient each.
        The models ``hp.published`` gives are published for the other hosts' phase 2. ->
        (pair gradients (k, d), this host's published models or None)"""
        self._wait(len(req.own) + len(req.members))
        t0 = time.perf_counter()
        X = self._models()
        own, members = self._in(req.own), self._in(req.members)
        salts = torch.as_tensor(np.asarray(req.salts), dtype=torch.int64).reshape(-1)
        mid = hp.points(X[own], self._rows_of(blocks, req.partners)) if own.numel() else X[:0]
        if own.numel() and pairs.shares_points(self.ops):
            # each end's minibatches as one gradient at one copy of its point, as the
            # local engine asks them; the members' step apart
            b = hp.batches
            Z = pairs.SharedPoints(((mid, b),), means=b)
            ends, salts = own.repeat_interleave(b), pairs.run_salts(salts, b)
            G_pairs, _ = self.ops.grads(ends, Z, req.round, rng.ALIGN, salts)
            G, L = self.ops.grads(members, X[members], req.round, rng.STEP, 0)
            k = 0
        else:
            batches = hp.batches if own.numel() else 1
            G_pairs, G, L, k = self._one_request(req.round, batches, X, own, mid, members, salts)
        Y = hp.published(X, members, G[k:])
        self.pending_step = (members, G[k:], L[k:], Y)
        self.phase1_s = time.perf_counter() - t0
        return G_pairs.cpu().numpy(), None if Y is None else Y.cpu().numpy()

    def _one_request(self, t, batches, X, own, mid, members, salts):
        """Phase 1's gradients as one request of plain rows, the pair ends' first (at
        ``mid``), each repeated per minibatch it averages. -> (pair gradients, G, L, pair
        rows in G)"""
        m = members.numel()
        own, mid, salts = pairs.end_rows(own, mid, salts, batches)
        k = own.numel()
        Z = torch.cat([mid, X[members]])
        streams = torch.cat([torch.full((k,), rng.ALIGN), torch.full((m,), rng.STEP)])
        salts = torch.cat([salts, torch.zeros(m, dtype=torch.int64)])
        G, L = self.ops.grads(torch.cat([own, members]), Z, t, streams, salts)
        return pairs.mean_of_batches(G[:k], batches), G, L, k

    def res_update(self, req: UpdateRequest, hp: RowStep, *parts):
        """Phase 2: for a method that scores pairs, the scores of the sampled pairs that
        touch this host (both gradients read from phase 1's published arrays) and its W
        rows' update (``hp.update_rows``, every round); then the step of its present
        clients against the published models of the hosts their rows read (x^t, or
        their phase-1 published models), as ``hp`` (the method's row step) computes it.
        parts: ``req.n_grads`` phase-1 answers, then (host, block) pairs (references Ray
        resolves only as top-level arguments). -> (:class:`StepAnswer`, the new block)"""
        if self.pending_step is None:  # restarted by Ray between the two phases
            raise HostStateLost(f"host of clients {self.clients} lost its phase-1 gradients")
        t0 = time.perf_counter()
        n_grads = req.n_grads
        grads = parts[:n_grads]
        block_hosts = parts[n_grads::2]
        blocks = parts[n_grads + 1 :: 2]
        edges = torch.as_tensor(np.asarray(req.edges), dtype=torch.int64).reshape(-1, 2)
        scores = torch.zeros(0, device=self.device)
        if edges.shape[0]:  # the pairs that touch this host, scored
            G_i, G_j = self._rows_of(grads, req.at_i), self._rows_of(grads, req.at_j)
            scores = pairs.alignment_scores(G_i, G_j, hp.score, hp.floor)
        if req.scores_pairs:  # the W rows' update, every round (with no pair too)
            self.W = hp.update_rows(self.W, self.ids, edges, scores)
        members, G, L, Y = self.pending_step
        if members.numel():  # Eq. (3) over the linked hosts' published models
            W_rows = self.W[members]
            if req.present is not None:  # absent clients neither read nor are read
                mask = torch.as_tensor(np.asarray(req.present, dtype=bool))
                W_rows = W_rows * mask.to(self.device, W_rows.dtype)
            all_members = members.numel() == len(self.clients)
            X_rows = self.X if all_members else self.X[members]
            Y_rows = None if Y is None else (Y if all_members else Y[members])
            linked = [
                (
                    torch.tensor(self.layout[h], device=self.device),
                    torch.as_tensor(block).to(self.device),
                )
                for h, block in zip(block_hosts, blocks, strict=True)
            ]
            new = hp.step(X_rows, G, Y_rows, W_rows, linked)
            if all_members:
                self.X = new
            else:
                self.X[members] = new
        self.pending_step = None
        report = torch.as_tensor(np.asarray(req.report, dtype=bool)).to(self.device)
        seconds = time.perf_counter() - t0
        out = StepAnswer(scores[report].cpu().numpy(), L.cpu().numpy(), self.phase1_s, seconds)
        return out, self.res_block()

    def res_evaluate(self, block):
        """Test metrics of the given models (a published block: the host may already be
        a round further)."""
        ev = self.ops.evaluate(torch.arange(len(self.clients)), self._in(block))
        acc = None if ev.accuracy is None else ev.accuracy.cpu().numpy()
        return ev.loss.cpu().numpy(), acc
