"""ClientOps over the host actors (used inside the coordinator): requests split by host,
sent in parallel through the object store, retried while Ray restarts a lost host."""

from __future__ import annotations

import time
from typing import Any

import torch

from raycobo import rng
from raycobo.algorithms import pairs
from raycobo.algorithms.base import Evaluation, Gradients, LocalSGD, Request, compute
from raycobo.algorithms.pairs import PairScores
from raycobo.engine.ray.errors import HostsLost, HostStateLost, actor_lost


class RayClientOps:
    """ClientOps whose clients live in ClientHost actors (used inside the Coordinator)."""

    def __init__(
        self,
        hosts: list[Any],
        layout: list[list[int]],
        timeout_s: float,
        retries: int,
        on_failure: str = "restart",
        parts: list | None = None,
    ):
        """``parts``: each host's data in the object store (None or empty: the hosts load
        their own), attached again to a host Ray restarted."""
        import ray

        self.ray = ray
        self.hosts = hosts
        self.layout = layout
        self.timeout_s = timeout_s
        self.retries = retries
        self.on_failure = on_failure
        self.parts = list(parts or [])
        self.dead: set[int] = set()  # hosts given up on (engine.on_failure=drop)
        self.events: list[dict[str, Any]] = []
        self.n_clients = sum(len(b) for b in layout)
        self.owner = torch.empty(self.n_clients, dtype=torch.int64)
        self.local = torch.empty(self.n_clients, dtype=torch.int64)
        for h, block in enumerate(layout):
            self.owner[block] = h
            self.local[block] = torch.arange(len(block))
        infos = self.get([h.info.remote() for h in hosts])
        self.dim = infos[0]["dim"]
        self._sizes = torch.cat([i["sizes"] for i in infos])
        self._layout = [tuple(b) for b in infos[0]["layout"]]
        self.clusters = [c for i in infos for c in i["clusters"]]
        self.host_devices = [i["device"] for i in infos]
        self.host_gpu_ids = [i["gpu_ids"] for i in infos]
        self.host_nodes = [i["node"] for i in infos]
        self.device = torch.device("cpu")
        self.coordination_s = 0.0
        self.wait_s = 0.0
        self.critical_compute_s = 0.0  # per call, the slowest host's compute, summed

    # -- plumbing ----------------------------------------------------------------------
    def get(self, refs):
        """``ray.get`` bounded by ``engine.timeout_s``."""
        return self.ray.get(refs, timeout=self.timeout_s)

    def _call(self, method: str, per_host: dict[int, tuple]) -> dict[int, Any]:
        """Call ``method`` on several hosts in parallel; retry hosts that died (Ray
        restarts them from their config, so they answer identically)."""
        pending = dict(per_host)
        out: dict[int, Any] = {}
        for attempt in range(self.retries + 1):
            t0 = time.perf_counter()
            refs = {h: getattr(self.hosts[h], method).remote(*args) for h, args in pending.items()}
            self.coordination_s += time.perf_counter() - t0
            failed = {}
            for h, ref in refs.items():
                t1 = time.perf_counter()
                try:
                    out[h] = self.get(ref)
                except (*actor_lost(), HostStateLost) as err:  # dead, or restarted bare
                    failed[h] = pending[h]
                    self.events.append(
                        {
                            "event": "host_failed",
                            "host": h,
                            "attempt": attempt,
                            "error": type(err).__name__,
                        }
                    )
                self.wait_s += time.perf_counter() - t1
            if not failed:
                self.critical_compute_s += max((sec for _, sec in out.values()), default=0.0)
                return {h: res for h, (res, _) in out.items()}
            if self.on_failure == "drop":
                self.give_up(failed)
                raise HostsLost(sorted(c for h in failed for c in self.layout[h]))
            pending = failed
            self.await_restart(list(failed))
        raise RuntimeError(f"client hosts {sorted(pending)} failed {self.retries + 1} times")

    RESTART_WAIT_S = 120.0  # Ray notices a lost node after ~15 s, then places the actor

    def await_restart(self, hosts: list[int]) -> None:
        """Wait until Ray has restarted ``hosts``: a lost node is noticed by Ray's health
        checks only after some seconds, then the actor is placed elsewhere and loads its
        data again, or is given it (:meth:`reattach`). Bounded by min(engine.timeout_s,
        RESTART_WAIT_S); a host that does not answer by then (restarts used up, no room
        left) stops the run."""
        from ray.exceptions import GetTimeoutError

        bound = min(self.timeout_s, self.RESTART_WAIT_S)
        deadline = time.monotonic() + bound
        for h in hosts:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        f"client host {h} (clients {self.layout[h][0]}..{self.layout[h][-1]}) "
                        f"was not restarted within {bound:g} s (engine.max_restarts, "
                        "engine.timeout_s, room on the live nodes)"
                    )
                try:
                    self.reattach([h], timeout=min(left, 10.0))
                    break
                except (*actor_lost(), GetTimeoutError):
                    time.sleep(0.5)

    def reattach(self, hosts: list[int], timeout: float | None = None) -> None:
        """Give the hosts among ``hosts`` that Ray restarted their data again (when the
        driver sent it; a host that loads its own did so in its constructor)."""
        bound = self.timeout_s if timeout is None else timeout
        needs = self.ray.get([self.hosts[h].needs_data.remote() for h in hosts], timeout=bound)
        again = [
            self.hosts[h].attach.remote(self.parts[h])
            for h, n in zip(hosts, needs, strict=True)
            if n
        ]
        self.ray.get(again, timeout=bound)

    def _split(self, clients: torch.Tensor, *arrays: torch.Tensor):
        clients = clients.cpu()
        owners = self.owner[clients]
        parts = {}
        for h in torch.unique(owners).tolist():
            mask = owners == h
            parts[h] = (
                mask,
                self.local[clients[mask]],
                *(a[mask.to(a.device)].cpu() for a in arrays),
            )
        return parts

    def give_up(self, hosts) -> None:
        """engine.on_failure=drop: these hosts are not called again."""
        self.dead |= set(hosts)

    def count_time(self, coordination_s: float = 0.0, compute_s: float = 0.0) -> None:
        """Time a round policy spent outside ``_call``: in the coordinator submitting
        calls, and computing on the slowest host (for the engine report)."""
        self.coordination_s += coordination_s
        self.critical_compute_s += compute_s

    # -- ClientOps -----------------------------------------------------------------------
    def live_hosts(self) -> list[int]:
        """The hosts not given up on (engine.on_failure=drop)."""
        return [h for h in range(len(self.hosts)) if h not in self.dead]

    def _any_host(self) -> int:
        return self.live_hosts()[0]

    def initial_params(self) -> torch.Tensor:
        h = self._any_host()
        return self._call("initial_params", {h: ()})[h]

    def random_params(self, salt: int) -> torch.Tensor:
        h = self._any_host()
        return self._call("random_params", {h: (salt,)})[h]

    def data_sizes(self) -> torch.Tensor:
        return self._sizes

    def param_layout(self) -> list[tuple[int, int, int]]:
        return self._layout

    def grads(self, clients, Z, round, stream, salt=0):
        return self._answer(Gradients(clients, Z, stream, salt), round)

    def local_sgd(self, request: LocalSGD, round: int):
        """All the steps of a ``LocalSGD`` request in the hosts: one call per host."""
        return self._answer(request, round)

    def _answer(self, request: Request, t: int):
        method, parts, args = self._per_host(request, t)
        res = self._call(method, args)
        return self.gather_grads(request.clients.numel(), _dtype(request), parts, res)

    def gather_grads(self, m: int, dtype, parts: dict, res: dict):
        """Per-host (G, losses) answers back into request order. -> (G (m, d), L (m,))"""
        G = torch.empty(m, self.dim, dtype=dtype)
        L = torch.empty(m, dtype=dtype)
        for h, (mask, *_rest) in parts.items():
            G[mask] = torch.from_numpy(res[h][0])
            L[mask] = torch.from_numpy(res[h][1])
        return G, L

    def _per_host(self, request: Request, t: int) -> tuple[str, dict, dict]:
        """A request split by host: (host method, {host: (mask, ...)}, {host: args})."""
        r = request
        m = r.clients.numel()
        if isinstance(r, Gradients):
            parts = self._split(
                r.clients, r.points, rng.per_row(r.salt, m), rng.per_row(r.stream, m)
            )
            args = {h: (loc, z, t, st, s) for h, (_, loc, z, s, st) in parts.items()}
            return "grads", parts, args
        rows = r.anchor is not None and r.anchor.dim() == 2  # one anchor per client
        parts = self._split(r.clients, r.start, *((r.anchor,) if rows else ()))
        args = {}
        for h, (_, loc, start, *anchor) in parts.items():
            ref = anchor[0] if rows else (None if r.anchor is None else r.anchor.cpu())
            args[h] = (loc, start, ref, r.lr, r.steps, t, r.stream, r.prox)
        return "local_sgd", parts, args

    def submit(self, request: Request, t: int) -> InFlight | Scored:
        """Dispatch a request of round t and return at once (``engine.rounds: stale``);
        pair scores as their gradient rows, reduced here when they arrive."""
        if isinstance(request, PairScores):
            clients, Z, salts = pairs.rows_of(request)
            return Scored(self.submit(Gradients(clients, Z, rng.ALIGN, salts), t), request)
        method, parts, args = self._per_host(request, t)
        refs = {h: getattr(self.hosts[h], method).remote(*a) for h, a in args.items()}
        return InFlight(self, request, t, parts, refs)

    def losses(self, clients, Z, round, stream, salt=0):
        m = clients.numel()
        parts = self._split(clients, Z, rng.per_row(salt, m), rng.per_row(stream, m))
        res = self._call(
            "losses", {h: (loc, z, round, st, s) for h, (_, loc, z, s, st) in parts.items()}
        )
        L = torch.empty(m, dtype=Z.dtype)
        for h, (mask, *_rest) in parts.items():
            L[mask] = torch.from_numpy(res[h])
        return L

    def _live(self, parts: dict) -> dict:
        """Evaluations skip the hosts that were dropped (their clients read NaN)."""
        return {h: p for h, p in parts.items() if h not in self.dead}

    def evaluate(self, clients, Z) -> Evaluation:
        m = clients.numel()
        parts = self._live(self._split(clients, Z))
        res = self._call("evaluate", {h: (loc, z) for h, (_, loc, z) in parts.items()})
        return gather_evaluation(m, parts, res)

    def evaluate_mixture(self, clients, Z, weights) -> Evaluation:
        m = clients.numel()
        parts = self._live(self._split(clients, Z, weights))
        res = self._call(
            "evaluate_mixture", {h: (loc, z, w) for h, (_, loc, z, w) in parts.items()}
        )
        return gather_evaluation(m, parts, res)


