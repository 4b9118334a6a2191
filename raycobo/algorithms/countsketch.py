"""Count-Sketch compression (FetchSGD without momentum), FedSep's second communication
baseline: clients send Count Sketches of their local updates; the server keeps a
sketched error accumulator and applies the top-k coordinates it recovers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from raycobo import rng
from raycobo.algorithms.base import ClientOps
from raycobo.algorithms.common import (
    FLOAT,
    INDEX,
    local_updates,
    top_count,
    top_k,
)
from raycobo.algorithms.settings import (
    ClientSampling,
    LocalTraining,
    MethodConfig,
    ServerStep,
    TopKShare,
)
from raycobo.settings import ConfigError


class CountSketchConfig(LocalTraining, ClientSampling, ServerStep, TopKShare, MethodConfig):
    """Count-Sketch compression (FetchSGD)."""

    name: Literal["countsketch"] = "countsketch"
    sketch_rows: int = Field(default=5, ge=1, description="sketch rows")
    sketch_cols: int | None = Field(default=None, ge=1, description="sketch columns; null: d/10")


def sketch_hashes(d: int, rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bucket (rows, d) in [0, cols) and sign (rows, d) in {-1, 1} of every coordinate."""
    r = torch.arange(rows).view(-1, 1)
    j = torch.arange(d).view(1, -1)
    bucket = rng.randint(torch.tensor(cols), seed, rng.SAMPLER, 0xC5, r, j)
    sign = torch.where(rng.uniform(seed, rng.SAMPLER, 0xC6, r, j) < 0.5, -1.0, 1.0)
    return bucket, sign


def count_sketch(V: torch.Tensor, bucket: torch.Tensor, sign: torch.Tensor, cols: int):
    """Linear sketch of every row of V (m, d) -> (m, rows, cols)."""
    m, rows = V.shape[0], bucket.shape[0]
    out = torch.zeros(m, rows, cols, dtype=V.dtype, device=V.device)
    for r in range(rows):
        out[:, r].index_add_(1, bucket[r], V * sign[r])
    return out


def unsketch(S: torch.Tensor, bucket: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """Estimate every coordinate of a sketched vector S (rows, cols): the median over
    rows of sign * bucket value. -> (d,)"""
    est = torch.stack([sign[r] * S[r, bucket[r]] for r in range(S.shape[0])])
    return est.median(dim=0).values


@dataclass
class SketchState:
    x: torch.Tensor  # (d,) global model
    Se: torch.Tensor  # (rows, cols) the server's error accumulator, in sketch space
    bucket: torch.Tensor  # (rows, d) every coordinate's column in each sketch row
    sign: torch.Tensor  # (rows, d) its sign there
    n: int  # clients (each predicts with the global model)


class CountSketchFL:
    """FetchSGD without momentum: clients send Count Sketches of their local updates; the
    server adds their mean to its sketched error accumulator, extracts the top-k
    coordinates (median estimates), applies them and subtracts their sketch."""

    name = "countsketch"

    def __init__(self, cfg: CountSketchConfig, rounds: int, seed: int):
        self.cfg, self.rounds, self.seed = cfg, rounds, seed

    def init(self, ops: ClientOps) -> SketchState:
        c = self.cfg
        cols = c.sketch_cols or max(1, ops.dim // 10)
        bucket, sign = sketch_hashes(ops.dim, c.sketch_rows, cols, self.seed)
        x = ops.initial_params().clone()
        Se = torch.zeros(c.sketch_rows, cols, dtype=x.dtype, device=x.device)
        return SketchState(x, Se, bucket.to(ops.device), sign.to(ops.device), ops.n_clients)

    def round(self, state: SketchState, t: int, ops: ClientOps) -> tuple[SketchState, dict]:
        c = self.cfg
        d = ops.dim
        k = top_count(c, d)
        bucket, sign, cols = state.bucket, state.sign, state.Se.shape[1]
        if 4 * k > cols:
            raise ConfigError(
                f"invalid config key 'algorithm.topk_fraction': {k} coordinates from a sketch "
                f"of {cols} columns (need at least 4k; raise algorithm.sketch_cols)"
            )
        clients, delta, loss = local_updates(ops, state.x, c, self.seed, t)
        sketches = count_sketch(delta, bucket, sign, cols)  # (m, r, c)
        Se = state.Se + c.server_lr * sketches.mean(dim=0)  # sketches are linear
        update = top_k(unsketch(Se, bucket, sign)[None], k)[0]
        Se = Se - count_sketch(update[None], bucket, sign, cols)[0]
        m = clients.numel()
        return SketchState(state.x + update, Se, bucket, sign, state.n), {
            "train_loss": float(loss.mean()),
            "bytes_sent": float(m * (Se.numel() * FLOAT + min(d * FLOAT, k * (FLOAT + INDEX)))),
        }

    def eval_params(self, state: SketchState) -> torch.Tensor:
        return state.x.expand(state.n, -1)

    def collaboration(self, state: SketchState) -> None:
        return None
