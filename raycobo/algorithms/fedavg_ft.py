"""FedAvg with local fine-tuning (CoBo Table 2, "Fine-tuning FedAvg").

FedAvg (``fedavg.py``) for the first ``rounds - ft_steps`` rounds, then every client
fine-tunes its own copy of the global model for ``ft_steps`` rounds of local SGD -- the
same total number of iterations as the other methods, so the comparison is at equal
compute. It plans its rounds (``PlansRounds``): FedAvg's updates may arrive late
(``engine.rounds: stale``), all of them applied by the last FedAvg round (``Plan.drain``),
so that the fine-tuning starts from the global model of every update.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import Answer, ClientOps, LocalSGD, Plan, all_clients, run_plan
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
        return run_plan(self, state, t, ops)

    # -- PlansRounds: FedAvg's updates may be applied late, all before the fine-tuning ---
    def plan_refusal(self) -> str | None:
        return None

    def plan_round(self, state: FedAvgState, t: int, ops: ClientOps) -> Plan:
        """FedAvg's plan (its last round waits for every update still in flight), then
        the fine-tuning's local SGD of every client from its own model, needed now."""
        if t < self.switch:
            return replace(self.fedavg.plan_round(state, t, ops), drain=t == self.switch - 1)
        X = state.X if state.X is not None else state.x.expand(ops.n_clients, -1).clone()
        c = self.cfg
        return Plan(t, now=LocalSGD(all_clients(ops), X, c.lr, c.local_steps, rng.FT))

    def apply_round(
        self, state: FedAvgState, plan: Plan, now: Answer | None, arrived: list
    ) -> tuple[FedAvgState, dict]:
        if plan.round < self.switch:
            return self.fedavg.apply_round(state, plan, now, arrived)
        assert now is not None
        X, loss = now  # fine-tuning is local: nothing is sent
        return FedAvgState(state.x, state.n, X), {
            "train_loss": float(loss.mean()),
            "bytes_sent": 0.0,
        }

    def eval_params(self, state: FedAvgState) -> torch.Tensor:
        return self.fedavg.eval_params(state)

    def collaboration(self, state: FedAvgState) -> None:
        return None
