"""The Ray engine: client hosts as actors pinned to GPU fractions, and a coordinator actor.

- ``ClientHost`` (actor) holds the data of ``engine.clients_per_actor`` clients and
  answers the engine primitive -- gradients/losses of its clients at given points, and
  test metrics -- with the same batched code as the local engine, on CUDA when Ray
  assigned it a GPU. It requests ``gpus_per_client * clients`` GPUs and
  ``cpus_per_actor`` CPUs. Its data is rebuilt deterministically from the config, so a
  restarted host (Ray's ``max_restarts``) serves the same batches as before.
- ``Coordinator`` (actor) owns the algorithm state (models, W), the edge sampler and the
  round counter. Each round it runs the algorithm, which asks for the alignment
  gradients of the sampled edges and the model-step gradients; the coordinator sends
  each host only the points of its own clients through the object store, in parallel.
  The driver receives round statistics, evaluations and W -- never a model.
- ``engine.resident`` (CoBo): the hosts keep their clients' models and W rows; a round
  is two calls per host (``res_grads``, ``res_update``) that read each other's
  gradients and published models through the object store, and rounds are pipelined
  one ahead. The coordinator sends indices and keeps a copy of W from the scores.

Minibatches and noise are hashes of (seed, round, global client id, stream, salt), so
the same config gives the same numbers as the local engine.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raycobo import rng
from raycobo.algorithms.base import Evaluation
from raycobo.config import Config, with_overrides


def start_ray(cfg: Config) -> None:
    """Connect to ``engine.address``, or start a local Ray bound to 127.0.0.1 with no
    dashboard (Ray >= 2.5x otherwise picks the network interface's address)."""
    if cfg.engine.address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    if cfg.engine.address is not None:
        ray.init(address=cfg.engine.address, log_to_driver=False)
        return
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # loopback node address
    ray.init(
        # always a new instance of our own, even where `ray start` left a cluster's address
        # behind (/tmp/ray/ray_current_cluster): engine.address joins clusters
        address="local",
        include_dashboard=cfg.engine.dashboard,
        num_cpus=cfg.engine.num_cpus,
        num_gpus=cfg.engine.num_gpus,
        log_to_driver=False,
        configure_logging=True,
        logging_level="warning",
    )


def host_layout(n: int, per_actor: int) -> list[list[int]]:
    """Contiguous blocks of client ids, one per host."""
    return [list(range(a, min(n, a + per_actor))) for a in range(0, n, per_actor)]


@dataclass(frozen=True)
class HostPlan:
    """How the clients are spread over host actors, and what each host asks Ray for."""

    clients_per_actor: int
    cpus_per_actor: float
    hosts: int
    gpus_per_client: float

    def asks(self) -> str:
        gpu = self.gpus_per_client * self.clients_per_actor
        return f"{self.hosts} hosts x {{CPU: {self.cpus_per_actor:g}, GPU: {gpu:g}}}"


def _layout_keys(e) -> str:
    return (
        f"engine.clients_per_actor={e.clients_per_actor}, "
        f"engine.cpus_per_actor={e.cpus_per_actor}, engine.gpus_per_client={e.gpus_per_client}"
    )


def plan_hosts(
    e, n: int, total: dict[str, float], node_max: dict[str, float], fixed: bool = True
) -> HostPlan:
    """Resolve ``auto`` and check the layout against the Ray instance's resources (total
    and on its largest node). ``fixed``: a local instance, which gets no new nodes, so a
    layout that cannot be placed is refused now instead of waited for.

    auto: about one host per CPU (at most one per client), the CPUs shared out evenly;
    with explicit ``clients_per_actor`` the CPUs are shared among its hosts (a fraction
    each when there are more hosts than CPUs)."""
    from raycobo.config import ConfigError

    cpus, gpus = float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0))
    k = e.clients_per_actor
    c = e.cpus_per_actor
    if k == "auto":
        if c == "auto" or c == 0:
            hosts = min(n, max(1, int(cpus)))
        else:
            hosts = min(n, max(1, int(cpus // c))) if fixed else n
        k = math.ceil(n / hosts)
    hosts = math.ceil(n / k)
    if c == "auto":
        c = float(cpus // hosts) if cpus >= hosts else round(cpus / hosts, 4)
        c = max(c, 0.0)
    plan = HostPlan(int(k), float(c), hosts, e.gpus_per_client)
    if not fixed:
        return plan
    gpu_host = e.gpus_per_client * plan.clients_per_actor
    need_cpu, need_gpu = plan.hosts * plan.cpus_per_actor, e.gpus_per_client * n
    short = None
    if gpu_host > 0 and gpus == 0:
        short = "GPUs, and this Ray instance has none (engine.num_gpus declares them)"
    elif need_gpu > gpus + 1e-9 or gpu_host > node_max.get("GPU", 0.0) + 1e-9:
        short = f"{need_gpu:g} GPUs ({gpu_host:g} per host); this Ray instance has {gpus:g}"
    elif need_cpu > cpus + 1e-9 or plan.cpus_per_actor > node_max.get("CPU", 0.0) + 1e-9:
        short = f"{need_cpu:g} CPUs; this Ray instance has {cpus:g}"
    if short is not None:
        raise ConfigError(
            f"invalid config key 'engine': {_layout_keys(e)} ask for {plan.asks()} = {short}"
            " (leave clients_per_actor/cpus_per_actor at auto, or change them)"
        )
    return plan


def instance_resources() -> tuple[dict[str, float], dict[str, float]]:
    """(total, largest node) resources of the Ray instance this process is connected to."""
    import ray

    total = {k: float(v) for k, v in ray.cluster_resources().items()}
    node_max: dict[str, float] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            for k, v in node.get("Resources", {}).items():
                node_max[k] = max(node_max.get(k, 0.0), float(v))
    return total, node_max


def wait_for_hosts(refs: list, plan: HostPlan, e, echo=None, every_s: float = 10.0) -> list:
    """Wait for every host's first answer (placed, data loaded), saying what is still
    pending every ``every_s`` seconds; after ``engine.timeout_s`` stop with one line."""
    import sys

    import ray

    echo = echo or (lambda msg: print(msg, file=sys.stderr))
    start = time.monotonic()
    pending = list(refs)
    while pending:
        left = e.timeout_s - (time.monotonic() - start)
        if left <= 0:
            from raycobo.config import ConfigError

            avail = {
                k: round(v, 3) for k, v in ray.available_resources().items() if k in ("CPU", "GPU")
            }
            raise ConfigError(
                f"invalid config key 'engine': {len(pending)} of {plan.hosts} hosts not started "
                f"within engine.timeout_s={e.timeout_s:g} s; {_layout_keys(e)} ask for "
                f"{plan.asks()}, the cluster has {avail} available"
            )
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(every_s, left))
        if pending:
            avail = {
                k: round(v, 3) for k, v in ray.available_resources().items() if k in ("CPU", "GPU")
            }
            echo(
                f"raycobo: waiting for {len(pending)} of {plan.hosts} client hosts to start "
                f"({plan.asks()}; available {avail}; "
                f"{time.monotonic() - start:.0f} s of engine.timeout_s={e.timeout_s:g})"
            )
    return ray.get(refs)


def _addresses(sources: list[int], hosts: torch.Tensor, rows: torch.Tensor) -> np.ndarray:
    """(k, 2) rows as (position of the host in ``sources``, row in that host's array):
    how a host finds rows among the arrays passed to it."""
    slot = torch.full((max(sources, default=0) + 1,), -1, dtype=torch.int64)
    slot[torch.tensor(sources, dtype=torch.int64)] = torch.arange(len(sources))
    return torch.stack([slot[hosts], rows], dim=1).numpy()


def _actor_lost() -> tuple[type[Exception], ...]:
    """Ray's errors for an actor that died or cannot be reached."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return (RayActorError, ActorDiedError, ActorUnavailableError)


class HostStateLost(RuntimeError):
    """A restarted host was asked for models it no longer holds (engine.resident)."""


class ClientHostImpl:
    """The body of the ClientHost actor (plain class, so it can be tested in-process)."""

    def __init__(self, cfg_dict: dict[str, Any], clients: list[int], slow_s: float = 0.0):
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

        data = load_data(cfg)  # rebuilt from the config: a restarted host serves the same
        self.ops = make_local_ops(cfg, data.subset(clients), self.device, torch.tensor(clients))
        self.layout = host_layout(data.n_clients, cfg.engine.clients_per_actor)
        self.ids = torch.tensor(clients, device=self.device)
        del data

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
        from raycobo.algorithms.cobo import update_weight_rows

        if not hasattr(self, "_step"):  # restarted by Ray between the two phases
            raise HostStateLost(f"host of clients {self.clients} lost its phase-1 gradients")
        lr, rho, gamma, domain = hyper
        t0 = time.perf_counter()
        grads = parts[:n_grads]
        block_hosts = parts[n_grads::2]
        blocks = parts[n_grads + 1 :: 2]
        edges = torch.as_tensor(np.asarray(edges), dtype=torch.int64).reshape(-1, 2)
        scores = torch.zeros(0, device=self.device)
        if edges.shape[0]:
            scores = torch.linalg.vecdot(self._rows_of(grads, at_i), self._rows_of(grads, at_j))
            self.W = update_weight_rows(self.W, self.ids, edges, scores, gamma, domain)
        members, G, L = self._step
        if members.numel():
            # Eq. (3) block by block: x_i (1 - lr rho sum_k w_ik) + lr rho sum_k w_ik x_k
            # - lr g_i, summed over the linked hosts' published models (no concatenation)
            W_rows = self.W[members]
            if present is not None:  # absent clients neither pull nor are pulled
                mask = torch.as_tensor(np.asarray(present, dtype=bool))
                W_rows = W_rows * mask.to(self.device, W_rows.dtype)
            all_members = members.numel() == len(self.clients)
            X_rows = self.X if all_members else self.X[members]
            keep = 1.0 - lr * rho * W_rows.sum(dim=1, keepdim=True)
            new = X_rows * keep
            for h, block in zip(block_hosts, blocks, strict=True):
                cols = torch.tensor(self.layout[h], device=self.device)
                Xb = torch.as_tensor(block).to(self.device)
                new.addmm_(W_rows[:, cols].to(Xb.dtype), Xb, alpha=lr * rho)
            new.add_(G, alpha=-lr)
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


class RayClientOps:
    """ClientOps whose clients live in ClientHost actors (used inside the Coordinator)."""

    def __init__(
        self,
        hosts: list[Any],
        layout: list[list[int]],
        timeout_s: float,
        retries: int,
        on_failure: str = "restart",
    ):
        import ray

        self.ray = ray
        self.hosts = hosts
        self.layout = layout
        self.timeout_s = timeout_s
        self.retries = retries
        self.on_failure = on_failure
        self.dead: set[int] = set()  # hosts given up on (engine.on_failure=drop)
        self.events: list[dict[str, Any]] = []
        self.n_clients = sum(len(b) for b in layout)
        self.owner = torch.empty(self.n_clients, dtype=torch.int64)
        self.local = torch.empty(self.n_clients, dtype=torch.int64)
        for h, block in enumerate(layout):
            self.owner[block] = h
            self.local[block] = torch.arange(len(block))
        infos = self._get([h.info.remote() for h in hosts])
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
    def _get(self, refs):
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
                    out[h] = self._get(ref)
                except _actor_lost() as err:
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
                self.dead |= set(failed)
                raise HostsLost(sorted(c for h in failed for c in self.layout[h]))
            pending = failed
            self.await_restart(list(failed))
        raise RuntimeError(f"client hosts {sorted(pending)} failed {self.retries + 1} times")

    RESTART_WAIT_S = 120.0  # Ray notices a lost node after ~15 s, then places the actor

    def await_restart(self, hosts: list[int]) -> None:
        """Wait until Ray has restarted ``hosts``: a lost node is noticed by Ray's health
        checks only after some seconds, then the actor is placed elsewhere and loads its
        data again. Bounded by min(engine.timeout_s, RESTART_WAIT_S); a host that does
        not answer by then (restarts used up, no room left) stops the run."""
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
                    self.ray.get(self.hosts[h].info.remote(), timeout=min(left, 10.0))
                    break
                except (*_actor_lost(), GetTimeoutError):
                    time.sleep(0.5)

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
        m = clients.numel()
        parts = self._split(clients, Z, rng.per_row(salt, m), rng.per_row(stream, m))
        res = self._call(
            "grads", {h: (loc, z, round, st, s) for h, (_, loc, z, s, st) in parts.items()}
        )
        return self._gather_grads(m, Z.dtype, parts, res)

    def _gather_grads(self, m: int, dtype, parts: dict, res: dict):
        """Per-host (G, losses) answers back into request order. -> (G (m, d), L (m,))"""
        G = torch.empty(m, self.dim, dtype=dtype)
        L = torch.empty(m, dtype=dtype)
        for h, (mask, *_rest) in parts.items():
            G[mask] = torch.from_numpy(res[h][0])
            L[mask] = torch.from_numpy(res[h][1])
        return G, L

    def grads_async(self, clients, Z, round, stream, salt=0) -> AsyncGrads:
        """Dispatch a gradient request and return at once (bounded-staleness rounds)."""
        m = clients.numel()
        parts = self._split(clients, Z, rng.per_row(salt, m), rng.per_row(stream, m))
        refs = {
            h: self.hosts[h].grads.remote(loc, z, round, st, s)
            for h, (_, loc, z, s, st) in parts.items()
        }
        return AsyncGrads(self, (clients, Z, round, stream, salt), parts, refs, Z.dtype)

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
        return self._gather_eval(m, parts, res)

    def evaluate_mixture(self, clients, Z, weights) -> Evaluation:
        m = clients.numel()
        parts = self._live(self._split(clients, Z, weights))
        res = self._call(
            "evaluate_mixture", {h: (loc, z, w) for h, (_, loc, z, w) in parts.items()}
        )
        return self._gather_eval(m, parts, res)

    @staticmethod
    def _gather_eval(m: int, parts, res) -> Evaluation:
        loss = torch.full((m,), float("nan"))
        acc = torch.full((m,), float("nan"))
        has_acc = True
        for h, (mask, *_rest) in parts.items():
            loss[mask] = torch.from_numpy(res[h][0])
            if res[h][1] is None:
                has_acc = False
            else:
                acc[mask] = torch.from_numpy(res[h][1])
        return Evaluation(loss=loss, accuracy=acc if has_acc else None)


class AsyncGrads:
    """A gradient request in flight: ``ready()`` without blocking, ``result()`` blocks.
    A host that died meanwhile is retried through the synchronous path."""

    def __init__(self, ops: RayClientOps, request: tuple, parts: dict, refs: dict, dtype):
        self.ops, self.request, self.parts, self.refs, self.dtype = ops, request, parts, refs, dtype

    def ready(self) -> bool:
        done, _ = self.ops.ray.wait(list(self.refs.values()), num_returns=len(self.refs), timeout=0)
        return len(done) == len(self.refs)

    def result(self) -> torch.Tensor:
        from ray.exceptions import RayActorError

        try:
            res = {h: self.ops._get(ref)[0] for h, ref in self.refs.items()}  # drop timing
        except RayActorError:
            return self.ops.grads(*self.request)[0]
        return self.ops._gather_grads(self.request[0].numel(), self.dtype, self.parts, res)[0]


@dataclass
class _Pending:
    """A resident round submitted to the hosts: its edges, how many clients step, the
    (answer, new block) references of every live host's phase 2, and all blocks after."""

    t: int
    edges: torch.Tensor
    members: int
    steps: dict  # live host -> (answer, new block)
    blocks_after: list  # every host's block after the round


class HostsLost(RuntimeError):
    """Hosts died and ``engine.on_failure`` is ``drop``: their clients leave the run."""

    def __init__(self, clients: list[int]):
        super().__init__(f"client hosts died; clients {clients} leave the run")
        self.clients = clients


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


class CoordinatorImpl:
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
        }

    def round(self, t: int) -> dict[str, float]:
        t0, c0 = time.perf_counter(), self.ops.critical_compute_s
        if not self.span:
            self.span = [t0, t0]
        asynchronous = self.staleness > 0 and hasattr(self.algo, "plan")
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
                leave = getattr(self.algo, "leave", None)
                if leave is None:
                    raise RuntimeError(
                        f"{lost}, and algorithm '{self.algo.name}' cannot continue without "
                        "them (engine.on_failure=drop needs clients that can leave: cobo)"
                    ) from None
                self.state = leave(self.state, lost.clients)  # the round reruns without them
                self.ops.events.append(
                    {"event": "clients_dropped", "round": t, "clients": lost.clients}
                )
        self.span[1] = time.perf_counter()
        self.compute_s += self.span[1] - t0
        self.round_host_compute_s += self.ops.critical_compute_s - c0
        return stats

    def _resident_round_with_restarts(self, t: int) -> dict[str, float]:
        """A resident round, pipelined: round t+1 is submitted before round t is
        collected (its inputs are round t's published blocks, still references), so the
        hosts find their next calls queued and the coordinator's and driver's latency
        overlaps their compute; a membership change in between rolls it back. A host
        that dies is restarted by Ray; every host is reset to the committed x^t (its
        published models, kept in the object store) and W rows, and the round redone."""
        lost = (*_actor_lost(), HostStateLost)
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
            except (*_actor_lost(), GetTimeoutError):
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
            except _actor_lost():
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
        export = getattr(self.algo, "artifacts", None)
        return export(self.state) if export is not None else {}

    @_between_rounds
    def membership(self, kind: str, clients: list[int]) -> None:
        fn = getattr(self.algo, kind, None)
        if fn is None:
            raise ValueError(f"algorithm '{self.algo.name}' has no clients joining or leaving")
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


class RayRun:
    """Driver-side handle: looks like (ClientOps, Algorithm) to ``run_experiment`` while
    state stays in the coordinator and data in the hosts."""

    def __init__(self, cfg: Config, n_clients: int):
        import ray

        e = cfg.engine
        if e.resident and (
            cfg.algorithm.name != "cobo" or e.staleness or cfg.algorithm.weights == "sparse"
        ):
            from raycobo.config import ConfigError

            raise ConfigError(
                "invalid config key 'engine.resident': host-resident models run cobo with "
                "a dense W (algorithm.weights) and engine.staleness=0"
            )
        start_ray(cfg)
        n = n_clients
        total, node_max = instance_resources()
        self.plan = plan_hosts(e, n, total, node_max, fixed=cfg.engine.address is None)
        cfg = with_overrides(
            cfg,
            {
                "engine.clients_per_actor": self.plan.clients_per_actor,
                "engine.cpus_per_actor": self.plan.cpus_per_actor,
            },
        )
        e = cfg.engine
        self.cfg = cfg
        self.layout = host_layout(n, e.clients_per_actor)
        cfg_dict = cfg.to_dict()
        Host = ray.remote(ClientHostImpl)
        self.hosts = []
        for h, block in enumerate(self.layout):
            slow = e.slow_seconds if h in e.slow_hosts else 0.0
            self.hosts.append(
                Host.options(
                    # a second thread lets a host take the step while alignment runs
                    max_concurrency=2 if e.staleness > 0 else 1,
                    num_cpus=e.cpus_per_actor,
                    num_gpus=e.gpus_per_client * len(block),
                    max_restarts=e.max_restarts if e.on_failure == "restart" else 0,
                    name=None,
                ).remote(cfg_dict, block, slow)
            )
        try:  # every host placed and its data loaded, or one line saying what is missing
            wait_for_hosts([h.info.remote() for h in self.hosts], self.plan, e)
        except BaseException:
            self.close(coordinator=False)
            raise
        Coord = ray.remote(CoordinatorImpl)
        # The coordinator's math (W updates, penalties) is light next to the hosts'
        # forward/backward passes; it reserves no CPU so hosts can take them all.
        # It lives on the driver's node: a run outlives the loss of any other node.
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.coordinator = Coord.options(num_cpus=0, scheduling_strategy=here).remote(
            cfg_dict, self.hosts, self.layout
        )
        info = ray.get(self.coordinator.setup.remote(), timeout=e.timeout_s)
        self.n_clients = info["n_clients"]
        self.clusters = info["clusters"]
        self.host_devices = info["host_devices"]
        self.host_gpu_ids = info["host_gpu_ids"]
        self.host_nodes = info["host_nodes"]
        self.device = torch.device("cpu")
        self.name = cfg.algorithm.name
        from raycobo.algorithms import ALGORITHMS

        for kind in ("join", "leave"):  # only for algorithms with elastic clients
            if not hasattr(ALGORITHMS.get(self.name), kind):
                setattr(self, kind, None)

    def _get(self, ref):
        import ray

        return ray.get(ref, timeout=self.cfg.engine.timeout_s)

    # -- Algorithm-like surface for run_experiment ----------------------------------------
    def init(self, ops) -> str:
        return "remote"

    def round(self, state, t: int, ops) -> tuple[str, dict[str, float]]:
        return state, self._get(self.coordinator.round.remote(t))

    def evaluate(self, state, ops) -> Evaluation:
        loss, acc = self._get(self.coordinator.evaluate.remote())
        return Evaluation(loss=loss, accuracy=acc)

    def eval_params(self, state) -> torch.Tensor:
        return self._get(self.coordinator.eval_params.remote())

    def collaboration(self, state) -> torch.Tensor | None:
        return self._get(self.coordinator.collaboration.remote())

    def artifacts(self, state) -> dict[str, Any]:
        return self._get(self.coordinator.artifacts.remote())

    def join(self, state, clients: list[int]):
        self._get(self.coordinator.membership.remote("join", clients))
        return state

    def leave(self, state, clients: list[int]):
        self._get(self.coordinator.membership.remote("leave", clients))
        return state

    def checkpoint_state(self) -> dict[str, Any]:
        return self._get(self.coordinator.checkpoint_state.remote())

    def restore_state(self, tree: dict[str, Any]) -> None:
        self._get(self.coordinator.restore_state.remote(tree))

    def summary_extras(self) -> dict[str, Any]:
        rep = self._get(self.coordinator.report.remote())
        return {
            "hosts": len(self.hosts),
            "clients_per_actor": self.cfg.engine.clients_per_actor,
            "host_devices": self.host_devices,
            "host_gpu_ids": self.host_gpu_ids,
            "host_nodes": self.host_nodes,
            "cpus_per_actor": self.cfg.engine.cpus_per_actor,
            **rep,
        }

    def close(self, coordinator: bool = True) -> None:
        import ray

        for actor in [self.coordinator, *self.hosts] if coordinator else self.hosts:
            ray.kill(actor, no_restart=True)


def make_ray_run(cfg: Config, data) -> RayRun:
    """Start (or join) Ray and place the hosts and the coordinator for ``cfg``."""
    return RayRun(cfg, data.n_clients)
