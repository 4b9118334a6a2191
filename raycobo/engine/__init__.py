"""Engines: where the clients' computation runs (``engine.kind``)."""

from __future__ import annotations

import torch

from raycobo.algorithms.base import ClientOps
from raycobo.config import Config
from raycobo.data import FederatedData, QuadraticProblem
from raycobo.data.quadratic import QuadraticOps
from raycobo.models import build_model


def make_local_ops(cfg: Config, data: FederatedData | QuadraticProblem) -> ClientOps:
    """ClientOps in this process: ``local`` (vectorized) or ``loop`` (per-client loop)."""
    device = cfg.engine.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        from raycobo.config import ConfigError

        raise ConfigError(
            f"invalid config key 'engine.device': '{device}' but CUDA is not available"
        )
    if isinstance(data, QuadraticProblem):
        return QuadraticOps(data, cfg.seed, device)
    from raycobo.data.text import TextData

    if isinstance(data, TextData):  # one path for local and loop: rows run one by one
        from raycobo.engine.llm import LoRAOps

        return LoRAOps(data, cfg, device)
    from raycobo.engine.local import LoopOps, VectorizedOps

    model = build_model(cfg.model, data.input_shape, data.num_classes)
    aug = cfg.data.augment
    if cfg.engine.kind == "loop":
        return LoopOps(data, model, cfg.batch_size, cfg.seed, device, augment=aug)
    return VectorizedOps(
        data, model, cfg.batch_size, cfg.seed, device, chunk_size=cfg.engine.chunk_size, augment=aug
    )
