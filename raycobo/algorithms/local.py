"""Local training: every client runs SGD on its own data alone (the no-collaboration
reference of CoBo Table 2; "Imp.(%)" counts clients that beat it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from raycobo import rng
from raycobo.algorithms.base import ClientOps, all_clients
from raycobo.algorithms.common import local_sgd
from raycobo.algorithms.settings import LocalTraining, MethodConfig


class LocalConfig(LocalTraining, MethodConfig):
    """Local training, no collaboration."""

    name: Literal["local"] = "local"


@dataclass
class LocalState:
    X: torch.Tensor  # (n, d)


class Local:
    name = "local"

    def __init__(self, cfg: LocalConfig, rounds: int, seed: int):
        self.cfg = cfg

    def init(self, ops: ClientOps) -> LocalState:
        return LocalState(ops.initial_params().expand(ops.n_clients, -1).clone())

    def round(self, state: LocalState, t: int, ops: ClientOps) -> tuple[LocalState, dict]:
        X, loss = local_sgd(
            ops, all_clients(ops), state.X, self.cfg.lr, self.cfg.local_steps, t, rng.STEP
        )
        return LocalState(X), {"train_loss": float(loss.mean()), "bytes_sent": 0.0}  # none

    def eval_params(self, state: LocalState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: LocalState) -> None:
        return None
