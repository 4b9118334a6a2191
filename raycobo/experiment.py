"""One experiment: config -> data, model, algorithm, engine -> run directory + summary.

The run's state is one object, :class:`RunState` (the algorithm's state, the round
reached, the history of evaluations, W snapshots, membership changes, counters), stepped
by a short loop. What the run writes is a callback of its own (:class:`RunDir`, next to
the MLflow one); checkpoints hold the whole RunState, so ``resume=True`` continues a run
from its latest checkpoint with the same numbers as a run that was never interrupted
(bit for bit on the local engine: all randomness is counter-based).

Tracking and progress are callbacks; the training loop knows neither MLflow nor Ray.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raycobo import checkpoint as ckpt
from raycobo.algorithms import build_algorithm, evaluate
from raycobo.algorithms.base import (
    Elastic,
    Evaluation,
    ExportsArtifacts,
    HoldsStateElsewhere,
    KeepsOwnAgreement,
    ReportsExtras,
)
from raycobo.callbacks import Callback, RunContext
from raycobo.config import Config, ConfigError, load_stored_config, with_overrides
from raycobo.run_dir import RunDir


class RunFailed(RuntimeError):
    """A run broke after its run directory existed; what it measured is kept there."""

    def __init__(self, run_dir: Path, reason: str, last_round: int = 0):
        super().__init__(f"run failed: {reason} (partial results in {run_dir})")
        self.run_dir = run_dir
        self.reason = reason
        self.last_round = last_round

    def __reduce__(self):
        # raised inside Ray workers (sweep trials, parallel compare) and re-raised in the
        # driver: rebuilt from its own arguments, not from the formatted message
        return (type(self), (self.run_dir, self.reason, self.last_round))


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, ``ray stop``, a pre-empted node): handled like Ctrl-C."""


@dataclass
class Result:
    run_dir: Path
    summary: dict[str, Any]


@dataclass
class RunState:
    """Everything a run needs to continue: what a checkpoint holds."""

    algo_state: Any
    round: int = 0  # completed rounds
    history: list[dict[str, Any]] = field(default_factory=list)  # evaluations so far
    snapshots: dict[int, np.ndarray] = field(default_factory=dict)  # W at heatmap rounds
    membership: list[dict[str, Any]] = field(default_factory=list)  # joins/leaves applied
    bytes_sent: float = 0.0  # communication, for methods that count it
    wall_before: float = 0.0  # seconds spent before a resume

    def payload(self, algo, wall: float) -> dict[str, Any]:
        elsewhere = isinstance(algo, HoldsStateElsewhere)  # the Ray engine's coordinator
        return {
            "algo_state": algo.checkpoint_state()
            if elsewhere
            else ckpt.state_tree(self.algo_state),
            "history": self.history,
            "snapshots": {int(r): torch.from_numpy(m) for r, m in self.snapshots.items()},
            "membership": self.membership,
            "bytes_sent": self.bytes_sent,
            "wall_seconds": wall,
        }

    @classmethod
    def restore(cls, algo, template: Any, data: dict[str, Any]) -> RunState:
        if isinstance(algo, HoldsStateElsewhere):
            algo.restore_state(data["algo_state"])
            state = template
        else:
            state = ckpt.load_into(template, data["algo_state"])
        return cls(
            algo_state=state,
            round=int(data["round"]),
            history=list(data["history"]),
            snapshots={int(r): m.numpy() for r, m in data["snapshots"].items()},
            membership=list(data["membership"]),
            bytes_sent=float(data["bytes_sent"]),
            wall_before=float(data["wall_seconds"]),
        )