def gather_evaluation(m: int, parts: dict, answers: dict) -> Evaluation:
    """Per-host (loss, accuracy) answers back into request order: ``parts[h][0]`` is the
    mask of host h's rows; rows of hosts that gave no answer read NaN."""
    loss = torch.full((m,), float("nan"))
    acc = torch.full((m,), float("nan"))
    has_acc = True
    for h, (mask, *_rest) in parts.items():
        loss[mask] = torch.from_numpy(answers[h][0])
        if answers[h][1] is None:
            has_acc = False
        else:
            acc[mask] = torch.from_numpy(answers[h][1])
    return Evaluation(loss=loss, accuracy=acc if has_acc else None)


class InFlight:
    """A request in flight: ``ready()`` without blocking, ``result()`` blocks. A host that
    died meanwhile is retried through the synchronous path."""

    def __init__(self, ops: RayClientOps, request: Request, t: int, parts: dict, refs: dict):
        self.ops, self.request, self.t, self.parts, self.refs = ops, request, t, parts, refs

    def ready(self) -> bool:
        done, _ = self.ops.ray.wait(list(self.refs.values()), num_returns=len(self.refs), timeout=0)
        return len(done) == len(self.refs)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        from ray.exceptions import RayActorError

        try:
            got = {h: self.ops.get(ref) for h, ref in self.refs.items()}
        except RayActorError:
            return compute(self.ops, self.request, self.t)
        res = {h: answer for h, (answer, _) in got.items()}
        # the slowest host's compute, for the coordination share (as a waited call's)
        self.ops.count_time(compute_s=max(sec for _, sec in got.values()))
        m = self.request.clients.numel()
        return self.ops.gather_grads(m, _dtype(self.request), self.parts, res)


class Scored:
    """Pair scores in flight: their gradient rows' ``InFlight``, reduced on arrival."""

    def __init__(self, rows: InFlight, request: PairScores):
        self.rows, self.request = rows, request

    def ready(self) -> bool:
        return self.rows.ready()

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        G, L = self.rows.result()
        return pairs.scores_from(self.request, G), L[:0]


def _dtype(request: Request) -> torch.dtype:
    return request.points.dtype if isinstance(request, Gradients) else request.start.dtype
