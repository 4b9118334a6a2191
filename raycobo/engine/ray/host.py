"""The client-host actor: the data of some clients, answering the engine primitive with
the local engine's own code (on CUDA when Ray gave it a GPU), and, with
``engine.resident``, keeping its clients' models and W rows."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from raycobo import rng
from raycobo.engine.ray.errors import HostStateLost
from raycobo.engine.ray.layout import host_layout


class ClientHostImpl:
    """The body of the ClientHost actor (plain class, so it can be tested in-process)."""

    def __init__(
        self,
        cfg_dict: dict[str, Any],
        clients: list[int],
        slow_s: float = 0.0,
        n_total: int | None = None,
        subset=None,
    ):
        """``subset``: this host's clients' data, put in the object store once by the
        driver (Ray keeps it for restarts); without it the host loads the data set from
        the config and keeps its clients' part (the same, deterministically)."""
        from raycobo.config import validate
        from raycobo.data import load_data

        cfg = validate(cfg_dict)
        self.clients = clients
        self.slow_s = slow_s
        self.device = "cpu"
        self.gpu_ids: list = []
        self.node_id: str | None = None
        try:
            import ray

            if ray.is_initialized():
                self.gpu_ids = list(ray.get_gpu_ids())
                self.node_id = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - outside an actor
            pass
        if self.gpu_ids and torch.cuda.is_available():
            self.device = "cuda"  # Ray sets CUDA_VISIBLE_DEVICES to the assigned GPU
        # Ray starts workers with OMP_NUM_THREADS=1: a host computes with engine.threads,
        # else with the CPUs it reserved (engine.cpus_per_actor, at least one)
        torch.set_num_threads(cfg.engine.threads or max(1, int(cfg.engine.cpus_per_actor)))
        from raycobo.engine import make_local_ops

        if subset is None:
            data = load_data(cfg)  # rebuilt from the config: deterministic
            n_total, subset = data.n_clients, data.subset(clients)
            del data
        self.ops = make_local_ops(cfg, subset, self.device, torch.tensor(clients))
        self.layout = host_layout(n_total, cfg.engine.clients_per_actor)
        self.ids = torch.tensor(clients, device=self.device)

    # -- host-resident CoBo (engine.resident): the host keeps its clients' models and
    # their W rows; a round is two calls, res_grads then res_update --------------------
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
        if not hasattr(self, "X"):  # restarted by Ray and not restored yet
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

    def res_grads(self, round, own, partners, salts, members, *blocks):
        """Phase 1 of a resident round: this host's clients' gradients at the midpoints
        z_ij = (x_i + x_j) / 2 of their sampled pairs (x_j read from the partner host's
        published block) and at their own models (the model step's, kept here for
        phase 2). One batched request. -> alignment gradients (k, d)"""
        self._wait(len(own) + len(members))
        t0 = time.perf_counter()
        X = self._models()
        own, members = self._in(own), self._in(members)
        k, m = own.numel(), members.numel()
        Z = torch.cat([0.5 * (X[own] + self._rows_of(blocks, partners)), X[members]])
        streams = torch.cat([torch.full((k,), rng.ALIGN), torch.full((m,), rng.STEP)])
        salts = torch.cat(
            [
                torch.as_tensor(np.asarray(salts), dtype=torch.int64).reshape(-1),
                torch.zeros(m, dtype=torch.int64),
            ]
        )
        G, L = self.ops.grads(torch.cat([own, members]), Z, round, streams, salts)
        self._step = (members, G[k:], L[k:])
        self._p1_s = time.perf_counter() - t0
        return G[:k].cpu().numpy()

    def res_update(self, edges, at_i, at_j, report, present, hyper, n_grads, *parts):
        """Phase 2: the scores <g_i(z_ij), g_j(z_ij)> of the sampled pairs that touch this
        host (both gradients read from phase 1's published arrays), Eq. (1) on this
        host's W rows, then Eq. (3) for its present clients against the published models
        of the hosts they collaborate with. parts: ``n_grads`` phase-1 answers, then
        (host, block) pairs. -> ((scores of the reported pairs, step losses, phase-1 and
        phase-2 seconds of compute), the new block)."""
        from raycobo.algorithms.cobo import (
            alignment_scores,
            penalized_rows_blocks,
            update_weight_rows,
        )

        if not hasattr(self, "_step"):  # restarted by Ray between the two phases
            raise HostStateLost(f"host of clients {self.clients} lost its phase-1 gradients")
        lr, rho, gamma, domain = hyper
        t0 = time.perf_counter()
        grads = parts[:n_grads]
        block_hosts = parts[n_grads::2]
        blocks = parts[n_grads + 1 :: 2]
        edges = torch.as_tensor(np.asarray(edges), dtype=torch.int64).reshape(-1, 2)
        scores = torch.zeros(0, device=self.device)
        if edges.shape[0]:  # Eq. (1) on this host's W rows
            scores = alignment_scores(self._rows_of(grads, at_i), self._rows_of(grads, at_j))
            self.W = update_weight_rows(self.W, self.ids, edges, scores, gamma, domain)
        members, G, L = self._step
        if members.numel():  # Eq. (3) over the linked hosts' published models
            W_rows = self.W[members]
            if present is not None:  # absent clients neither pull nor are pulled
                mask = torch.as_tensor(np.asarray(present, dtype=bool))
                W_rows = W_rows * mask.to(self.device, W_rows.dtype)
            all_members = members.numel() == len(self.clients)
            X_rows = self.X if all_members else self.X[members]
            linked = [
                (
                    torch.tensor(self.layout[h], device=self.device),
                    torch.as_tensor(block).to(self.device),
                )
                for h, block in zip(block_hosts, blocks, strict=True)
            ]
            new = penalized_rows_blocks(X_rows, G, W_rows, linked, lr, rho)
            if all_members:
                self.X = new
            else:
                self.X[members] = new
        del self._step
        report = torch.as_tensor(np.asarray(report, dtype=bool)).to(self.device)
        out = (scores[report].cpu().numpy(), L.cpu().numpy(), self._p1_s, time.perf_counter() - t0)
        return out, self.res_block()

    def res_evaluate(self, block):
        """Test metrics of the given models (a published block: the host may already be
        a round further)."""
        ev = self.ops.evaluate(torch.arange(len(self.clients)), self._in(block))
        acc = None if ev.accuracy is None else ev.accuracy.cpu().numpy()
        return ev.loss.cpu().numpy(), acc

    def info(self) -> dict[str, Any]:
        return {
            "dim": self.ops.dim,
            "sizes": self.ops.data_sizes().cpu(),
            "layout": self.ops.param_layout(),
            "clusters": list(self.ops.clusters),
            "device": self.device,
            "gpu_ids": self.gpu_ids,
            "pid": os.getpid(),
            "node": self.node_id,
        }

    def initial_params(self) -> tuple[torch.Tensor, float]:
        return self.ops.initial_params().cpu(), 0.0

    def random_params(self, salt: int) -> tuple[torch.Tensor, float]:
        return self.ops.random_params(salt).cpu(), 0.0

    def _wait(self, rows: int = 1) -> None:
        """Injected straggling: ``engine.slow_seconds`` per gradient/loss row."""
        if self.slow_s:
            time.sleep(self.slow_s * rows)

    def _timed(self, fn, *args):
        """Run fn and return (result, seconds of host compute) for the coordinator's
        compute-versus-coordination accounting."""
        t0 = time.perf_counter()
        out = fn(*args)
        return out, time.perf_counter() - t0

    def _in(self, a) -> torch.Tensor:
        # arrays arrive read-only from the object store; numpy moves faster than pickled tensors
        return torch.as_tensor(np.array(a, copy=True)).to(self.device)

    def grads(self, local, Z, round, stream, salt):
        self._wait(len(local))

        def go():
            G, L = self.ops.grads(
                self._in(local), self._in(Z), round, self._in(stream), self._in(salt)
            )
            return G.cpu().numpy(), L.cpu().numpy()

        return self._timed(go)

    def losses(self, local, Z, round, stream, salt):
        self._wait()
        return self._timed(
            lambda: (
                self.ops.losses(
                    self._in(local), self._in(Z), round, self._in(stream), self._in(salt)
                )
                .cpu()
                .numpy()
            )
        )

    def evaluate_mixture(self, local, Z, weights):
        def go():
            ev = self.ops.evaluate_mixture(self._in(local), self._in(Z), self._in(weights))
            acc = ev.accuracy.cpu().numpy() if ev.accuracy is not None else None
            return ev.loss.cpu().numpy(), acc

        return self._timed(go)

    def evaluate(self, local, Z):
        def go():
            ev = self.ops.evaluate(self._in(local), self._in(Z))
            acc = ev.accuracy.cpu().numpy() if ev.accuracy is not None else None
            return ev.loss.cpu().numpy(), acc

        return self._timed(go)
