"""The Ray engine: client hosts as actors pinned to GPU fractions, and a coordinator actor.

- ``ClientHost`` (actor) holds the data of ``engine.clients_per_actor`` clients and
  answers the engine primitive -- gradients/losses of its clients at given points, and
  test metrics -- with the same batched code as the local engine, on CUDA when Ray
  assigned it a GPU. It requests ``gpus_per_client * clients`` GPUs and
  ``cpus_per_actor`` CPUs. Its clients' data comes from the driver through the object
  store (the driver loads the data set once and keeps the objects for the whole run),
  so a restarted host (Ray's ``max_restarts``) serves the same batches as before.
- ``Coordinator`` (actor) owns the algorithm through one round policy, given by the
  ``Schedule`` the driver resolved once from ``engine.rounds`` (``policies.py``):
  ``SyncRounds`` runs the algorithm's own round, which asks for gradients (or local
  training) of its clients at its points (the coordinator sends each host only the
  points of its own clients through the object store, in parallel); ``StaleRounds``
  (``stale``) schedules the plan of a method that ``PlansRounds`` so that the results it
  may apply late (e.g. pair scores) arrive up to ``engine.staleness`` rounds late;
  ``ResidentRounds`` (``resident``, a method that ``StepsInRows``): the hosts
  (``ResidentHostImpl``) keep their clients' models and W rows, a round is two calls per
  host that read each other's gradients and published models through the object store,
  rounds are pipelined one ahead, and the coordinator sends indices and keeps a copy of
  W from the scores. The engine holds no method's equations: the method's row step does.
- ``RaySession`` (driver): places hosts and coordinator and answers the run loop; the
  driver receives round statistics, evaluations and W -- never a model.

Minibatches and noise are hashes of (seed, round, global client id, stream, salt), so
the same config gives the same numbers as the local engine.
"""

from raycobo.engine.ray.layout import HostPlan, host_layout, plan_hosts, start_ray, with_host_plan
from raycobo.engine.ray.session import RaySession


def ray_session(cfg, data) -> RaySession:
    """The engine ``ray`` (its registry entry, ``raycobo.registry.ENGINES``)."""
    return RaySession(cfg, data.n_clients, data)


__all__ = [
    "HostPlan",
    "RaySession",
    "host_layout",
    "plan_hosts",
    "ray_session",
    "start_ray",
    "with_host_plan",
]
