"""The round loop: a :class:`RunState` stepped one round at a time against a session.

The loop talks to a session only (``raycobo.engine.session``): it never asks which
engine it has. What a checkpoint holds is the RunState plus the session's snapshot.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from raycobo.algorithms.base import Evaluation
from raycobo.config import Config, ConfigError, EveryKth
from raycobo.engine import Session, Task
from raycobo.lifecycle.callbacks import RunContext
from raycobo.lifecycle.run_dir import RunDir


@dataclass
class RunState:
    """The run's own progress, beside the session's algorithm state."""

    round: int = 0  # completed rounds
    history: list[dict[str, Any]] = field(default_factory=list)  # evaluations so far
    snapshots: dict[int, np.ndarray] = field(default_factory=dict)  # W at heatmap rounds
    membership: list[dict[str, Any]] = field(default_factory=list)  # joins/leaves applied
    bytes_sent: float | None = None  # communication (None: the method counts none)
    wall_before: float = 0.0  # seconds spent before a resume
    first_train_loss: float | None = None  # the yardstick of divergence
    diverged: dict[str, float] | None = None  # the round where the loss exploded

    def payload(self, session: Session, wall: float) -> dict[str, Any]:
        """What a checkpoint holds (with the round and the config the writer adds)."""
        return {
            "algo_state": session.snapshot(),
            "history": self.history,
            "snapshots": {int(r): torch.from_numpy(m) for r, m in self.snapshots.items()},
            "membership": self.membership,
            "bytes_sent": self.bytes_sent,
            "wall_seconds": wall,
            "first_train_loss": self.first_train_loss,
            "diverged": self.diverged,
        }

    @classmethod
    def restore(cls, session: Session, data: dict[str, Any]) -> RunState:
        """The RunState of a checkpoint; the session takes its algorithm state."""
        session.restore(data["algo_state"])
        return cls(
            round=int(data["round"]),
            history=list(data["history"]),
            snapshots={int(r): m.numpy() for r, m in data["snapshots"].items()},
            membership=list(data["membership"]),
            bytes_sent=None if data["bytes_sent"] is None else float(data["bytes_sent"]),
            wall_before=float(data["wall_seconds"]),
            first_train_loss=data.get("first_train_loss"),  # (checkpoints before it: None)
            diverged=data.get("diverged"),
        )

    def compact_history(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in h.items() if k != "clients"} for h in self.history]


DIVERGING = 1e3  # a training loss this many times its first value (and above 1000)


def watch_divergence(rs: RunState, r: int, loss: float | None) -> None:
    """Name a run whose training loss grew by orders of magnitude above its first round's
    (finite, so no error stopped it: a step size too large): once, in a warning line
    and in the summary's ``diverged`` (round, loss, first)."""
    if loss is None or rs.diverged is not None:
        return
    if rs.first_train_loss is None:
        rs.first_train_loss = float(loss)
        return
    if loss > DIVERGING * max(abs(rs.first_train_loss), 1.0):
        rs.diverged = {"round": r, "train_loss": float(loss), "first": rs.first_train_loss}
        print(
            f"warning: the run is diverging: training loss {loss:.3g} at round {r}, "
            f"{loss / max(abs(rs.first_train_loss), 1e-12):.3g} times its first "
            f"({rs.first_train_loss:.3g}); a smaller algorithm.lr?",
            file=sys.stderr,
            flush=True,
        )


def eval_rounds(rounds: int, every: int) -> EveryKth:
    """Completed-round counts at which to evaluate: 0, every k-th, and the last."""
    return EveryKth(every, rounds, first=True)


