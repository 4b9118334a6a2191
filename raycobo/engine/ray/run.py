"""The driver's handle on a Ray run: places the hosts and the coordinator and looks
like (ClientOps, Algorithm) to ``run_experiment``."""

from __future__ import annotations

from typing import Any

import torch

from raycobo.algorithms.base import Evaluation
from raycobo.config import Config, with_overrides
from raycobo.engine.ray.coordinator import CoordinatorImpl
from raycobo.engine.ray.host import ClientHostImpl
from raycobo.engine.ray.layout import (
    host_layout,
    instance_resources,
    plan_hosts,
    start_ray,
    wait_for_hosts,
)


class RayRun:
    """Driver-side handle: looks like (ClientOps, Algorithm) to ``run_experiment`` while
    state stays in the coordinator and data in the hosts."""

    def __init__(self, cfg: Config, n_clients: int, data=None):
        """``data``: the loaded data set, when the driver has it: each host then gets its
        clients' part through the object store instead of loading the data set itself."""
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
        # one load in the driver, one object per host; held here for as long as the run
        # lasts, so that a host Ray restarts (on any node) finds its data again
        parts = [] if data is None else [ray.put(data.subset(b)) for b in self.layout]
        self._host_data = parts
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
                ).remote(cfg_dict, block, slow, n, None if data is None else parts[h])
            )
        try:  # every host placed and its data loaded, or one line saying what is missing
            wait_for_hosts([h.info.remote() for h in self.hosts], self.plan, e)
        except BaseException:
            self.close(coordinator=False)
            raise
        Coord = ray.remote(CoordinatorImpl)
        # The coordinator's math (W updates, penalties) is light next to the hosts'
        # forward/backward passes; it reserves no CPU so hosts can take them all.
        # It lives on the driver's node (not soft: Ray's soft affinity was seen to place it
        # elsewhere), so a run outlives the loss of any other node.
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.coordinator = Coord.options(num_cpus=0, scheduling_strategy=here).remote(
            cfg_dict, self.hosts, self.layout
        )
        info = ray.get(self.coordinator.setup.remote(), timeout=e.timeout_s)
        self.n_clients = info["n_clients"]
        self.clusters = info["clusters"]
        self.host_devices = info["host_devices"]
        self.host_gpu_ids = info["host_gpu_ids"]
        self.host_nodes = info["host_nodes"]
        self.coordinator_node = info["coordinator_node"]
        self.device = torch.device("cpu")
        self.name = cfg.algorithm.name
        from raycobo.algorithms import ALGORITHMS
        from raycobo.algorithms.base import Elastic

        build = ALGORITHMS.get(self.name)
        if not (isinstance(build, type) and issubclass(build, Elastic)):
            self.join = self.leave = None  # only for algorithms with elastic clients

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
            "coordinator_node": self.coordinator_node,
            "cpus_per_actor": self.cfg.engine.cpus_per_actor,
            **rep,
        }

    def close(self, coordinator: bool = True) -> None:
        import ray

        for actor in [self.coordinator, *self.hosts] if coordinator else self.hosts:
            ray.kill(actor, no_restart=True)


def make_ray_run(cfg: Config, data) -> RayRun:
    """Start (or join) Ray and place the hosts and the coordinator for ``cfg``."""
    return RayRun(cfg, data.n_clients, data)
