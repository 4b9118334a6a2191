"""Starting Ray and laying out the client hosts: how many, what each asks Ray for, and
a bounded wait until they run (a local instance never waits for what it lacks)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from raycobo.config import Config


def plugin_runtime_env(cfg: Config) -> dict | None:
    """The runtime environment that ships a config's plugin modules (a method, data set
    or model named by import path or entry point) to Ray's workers: Ray uploads each
    module (a package folder or one .py file) and puts it on the workers' path, on this
    machine and on a cluster alike. None when the config names no plugin."""
    from raycobo.registry import plugin_modules

    mods = plugin_modules([cfg.algorithm.name, cfg.data.name, cfg.model.name])
    return {"py_modules": mods} if mods else None


def plugin_options(cfg: Config) -> dict:
    """Actor/task options that give a worker the config's plugins (empty: none). Ray
    takes local modules only in ``ray.init``; an actor's or task's runtime environment
    must name them by URI. So the modules are packed and put into the connected
    cluster's store here (the step ``ray.init`` takes for its own runtime environment),
    which also serves a Ray that was started without them."""
    env = plugin_runtime_env(cfg)
    if not env:
        return {}
    return {"runtime_env": {"py_modules": _uploaded(env["py_modules"])}}


def _uploaded(modules: list) -> list[str]:
    """``gcs://`` URIs of ``modules`` in the connected Ray cluster. Ray names a package by
    its content's hash and uploads it only when the cluster lacks that hash, so a second
    call re-hashes the module but sends nothing, and an edited module is sent anew."""
    import logging
    import tempfile

    upload_py_modules_if_needed, node, _ = _ray_private()
    scratch = node.get_runtime_env_dir_path() if node is not None else tempfile.mkdtemp()
    env = upload_py_modules_if_needed(
        {"py_modules": list(modules)},
        include_gitignore=True,
        scratch_dir=scratch,
        logger=logging.getLogger("raycobo.plugins"),
    )
    return list(env["py_modules"])


def _ray_private():
    """The only Ray internals raycobo uses, and why no public API serves: (1) packing
    local modules into the cluster's store for an actor's ``runtime_env`` (``ray.init``
    does it for its own runtime environment only; an actor's must name packages by URI),
    and the connected node's scratch folder it packs into; (2) Ray's flag for binding a
    local instance to the loopback address (Ray 2.5x picks the network interface's
    address, and ``ray.init`` has no public argument for the node's address).
    -> (upload_py_modules_if_needed, the driver's node or None, ray_constants)"""
    import ray
    from ray._private import ray_constants
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    return upload_py_modules_if_needed, ray._private.worker.global_worker.node, ray_constants


def _address_of(address: str) -> tuple[str, int] | None:
    """(host, port) that ``engine.address`` connects to; None where Ray finds it itself
    and no cluster is known (``auto`` without a running head)."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        if not address:
            current = Path("/tmp/ray/ray_current_cluster")
            address = current.read_text().strip() if current.is_file() else ""
        if not address:
            return None
    scheme, sep, rest = address.partition("://")
    if not sep:
        rest, scheme = address, ""
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return (rest, 10001) if scheme == "ray" else None
    return host, int(port)


def check_reachable(address: str, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``engine.address`` to accept a connection; stop with
    one line naming the key instead of Ray's endless reconnection warnings."""
    import socket

    target = _address_of(address)
    if target is None:
        return  # "auto" with nothing to look at: ray.init says so itself, at once
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(target, timeout=min(5.0, timeout_s)):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                from raycobo.config import ConfigError

                raise ConfigError(
                    f"invalid config key 'engine.address': {address} ({target[0]}:{target[1]}) "
                    f"did not answer within engine.connect_timeout_s={timeout_s:g} s "
                    f"({err.strerror or err}); is the cluster's head running?"
                ) from None
            time.sleep(1.0)


WORKER_NICENESS = "RAY_worker_niceness"  # read by the raylet ray.init starts


def start_ray(cfg: Config) -> None:
    """Connect to ``engine.address``, or start a local Ray bound to 127.0.0.1 with no
    dashboard (Ray >= 2.5x otherwise picks the network interface's address). A Ray
    started here ships the config's plugin modules to every worker (tasks and actors,
    Tune's trials included)."""
    if cfg.engine.address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        # Ray starts its workers at nice 15; here they are the computation (sweep trials,
        # client hosts, a parallel compare's runs), and beside other work at nice 0 they
        # all but stopped (a sweep on a machine at load 7 had started no trial after
        # minutes): the workers of a Ray started here run at the driver's priority
        os.environ.setdefault(WORKER_NICENESS, "0")
    import ray

    if ray.is_initialized():
        return
    env = plugin_runtime_env(cfg)
    if cfg.engine.address is not None:
        check_reachable(cfg.engine.address, cfg.engine.connect_timeout_s)
        ray.init(address=cfg.engine.address, log_to_driver=False, runtime_env=env)
        return
    _ray_private()[2].ENABLE_RAY_CLUSTER = False  # loopback node address
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
        runtime_env=env,
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


def with_host_plan(cfg: Config, plan: HostPlan) -> Config:
    """``cfg`` with its ``auto`` layout keys resolved to ``plan`` (what the hosts, a sweep's
    trial bundles and the summary's config see)."""
    from raycobo.config import with_overrides

    return with_overrides(
        cfg,
        {
            "engine.clients_per_actor": plan.clients_per_actor,
            "engine.cpus_per_actor": plan.cpus_per_actor,
        },
    )


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