def heatmap_rounds(cfg: Config) -> list[int]:
    if cfg.tracking.heatmap_rounds is not None:
        return sorted({r for r in cfg.tracking.heatmap_rounds if 0 <= r <= cfg.rounds})
    R = cfg.rounds
    return sorted({max(1, R // 100), max(1, R // 10), max(1, R // 2), R})


def finite_or_none(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def eval_record(
    r: int, ev: Evaluation, clusters: list[int | None], agreement: dict[str, float]
) -> dict[str, Any]:
    """One evaluation as a history row: means over clients and every client's numbers."""
    acc = ev.accuracy
    rec: dict[str, Any] = {
        "round": r,
        # nan-aware: clients a failed host took with it read NaN (engine.on_failure=drop)
        "mean_accuracy": finite_or_none(acc.nanmean()) if acc is not None else None,
        "mean_loss": finite_or_none(ev.loss.nanmean()),
        "clients": [
            {
                "id": i,
                "cluster": clusters[i],
                "accuracy": finite_or_none(acc[i]) if acc is not None else None,
                "loss": finite_or_none(ev.loss[i]),
            }
            for i in range(len(ev.loss))
        ],
    }
    rec.update(agreement)
    return rec


def change_membership(
    cfg: Config, session: Session, rs: RunState, kind: str, ids: list[int], t: int
) -> None:
    """Clients ``ids`` join or leave after t completed rounds (sessions whose method has
    elastic clients, e.g. CoBo)."""
    if not ids:
        return
    n = session.n_clients
    bad = [c for c in ids if not 0 <= c < n]
    if bad:
        raise ConfigError(f"invalid config key 'schedule': client {bad[0]} is not in 0..{n - 1}")
    if not session.elastic:
        raise ConfigError(
            f"invalid config key 'schedule': algorithm '{cfg.algorithm.name}' has no clients "
            "joining or leaving (cobo has)"
        )
    rs.membership.append({"round": t, "event": kind, "clients": list(ids)})
    session.change_membership(kind, list(ids), t)


class Loop:
    """Steps a RunState one round at a time and tells the run directory, then the other
    callbacks (tracking, sweeps, ...): a round's rows reach the run directory before the
    checkpoint that covers them, the callbacks see that checkpoint (``ctx.checkpoint``)."""

    def __init__(
        self,
        cfg: Config,
        session: Session,
        task: Task,
        ctx: RunContext,
        rs: RunState,
        writer: RunDir,
        callbacks: list,
        start: float,
        held=contextlib.nullcontext,
    ):
        self.cfg, self.session, self.task, self.ctx, self.rs = cfg, session, task, ctx, rs
        self.writer, self.callbacks, self.start = writer, callbacks, start
        self.held = held  # a block a signal does not cut (experiment._Signals.held)
        self.evals = eval_rounds(cfg.rounds, cfg.eval_every)
        self.snap_at = set(heatmap_rounds(cfg))
        self.ckpt_at = cfg.checkpoint_rounds()

    def record(self, r: int, stats: dict[str, float]) -> dict[str, Any]:
        session = self.session
        ev = session.evaluate()
        row = eval_record(r, ev, self.ctx.clusters, session.agreement(session.collaboration()))
        if self.task.perplexity:  # language models: per-client validation perplexity
            row["mean_perplexity"] = finite_or_none(torch.exp(ev.loss.double()).nanmean())
        row.update({k: v for k, v in stats.items() if k not in row})
        self.rs.history.append(row)
        return row

    def first_evaluation(self) -> None:
        row = self.record(0, {})
        self.writer.on_eval(self.ctx, 0, row)
        self.tell_eval(0, row)

    def step(self) -> tuple[dict[str, Any] | None, dict[str, float]]:
        cfg, session, ctx, rs = self.cfg, self.session, self.ctx, self.rs
        t = rs.round
        for ev in cfg.schedule:  # joins and leaves after t completed rounds
            if ev.round == t:
                for kind in ("leave", "join"):
                    change_membership(cfg, session, rs, kind, getattr(ev, kind), t)
        while ctx.requests:  # asked for through the RunContext API
            kind, ids = ctx.requests.pop(0)
            change_membership(cfg, session, rs, kind, ids, t)
        stats = session.round(t)
        r = t + 1
        if not all(math.isfinite(v) for v in stats.values()):
            raise FloatingPointError(f"non-finite training statistics at round {r}: {stats}")
        with self.held():  # the round's count and its rounds.csv row, together
            rs.round = r
            if "bytes_sent" in stats:
                rs.bytes_sent = (rs.bytes_sent or 0.0) + stats["bytes_sent"]
            watch_divergence(rs, r, stats.get("train_loss"))
            self.writer.on_round_end(ctx, r, stats)
        for cb in self.callbacks:
            cb.on_round_end(ctx, r, stats)
        if r in self.snap_at:
            W = session.collaboration()
            if W is not None:
                rs.snapshots[r] = W.detach().float().cpu().numpy()
        row = self.record(r, stats) if r in self.evals else None
        if row is not None:
            self.writer.on_eval(ctx, r, row)
        if r in self.ckpt_at:
            wall = rs.wall_before + time.perf_counter() - self.start
            payload = rs.payload(session, wall)
            payload["mlflow_run_id"] = ctx.mlflow_run_id
            ctx.checkpoint = (r, self.writer.checkpoint(r, payload))
        if row is not None:
            self.tell_eval(r, row)
        return row, stats

    def tell_eval(self, r: int, row: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_eval(self.ctx, r, row)
