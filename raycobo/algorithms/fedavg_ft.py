"""FedAvg with local fine-tuning (CoBo Table 2, "Fine-tuning FedAvg").

FedAvg (``fedavg.py``) for the first ``rounds - ft_steps`` rounds, then every client
fine-tunes its own copy of the global model for ``ft_steps`` rounds of local SGD -- the
same total number of iterations as the other methods, so the comparison is at equal
compute.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps, all_clients
from raycobo.algorithms.common import local_sgd
from raycobo.algorithms.fedavg import FedAvg, FedAvgConfig, FedAvgState
from raycobo.settings import ConfigError


class FedAvgFTConfig(FedAvgConfig):
    """FedAvg's settings and the length of the fine-tuning phase."""

    name: Literal["fedavg_ft"] = "fedavg_ft"
    ft_steps: int = Field(default=50, ge=0, description="last rounds spent fine-tuning locally")


class FedAvgFT:
    name = "fedavg_ft"

    def __init__(self, cfg: FedAvgFTConfig, rounds: int, seed: int):
        if cfg.ft_steps >= rounds:
            raise ConfigError(
                f"invalid config key 'algorithm.ft_steps': {cfg.ft_steps} fine-tuning rounds "
                f"leave no FedAvg rounds out of rounds={rounds}"
            )
        self.cfg = cfg
        self.fedavg = FedAvg(cfg, rounds, seed)
        self.switch = rounds - cfg.ft_steps

    def init(self, ops: ClientOps) -> FedAvgState:
        return self.fedavg.init(ops)

    def round(self, state: FedAvgState, t: int, ops: ClientOps) -> tuple[FedAvgState, dict]:
        if t < self.switch:
            return self.fedavg.round(state, t, ops)
        X = state.X if state.X is not None else state.x.expand(ops.n_clients, -1).clone()
        X, loss = local_sgd(ops, all_clients(ops), X, self.cfg.lr, self.cfg.local_steps, t, rng.FT)
        return FedAvgState(state.x, state.n, X), {"train_loss": float(loss.mean())}

    def eval_params(self, state: FedAvgState) -> torch.Tensor:
        return self.fedavg.eval_params(state)

    def collaboration(self, state: FedAvgState) -> None:
        return None
