"""Engines: where the clients' computation runs (``engine.kind``)."""

from __future__ import annotations

import torch

from raycobo.algorithms.base import ClientOps
from raycobo.config import Config
from raycobo.data import QuadraticProblem
from raycobo.data.quadratic import QuadraticOps
from raycobo.models import build_model


def make_local_ops(
    cfg: Config,
    data,
    device: str | None = None,
    client_ids: torch.Tensor | None = None,
) -> ClientOps:
    """ClientOps in this process: ``loop`` (per-client loop) or else vectorized; a Ray
    host passes its device and the global ids of the clients it holds (``data`` is then
    their subset), so its batches are the ones the local engine draws."""
    device = device or cfg.engine.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        from raycobo.config import ConfigError

        raise ConfigError(
            f"invalid config key 'engine.device': '{device}' but CUDA is not available"
        )
    if isinstance(data, QuadraticProblem):
        return QuadraticOps(data, cfg.seed, device, client_ids=client_ids)
    from raycobo.data.text import TextData

    if isinstance(data, TextData):  # one path for local and loop: rows run one by one
        from raycobo.engine.llm import LoRAOps

        return LoRAOps(data, cfg, device, client_ids=client_ids)
    from raycobo.engine.local import LoopOps, VectorizedOps
    from raycobo.engine.memory import plan_execution

    e = cfg.engine
    if e.kind == "loop" and e.strategy not in ("auto", "loop"):
        from raycobo.config import ConfigError

        raise ConfigError(
            f"invalid config key 'engine.strategy': '{e.strategy}' applies to engine.kind "
            "local (or ray); engine.kind loop is the per-client reference loop"
        )
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    plan = plan_execution(
        "loop" if e.kind == "loop" else e.strategy,
        cfg.model.name,
        model.module,
        tuple(data.input_shape),
        model.dim,
        cfg.batch_size,
        torch.device(device),
        e.memory_gb,
        e.chunk_size,
    )
    common = dict(client_ids=client_ids, augment=cfg.data.augment, execution=plan)
    if plan.strategy == "loop":
        return LoopOps(data, model, cfg.batch_size, cfg.seed, device, **common)
    return VectorizedOps(data, model, cfg.batch_size, cfg.seed, device, **common)
