"""Engines: where the clients' computation runs (``engine.kind``), behind one session.

``open_session(cfg)`` loads the data, builds the method and returns the session the run
loop talks to (``raycobo.engine.session``), from the registry
``raycobo.registry.ENGINES``: a :class:`LocalSession` over this process's ``ClientOps``
(``local``, ``loop``: ``local_session``) or a ``RaySession`` (``ray``). A new engine is a
package with a ``Session`` and one ``EngineSpec`` entry there (or a plugin: ``engine.kind:
package.module:SPEC``, or an entry point of the group ``raycobo.engines``). The
``ClientOps`` follow what the data set declares (``data.ops``: ``supervised``,
``quadratic``, ``lora``; the registry ``OPS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from raycobo.algorithms.base import ClientOps
from raycobo.config import Config, ConfigError
from raycobo.engine.session import LocalSession, Session
from raycobo.registry import ENGINES, engine


@dataclass(frozen=True)
class Task:
    """What a run reports about its task, as its data set declares it."""

    model: str | None  # model.name, or None where the data set needs no model (quadratic)
    perplexity: bool  # a language model: report exp(loss) as mean_perplexity
    data: dict | None = None  # what the clients got (raycobo.data.report)


def open_session(cfg: Config) -> tuple[Session, Task]:
    """The data, the method and the engine of ``cfg`` as one session (not started)."""
    from raycobo.data import load_data
    from raycobo.data.report import data_report

    data = load_data(cfg)
    model = cfg.model.name if data.uses_model else None
    task = Task(model, data.reports_perplexity, data_report(data))
    return engine(cfg.engine.kind).open(cfg, data), task


def local_session(cfg: Config, data) -> Session:
    """The engines ``local`` and ``loop``: the method over this process's ClientOps (the
    ops decide vectorized or per-client)."""
    from raycobo.algorithms import build_algorithm

    algo = build_algorithm(cfg.algorithm, cfg.rounds, cfg.seed)
    return LocalSession(algo, make_local_ops(cfg, data), cfg.engine.threads)


def make_local_ops(
    cfg: Config,
    data,
    device: str | None = None,
    client_ids: torch.Tensor | None = None,
) -> ClientOps:
    """ClientOps in this process for the kind of data ``data`` declares (``data.ops``,
    ``OPS``); a Ray host passes its device and the global ids of the clients it holds
    (``data`` is then their subset), so its batches are the ones the local engine draws."""
    device = device or cfg.engine.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"invalid config key 'engine.device': '{device}' but CUDA is not available"
        )
    return OPS[data.ops](cfg, data, device, client_ids)


def _full_precision_only(cfg: Config) -> None:
    """Data without a supervised model: the engine's precision keys do not apply."""
    e = cfg.engine
    for key, plain in (("precision", "fp32"), ("channels_last", False)):
        if getattr(e, key) != plain:
            raise ConfigError(
                f"invalid config key 'engine.{key}': it applies to the supervised models "
                f"(mlp, cnn, resnet9, ...), not to data.name={cfg.data.name}"
            )


def _quadratic_ops(cfg: Config, data, device: str, client_ids=None) -> ClientOps:
    from raycobo.engine.quadratic import QuadraticOps

    _full_precision_only(cfg)
    return QuadraticOps(data, cfg.seed, device, client_ids=client_ids)


def _lora_ops(cfg: Config, data, device: str, client_ids=None) -> ClientOps:
    from raycobo.engine.llm import LoRAOps  # one path for local and loop: rows one by one

    _full_precision_only(cfg)
    return LoRAOps(data, cfg, device, client_ids=client_ids)


def make_supervised_ops(cfg: Config, data, device: str, client_ids=None) -> ClientOps:
    """The local engine on a supervised data set: the execution planned from
    ``engine.strategy`` and ``engine.memory_gb`` (``engine/memory.py``), then the ops that
    follow that plan."""
    from raycobo.engine.local import LoopOps, VectorizedOps
    from raycobo.engine.memory import keep_freed_memory, plan_execution
    from raycobo.models import build_model

    keep_freed_memory()
    e = cfg.engine
    if e.kind == "loop" and e.strategy not in ("auto", "loop"):
        raise ConfigError(
            f"invalid config key 'engine.strategy': '{e.strategy}' applies to engine.kind "
            "local (or ray); engine.kind loop is the per-client reference loop"
        )
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    plan = plan_execution(
        "loop" if e.kind == "loop" else e.strategy,
        model.module,
        tuple(data.input_shape),
        model.dim,
        cfg.batch_size,
        torch.device(device),
        e.memory_gb,
        e.chunk_size,
        e.precision,
        e.channels_last,
    )
    Ops = LoopOps if plan.strategy == "loop" else VectorizedOps
    return Ops(data, model, cfg.batch_size, cfg.seed, plan, device, client_ids, cfg.data.augment)


# data.ops -> the ClientOps that compute its gradients and evaluations in this process
OPS: dict[str, Callable[..., ClientOps]] = {
    "supervised": make_supervised_ops,
    "quadratic": _quadratic_ops,
    "lora": _lora_ops,
}

__all__ = [
    "ENGINES",
    "OPS",
    "local_session",
    "LocalSession",
    "Session",
    "Task",
    "make_local_ops",
    "open_session",
]
