"""The Ray engine's session: places the client hosts and the coordinator, then answers
the run loop by calling the coordinator, which holds the algorithm (the driver holds
handles, statistics and W -- never a model)."""

from __future__ import annotations

from typing import Any

import torch

from raycobo.algorithms.base import Elastic, Evaluation
from raycobo.config import Config
from raycobo.engine.ray.coordinator import CoordinatorImpl
from raycobo.engine.ray.layout import (
    host_layout,
    instance_resources,
    plan_hosts,
    plugin_options,
    start_ray,
    wait_for_hosts,
    with_host_plan,
)
from raycobo.engine.ray.policies import Schedule, schedule_for


def place_hosts(
    cfg: Config, layout: list[list[int]], n: int, parts: list, schedule: Schedule
) -> tuple[list, list]:
    """One host actor per block of ``layout``, of the schedule's host class; ``parts``:
    each host's data in the object store, attached once the host stands (empty: the hosts
    load the data set themselves). -> (the hosts, the calls whose answers say each host
    stands with its data: to wait for before any other call, since a host that takes two
    calls at once, as a stale schedule's do, need not run them in order)"""
    import ray

    e = cfg.engine
    Host = ray.remote(schedule.host_impl())
    cfg_dict = cfg.to_dict()
    plugins = plugin_options(cfg)  # Ray may have been started without the plugins
    hosts, ready = [], []
    for h, block in enumerate(layout):
        slow = e.slow_seconds if h in e.slow_hosts else 0.0
        hosts.append(
            Host.options(
                **schedule.actor_options(),
                num_cpus=e.cpus_per_actor,
                num_gpus=e.gpus_per_client * len(block),
                max_restarts=e.max_restarts if e.on_failure == "restart" else 0,
                **plugins,
            ).remote(cfg_dict, block, slow, n, bool(parts))
        )
        ready.append(hosts[-1].attach.remote(parts[h]) if parts else hosts[-1].info.remote())
    return hosts, ready


def place_coordinator(
    cfg: Config, hosts: list, layout: list[list[int]], parts: list, schedule: Schedule
):
    """The coordinator on the driver's node (not soft: Ray's soft affinity was seen to
    place it elsewhere), so a run outlives the loss of any other node. Its math (W
    updates, penalties) is light next to the hosts' passes: it reserves no CPU."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    Coord = ray.remote(CoordinatorImpl)
    options = {"num_cpus": 0, "scheduling_strategy": here, **plugin_options(cfg)}
    # ``parts``: the hosts' data, attached again to a host Ray restarted (the coordinator
    # itself is not restarted, so references among its arguments are safe with Ray)
    return Coord.options(**options).remote(cfg.to_dict(), hosts, layout, parts, schedule)


class RaySession:
    """The Ray engine behind the Session interface (``raycobo.engine.session``)."""

    def __init__(self, cfg: Config, n_clients: int, data=None):
        """``data``: the loaded data set, when the driver has it: each host then gets its
        clients' part through the object store instead of loading the data set itself."""
        import ray

        from raycobo.algorithms import build_algorithm

        # the coordinator holds the algorithm; the driver asks its own copy what it can do
        algo = build_algorithm(cfg.algorithm, cfg.rounds, cfg.seed)
        schedule = schedule_for(cfg, algo)
        start_ray(cfg)
        total, node_max = instance_resources()
        fixed = cfg.engine.address is None
        self.plan = plan_hosts(cfg.engine, n_clients, total, node_max, fixed=fixed)
        self.cfg = cfg = with_host_plan(cfg, self.plan)
        self.layout = host_layout(n_clients, cfg.engine.clients_per_actor)
        # one load in the driver, one object per host; held here for as long as the run
        # lasts, so that a host Ray restarts (on any node) finds its data again
        self._host_data = [] if data is None else [ray.put(data.subset(b)) for b in self.layout]
        self.hosts, ready = place_hosts(cfg, self.layout, n_clients, self._host_data, schedule)
        self.coordinator = None
        try:  # every host placed and its data loaded, or one line saying what is missing
            wait_for_hosts(ready, self.plan, cfg.engine)
            self.coordinator = place_coordinator(
                cfg, self.hosts, self.layout, self._host_data, schedule
            )
            info = self._get(self.coordinator.describe.remote())
        except BaseException:
            self.close()
            raise
        self.n_clients = info["n_clients"]
        self.clusters = info["clusters"]
        self.host_devices = info["host_devices"]
        self.host_gpu_ids = info["host_gpu_ids"]
        self.host_nodes = info["host_nodes"]
        self.coordinator_node = info["coordinator_node"]
        self.elastic = isinstance(algo, Elastic)

    def _get(self, ref):
        import ray

        return ray.get(ref, timeout=self.cfg.engine.timeout_s)

    # -- Session ----------------------------------------------------------------------------
    def start(self) -> None:
        self._get(self.coordinator.start.remote())

    def restore(self, tree: Any) -> None:
        self._get(self.coordinator.restore.remote(tree))

    def round(self, t: int) -> dict[str, float]:
        return self._get(self.coordinator.round.remote(t))

    def evaluate(self) -> Evaluation:
        loss, acc = self._get(self.coordinator.evaluate.remote())
        return Evaluation(loss=loss, accuracy=acc)

    def models(self) -> torch.Tensor:
        return self._get(self.coordinator.models.remote())

    def collaboration(self) -> torch.Tensor | None:
        return self._get(self.coordinator.collaboration.remote())

    def agreement(self, W: torch.Tensor | None) -> dict[str, float]:
        return self._get(self.coordinator.agreement.remote(W))

    def change_membership(self, kind: str, clients: list[int], t: int) -> None:
        self._get(self.coordinator.change_membership.remote(kind, list(clients), t))

    def snapshot(self) -> dict[str, Any]:
        return self._get(self.coordinator.snapshot.remote())

    def artifacts(self) -> dict[str, Any]:
        return self._get(self.coordinator.artifacts.remote())

    def report(self) -> dict[str, Any]:
        rep = self._get(self.coordinator.report.remote())
        return {
            "engine_report": {
                "hosts": len(self.hosts),
                "clients_per_actor": self.cfg.engine.clients_per_actor,
                "host_devices": self.host_devices,
                "host_gpu_ids": self.host_gpu_ids,
                "host_nodes": self.host_nodes,
                "coordinator_node": self.coordinator_node,
                "cpus_per_actor": self.cfg.engine.cpus_per_actor,
                **rep,
            }
        }

    def close(self) -> None:
        import ray

        for actor in [self.coordinator, *self.hosts]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
