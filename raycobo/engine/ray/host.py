"""The client-host actor: the data of some clients, answering the engine primitive with
the local engine's own code (on CUDA when Ray gave it a GPU). It keeps no algorithm
state: every call brings the points it computes at (``ResidentHostImpl`` in
``resident_host.py`` extends it with host-resident models)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from raycobo.algorithms.base import LocalSGD, sgd_steps
from raycobo.engine.ray.errors import HostStateLost


class ClientHostImpl:
    """The body of the ClientHost actor (plain class, so it can be tested in-process)."""

    def __init__(
        self,
        cfg_dict: dict[str, Any],
        clients: list[int],
        slow_s: float = 0.0,
        n_total: int | None = None,
        from_driver: bool = False,
    ):
        """``from_driver``: this host's clients' data comes from the driver through the
        object store, by :meth:`attach` (called again by the coordinator after Ray
        restarted the host: a reference among the constructor's arguments would be
        Ray's to keep for restarts, which it warns about); otherwise the host loads the
        data set from the config and keeps its clients' part (the same,
        deterministically, after a restart too)."""
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
        self.cfg = cfg
        self.n_total = n_total
        self._ops = None
        if not from_driver:
            data = load_data(cfg)  # rebuilt from the config: deterministic
            self.n_total = data.n_clients
            self.attach(data.subset(clients))
            del data

    def attach(self, subset) -> None:
        """This host's clients' data (a FederatedData subset)."""
        from raycobo.engine import make_local_ops

        self._ops = make_local_ops(self.cfg, subset, self.device, torch.tensor(self.clients))

    @property
    def ops(self):
        if self._ops is None:
            raise HostStateLost(
                f"host of clients {self.clients[0]}..{self.clients[-1]} was restarted and "
                "has not had its data again"
            )
        return self._ops

    def needs_data(self) -> bool:
        return self._ops is None

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

    def local_sgd(self, local, start, anchor, lr, steps, round, stream, prox):
        """A ``LocalSGD`` request's steps for this host's clients, all here (one call);
        ``anchor`` None: the start."""
        self._wait(len(local) * steps)

        def go():
            ref = None if anchor is None else self._in(anchor)
            req = LocalSGD(self._in(local), self._in(start), lr, steps, stream, prox, ref)
            Y, L = sgd_steps(self.ops, req, round)
            return Y.cpu().numpy(), L.cpu().numpy()

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