def default_run_dir(cfg: Config, root: str | Path = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return Path(root) / f"{stamp}-{cfg.name}-{cfg.algorithm.name}"


def eval_rounds(rounds: int, every: int) -> set[int]:
    """Completed-round counts at which to evaluate: 0, every k-th, and the last."""
    return {0, rounds, *range(every, rounds + 1, every)}


def heatmap_rounds(cfg: Config) -> list[int]:
    if cfg.tracking.heatmap_rounds is not None:
        return sorted({r for r in cfg.tracking.heatmap_rounds if 0 <= r <= cfg.rounds})
    R = cfg.rounds
    return sorted({max(1, R // 100), max(1, R // 10), max(1, R // 2), R})


def cluster_agreement(W: torch.Tensor, clusters: list[int | None]) -> dict[str, float]:
    """Mean off-diagonal W inside and across ground-truth clusters."""
    if W is None or any(c is None for c in clusters) or W.shape[0] < 2:
        return {}
    cl = torch.tensor(clusters)
    same = cl[:, None] == cl[None, :]
    off = ~torch.eye(len(cl), dtype=torch.bool)
    Wc = W.detach().float().cpu()
    out = {}
    if (same & off).any():
        out["w_within"] = float(Wc[same & off].mean())
    if (~same).any():
        out["w_across"] = float(Wc[~same].mean())
    return out


def _clean(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


RESUMABLE_KEYS = {"rounds"}


def resume_config(run_dir: str | Path, overrides: list[str] | None = None) -> Config:
    """The stored config of ``run_dir`` with the overrides a resume allows (``rounds=``)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"nothing to resume in {run_dir}: no config.yaml (not a run directory)")
    cfg = load_stored_config(run_dir / "config.yaml")
    over = list(overrides or [])
    for item in over:
        key = item.partition("=")[0].strip()
        if key not in RESUMABLE_KEYS:
            raise ConfigError(
                f"cannot override '{key}' when resuming {run_dir}: a resumed run keeps its "
                "config (only rounds=N, to extend it)"
            )
    return with_overrides(cfg, over) if over else cfg


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """In the main thread, SIGTERM raises :class:`Terminated` (like Ctrl-C's
    KeyboardInterrupt) so the run ends through its interrupted path."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_experiment(
    cfg: Config,
    out: str | Path | None = None,
    callbacks: list[Callback] | tuple[Callback, ...] = (),
    progress: Any = None,
    resume: bool = False,
) -> Result:
    """Run ``cfg`` and write its run directory. ``progress`` is an optional object with
    ``start(total)``, ``advance(stats)`` and ``stop()`` (see ``raycobo.progress``).
    ``resume``: continue the run in ``out`` from its latest checkpoint (from round 0 when
    it has none)."""
    if resume and out is None:
        raise ConfigError("resume needs the run directory to continue")
    writer = RunDir(Path(out) if out is not None else default_run_dir(cfg), cfg)
    found = writer.open(resume)  # the lock, the checks, config.yaml, a running summary
    with _sigterm_as_interrupt():
        try:
            return _run(cfg, writer, found, list(callbacks), progress)
        finally:
            writer.close()


def _run(cfg: Config, writer: RunDir, found, callbacks: list, progress: Any) -> Result:
    run_dir = writer.path
    if cfg.engine.threads:
        torch.set_num_threads(cfg.engine.threads)
    ctx = RunContext(cfg, run_dir)
    start = time.perf_counter()
    rs: RunState | None = None
    algo = ops = None
    try:
        ops, algo = build_run(cfg)
        ctx.n_clients, ctx.clusters = ops.n_clients, list(ops.clusters)
        if found is not None:
            data = ckpt.read_checkpoint(found[1])
        # a resumed run continues its MLflow run (also when it had no checkpoint yet)
        ctx.resumed_mlflow_run_id = (writer.previous or {}).get("mlflow_run_id") or (
            data.get("mlflow_run_id") if found is not None else None
        )
        for cb in callbacks:
            cb.on_run_start(ctx)
        template = algo.init(ops)
        if found is None:
            rs = RunState(template)
            rs.algo_state = _apply(
                algo, rs.algo_state, "leave", cfg.initially_absent(), ops.n_clients, 0, rs
            )
        else:
            rs = RunState.restore(algo, template, data)
        loop = _Loop(cfg, algo, ops, ctx, rs, writer, callbacks, start)
        if found is None:
            row = loop.record(0, {})
            writer.on_eval(ctx, 0, row)
            loop.tell_eval(0, row)
        if progress is not None:
            progress.start(cfg.rounds)
            for _ in range(rs.round):
                progress.advance({}, None)
        while rs.round < cfg.rounds:
            row, stats = loop.step()
            if progress is not None:
                progress.advance(stats, row)
    except BaseException as err:  # keep what was measured, say where, re-raise
        _close(ops)
        if progress is not None:
            progress.stop()
        interrupted = isinstance(err, KeyboardInterrupt)
        reason = (
            ("SIGTERM" if isinstance(err, Terminated) else "SIGINT")
            if interrupted
            else f"{type(err).__name__}: {err}"
        )
        if rs is not None:
            last, history, before = rs.round, _compact(rs.history), rs.wall_before
        else:  # failed while starting: a resumed directory still holds its checkpoint
            prev = (writer.previous or {}) if found is not None else {}
            last = found[0] if found is not None else 0
            history = [h for h in prev.get("history", []) if h.get("round", 0) <= last]
            before = prev.get("wall_seconds", 0.0)
        extra = {
            "history": history,
            "wall_seconds": before + time.perf_counter() - start,
            "mlflow_run_id": ctx.mlflow_run_id
            or ((writer.previous or {}).get("mlflow_run_id") if found is not None else None),
        }
        status = "interrupted" if interrupted else "failed"
        writer.fail(status, reason, last, extra)
        ended = {"status": status, "error": reason, "last_round": last}
        for cb in callbacks:
            with contextlib.suppress(Exception):  # reporting must not mask the error
                cb.on_run_end(ctx, ended)
        if isinstance(err, ConfigError | KeyboardInterrupt):
            raise
        raise RunFailed(run_dir, reason, last) from err
    if progress is not None:
        progress.stop()
    W = algo.collaboration(rs.algo_state)
    W_np = W.detach().float().cpu().numpy() if W is not None else None
    summary = _final_summary(cfg, algo, ops, ctx, rs, found, start, W, W_np)
    if W_np is not None:
        rs.snapshots.setdefault(cfg.rounds, W_np)
    artifacts = algo.artifacts(rs.algo_state) if isinstance(algo, ExportsArtifacts) else {}
    _close(ops)
    writer.finish(summary, W_np, rs.snapshots, artifacts, ctx.clusters)
    for cb in callbacks:
        cb.on_run_end(ctx, summary)
    return Result(run_dir, summary)


class _Loop:
    """Steps a RunState one round at a time and tells the run directory, then the other
    callbacks (tracking, sweeps, ...): a round's rows reach the run directory before the
    checkpoint that covers them, the callbacks see that checkpoint (``ctx.checkpoint``)."""

    def __init__(self, cfg, algo, ops, ctx, rs: RunState, writer: RunDir, callbacks, start):
        self.cfg, self.algo, self.ops, self.ctx, self.rs = cfg, algo, ops, ctx, rs
        self.writer, self.callbacks, self.start = writer, callbacks, start
        self.evals = eval_rounds(cfg.rounds, cfg.eval_every)
        self.snap_at = set(heatmap_rounds(cfg))
        self.ckpt_at = cfg.checkpoint_rounds()
        self.text_task = cfg.data.name == "multilingual_text"

    def record(self, r: int, stats: dict[str, float]) -> dict[str, Any]:
        algo, state, ctx = self.algo, self.rs.algo_state, self.ctx
        ev = evaluate(algo, state, self.ops)
        W = algo.collaboration(state)
        row = _eval_record(r, ev, ctx.clusters, agreement_of(algo, state, W, ctx.clusters))
        if self.text_task:  # language models: per-client validation perplexity
            row["mean_perplexity"] = _clean(torch.exp(ev.loss.double()).nanmean())
        row.update({k: v for k, v in stats.items() if k not in row})
        self.rs.history.append(row)
        return row

    def step(self) -> tuple[dict[str, Any] | None, dict[str, float]]:
        cfg, algo, ops, ctx, rs = self.cfg, self.algo, self.ops, self.ctx, self.rs
        t = rs.round
        for ev in cfg.schedule:  # joins and leaves after t completed rounds
            if ev.round == t:
                for kind in ("leave", "join"):
                    ids = getattr(ev, kind)
                    rs.algo_state = _apply(algo, rs.algo_state, kind, ids, ops.n_clients, t, rs)
        while ctx.requests:  # asked for through the RunContext API
            kind, ids = ctx.requests.pop(0)
            rs.algo_state = _apply(algo, rs.algo_state, kind, ids, ops.n_clients, t, rs)
        rs.algo_state, stats = algo.round(rs.algo_state, t, ops)
        r = t + 1
        if not all(math.isfinite(v) for v in stats.values()):
            raise FloatingPointError(f"non-finite training statistics at round {r}: {stats}")
        rs.round = r
        rs.bytes_sent += stats.get("bytes_sent", 0.0)
        for cb in (self.writer, *self.callbacks):
            cb.on_round_end(ctx, r, stats)
        if r in self.snap_at:
            W = algo.collaboration(rs.algo_state)
            if W is not None:
                rs.snapshots[r] = W.detach().float().cpu().numpy()
        row = self.record(r, stats) if r in self.evals else None
        if row is not None:
            self.writer.on_eval(ctx, r, row)
        if r in self.ckpt_at:
            wall = rs.wall_before + time.perf_counter() - self.start
            payload = rs.payload(algo, wall)
            payload["mlflow_run_id"] = ctx.mlflow_run_id
            ctx.checkpoint = (r, self.writer.checkpoint(r, payload))
        if row is not None:
            self.tell_eval(r, row)
        return row, stats

    def tell_eval(self, r: int, row: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_eval(self.ctx, r, row)


def _compact(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if k != "clients"} for h in history]


def _final_summary(cfg, algo, ops, ctx, rs: RunState, found, start, W, W_np) -> dict[str, Any]:
    final = rs.history[-1]
    state = rs.algo_state
    extras = algo.summary_extras() if isinstance(algo, ReportsExtras) else None
    summary = {
        "status": "completed",
        "name": cfg.name,
        "algorithm": cfg.algorithm.name,
        "engine": cfg.engine.kind,
        "dataset": cfg.data.name,
        "model": cfg.model.name if cfg.data.name != "quadratic" else None,
        "n_clients": ops.n_clients,
        "rounds": cfg.rounds,
        "last_round": rs.round,
        "seed": cfg.seed,
        "mean_accuracy": final["mean_accuracy"],
        "mean_loss": final["mean_loss"],
        "mean_perplexity": final.get("mean_perplexity"),
        "clients": final["clients"],
        "collaboration": W_np.tolist() if W_np is not None else None,
        "cluster_agreement": agreement_of(algo, state, W, ctx.clusters),
        "megabytes_sent": rs.bytes_sent / 1e6 if rs.bytes_sent else None,
        "membership": rs.membership,
        "history": _compact(rs.history),
        "resumed_from_round": found[0] if found is not None else None,
        "wall_seconds": rs.wall_before + time.perf_counter() - start,
        "mlflow_run_id": ctx.mlflow_run_id,
    }
    if extras is not None:
        summary["engine_report"] = extras
    execution = getattr(ops, "execution", None)  # the local engine's strategy and chunks
    if execution is not None:
        summary["execution"] = execution.as_dict()
    return summary


def _apply(algo, state, kind: str, ids: list[int], n: int, t: int, rs: RunState) -> Any:
    """Clients ``ids`` join or leave after t completed rounds (algorithms with ``join`` /
    ``leave``, e.g. CoBo)."""
    if not ids:
        return state
    bad = [c for c in ids if not 0 <= c < n]
    if bad:
        raise ConfigError(f"invalid config key 'schedule': client {bad[0]} is not in 0..{n - 1}")
    if not isinstance(algo, Elastic):
        name = getattr(algo, "name", type(algo).__name__)
        raise ConfigError(
            f"invalid config key 'schedule': algorithm '{name}' has no clients joining or "
            "leaving (cobo has)"
        )
    rs.membership.append({"round": t, "event": kind, "clients": list(ids)})
    return (algo.join if kind == "join" else algo.leave)(state, list(ids))


def _close(ops) -> None:
    close = getattr(ops, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()


def build_run(cfg: Config):
    """Data, engine ops and algorithm for ``cfg``."""
    from raycobo.data import load_data

    algo = build_algorithm(cfg.algorithm, cfg.rounds, cfg.seed)
    data = load_data(cfg)
    if cfg.engine.kind == "ray":
        from raycobo.engine.ray import make_ray_run

        run = make_ray_run(cfg, data)
        return run, run  # the coordinator holds the state; the driver holds handles
    else:
        from raycobo.engine import make_local_ops

        ops = make_local_ops(cfg, data)
    return ops, algo


def _eval_record(
    r: int, ev: Evaluation, clusters: list[int | None], agreement: dict[str, float]
) -> dict[str, Any]:
    acc = ev.accuracy
    rec: dict[str, Any] = {
        "round": r,
        # nan-aware: clients a failed host took with it read NaN (engine.on_failure=drop)
        "mean_accuracy": _clean(acc.nanmean()) if acc is not None else None,
        "mean_loss": _clean(ev.loss.nanmean()),
        "clients": [
            {
                "id": i,
                "cluster": clusters[i],
                "accuracy": _clean(acc[i]) if acc is not None else None,
                "loss": _clean(ev.loss[i]),
            }
            for i in range(len(ev.loss))
        ],
    }
    rec.update(agreement)
    return rec


def agreement_of(algo, state, W: torch.Tensor | None, clusters: list[int | None]) -> dict:
    """cluster_agreement, from the algorithm when it keeps W in its own (sparse) form."""
    own = isinstance(algo, KeepsOwnAgreement)
    found = algo.cluster_agreement(state, clusters) if own else None
    if found is not None:
        return found
    return cluster_agreement(W, clusters) if W is not None else {}
