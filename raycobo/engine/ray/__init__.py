"""The Ray engine: client hosts as actors pinned to GPU fractions, and a coordinator actor.

- ``ClientHost`` (actor) holds the data of ``engine.clients_per_actor`` clients and
  answers the engine primitive -- gradients/losses of its clients at given points, and
  test metrics -- with the same batched code as the local engine, on CUDA when Ray
  assigned it a GPU. It requests ``gpus_per_client * clients`` GPUs and
  ``cpus_per_actor`` CPUs. Its clients' data comes from the driver through the object
  store (the driver loads the data set once and keeps the objects for the whole run),
  so a restarted host (Ray's ``max_restarts``) serves the same batches as before.
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

from raycobo.engine.ray.layout import HostPlan, host_layout, plan_hosts, start_ray
from raycobo.engine.ray.run import RayRun, make_ray_run

__all__ = ["HostPlan", "RayRun", "host_layout", "make_ray_run", "plan_hosts", "start_ray"]
