"""The Ray engine on several Ray nodes: Ray's own multi-node fixture
(``ray.cluster_utils.Cluster``, one raylet per node on this machine)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

import os  # noqa: E402
import signal  # noqa: E402

from raycobo.config import load_config  # noqa: E402
from tests.helpers import ray_matches_local  # noqa: E402


@pytest.fixture(scope="module")
def three_nodes():
    """A head with no CPU and three workers with one CPU each: hosts of one CPU land on
    different worker nodes, and one is left free for a restart. Any Ray started by
    other test modules is stopped first."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    ray.shutdown()
    # loopback addresses, as raycobo's own local instance (see engine.ray.layout.start_ray)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray_constants.ENABLE_RAY_CLUSTER = False
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    workers = [cluster.add_node(num_cpus=1) for _ in range(3)]
    try:
        assert cluster.address.startswith("127.0.0.1:"), cluster.address
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes(timeout=60)
        yield cluster, workers
    finally:
        ray.shutdown()
        # not cluster.shutdown(): that is `ray stop --force`, every Ray on the machine
        for node in [*cluster.worker_nodes, cluster.head_node]:
            cluster.remove_node(node, allow_graceful=False)
        from ray._common.utils import reset_ray_address

        reset_ray_address()  # the fixture wrote its address to /tmp/ray/ray_current_cluster


def _cfg(address: str, *extra: str):
    return load_config(
        None,
        [
            "data.name=quadratic",
            "data.partition.clients_per_cluster=[2,2]",
            "data.noise=0.2",
            "tracking.enabled=false",
            "engine.kind=ray",
            f"engine.address={address}",
            "engine.clients_per_actor=2",
            "engine.cpus_per_actor=1",
            "engine.timeout_s=60",
            "algorithm.sampling=full",
            *extra,
        ],
    )


@pytest.mark.timeout(240)
def test_hosts_spread_over_nodes_and_equal_the_local_engine(three_nodes):
    cluster, _ = three_nodes
    _, report = ray_matches_local(_cfg(cluster.address), 4)
    nodes = report["host_nodes"]
    assert len(nodes) == 2 and len(set(nodes)) == 2  # one CPU per worker: two nodes
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert set(nodes) <= alive


@pytest.mark.timeout(240)
def test_a_node_removed_mid_run_its_host_restarts_elsewhere(three_nodes):
    """The node of a host goes away between rounds 2 and 3 (not just the actor): Ray
    restarts the host on the free node, the round is redone, the numbers are those of
    an uninterrupted local run."""
    cluster, workers = three_nodes
    removed = {}

    def between(run, t):
        if t == 2:
            by_id = {w.node_id: w for w in workers}
            # every node here is 127.0.0.1, so the driver (and the coordinator with it)
            # may sit on any raylet: remove a host's node that is not the driver's
            driver = ray.get_runtime_context().get_node_id()
            removed["driver"], removed["coordinator"] = driver, run.coordinator_node
            target = next(n for n in run.host_nodes if n in by_id and n != driver)
            removed["node"] = target
            infos = [ray.get(h.info.remote(), timeout=60) for h in run.hosts]
            # a machine lost: its raylet and, with it, the worker processes on it
            cluster.remove_node(by_id[target], allow_graceful=False)
            for info in infos:
                if info["node"] == target:
                    os.kill(info["pid"], signal.SIGKILL)
        if t == 4:  # where the hosts are now
            removed["now"] = [ray.get(h.info.remote(), timeout=60)["node"] for h in run.hosts]

    _, report = ray_matches_local(_cfg(cluster.address), 5, between=between)
    assert removed["node"] in report["host_nodes"]
    assert report["coordinator_node"] == removed["driver"]  # it lives with the driver
    assert removed["node"] not in removed["now"] and len(set(removed["now"])) == 2
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert set(removed["now"]) <= alive
