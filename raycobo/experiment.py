"""One experiment: config -> data, model, algorithm, engine -> run directory + summary.

The run directory (the contract in README "Run directory"):

- ``config.yaml``        the fully resolved config (written first, before anything runs)
- ``metrics.csv``        one row per evaluation and client: round, client, cluster,
                         accuracy, loss (appended and flushed as the run goes)
- ``rounds.csv``         per-round statistics (train loss, sampled edges, gradients, ...)
- ``summary.json``       final numbers, or ``status: failed`` with the error and the
                         last measured round when a run breaks
- ``collaboration.npy``  the final W when the algorithm has one
- ``<name>.pt``          learned extras an algorithm exports (meta-L2C: ``encoder.pt``)
- ``plots/``             PNG: accuracy/loss curves, W heatmaps

Tracking and progress are callbacks; the training loop knows neither MLflow nor Ray.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raycobo.algorithms import build_algorithm, evaluate
from raycobo.algorithms.base import Evaluation
from raycobo.callbacks import Callback, RunContext
from raycobo.config import Config, ConfigError


class RunFailed(RuntimeError):
    """A run broke after its run directory existed; what it measured is kept there."""

    def __init__(self, run_dir: Path, reason: str):
        super().__init__(f"run failed: {reason} (partial results in {run_dir})")
        self.run_dir = run_dir
        self.reason = reason


@dataclass
class Result:
    run_dir: Path
    summary: dict[str, Any]


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


class _CsvLog:
    def __init__(self, path: Path, columns: list[str]):
        self.path = path
        self.columns = columns
        self._f = path.open("w", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=columns, extrasaction="ignore")
        self._w.writeheader()
        self._f.flush()

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._w.writerows(rows)
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def run_experiment(
    cfg: Config,
    out: str | Path | None = None,
    callbacks: list[Callback] | tuple[Callback, ...] = (),
    progress: Any = None,
) -> Result:
    """Run ``cfg`` and write its run directory. ``progress`` is an optional object with
    ``start(total)``, ``advance(stats)`` and ``stop()`` (see ``raycobo.progress``)."""
    run_dir = Path(out) if out is not None else default_run_dir(cfg)
    if run_dir.exists() and (run_dir / "summary.json").exists():
        raise ConfigError(f"run directory {run_dir} already holds a finished run; choose --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    if cfg.engine.threads:
        torch.set_num_threads(cfg.engine.threads)

    ctx = RunContext(cfg, run_dir)
    start = time.perf_counter()
    metrics_log = _CsvLog(
        run_dir / "metrics.csv", ["round", "client", "cluster", "accuracy", "loss"]
    )
    rounds_log: _CsvLog | None = None
    history: list[dict[str, Any]] = []
    snapshots: dict[int, np.ndarray] = {}
    last_round = 0
    membership: list[dict[str, Any]] = []  # clients joining / leaving, as applied
    bytes_sent = 0.0  # communication, for methods that count it (round stat bytes_sent)
    state = algo = ops = None
    try:
        ops, algo = build_run(cfg)
        ctx.n_clients, ctx.clusters = ops.n_clients, list(ops.clusters)
        for cb in callbacks:
            cb.on_run_start(ctx)
        state = algo.init(ops)
        state = _apply(algo, state, "leave", cfg.initially_absent(), ops.n_clients, 0, membership)
        evals = eval_rounds(cfg.rounds, cfg.eval_every)
        text_task = cfg.data.name == "multilingual_text"
        snap_at = set(heatmap_rounds(cfg))

        def record(r: int, stats: dict[str, float]) -> dict[str, Any]:
            ev = evaluate(algo, state, ops)
            W = algo.collaboration(state)
            row = _eval_record(r, ev, ctx.clusters, agreement_of(algo, state, W, ctx.clusters))
            if text_task:  # language models: per-client validation perplexity
                row["mean_perplexity"] = _clean(torch.exp(ev.loss.double()).nanmean())
            row.update({k: v for k, v in stats.items() if k not in row})
            metrics_log.write(_client_rows(r, ev, ctx.clusters))
            history.append(row)
            for cb in callbacks:
                cb.on_eval(ctx, r, row)
            return row

        record(0, {})
        if progress is not None:
            progress.start(cfg.rounds)
        for t in range(cfg.rounds):
            for ev in cfg.schedule:  # joins and leaves after t completed rounds
                if ev.round == t:
                    for kind in ("leave", "join"):
                        ids = getattr(ev, kind)
                        state = _apply(algo, state, kind, ids, ops.n_clients, t, membership)
            while ctx.requests:  # asked for through the RunContext API
                kind, ids = ctx.requests.pop(0)
                state = _apply(algo, state, kind, ids, ops.n_clients, t, membership)
            state, stats = algo.round(state, t, ops)
            r = t + 1
            last_round = r
            if not all(math.isfinite(v) for v in stats.values()):
                raise FloatingPointError(f"non-finite training statistics at round {r}: {stats}")
            if rounds_log is None:
                rounds_log = _CsvLog(run_dir / "rounds.csv", ["round", *stats.keys()])
            rounds_log.write([{"round": r, **stats}])
            bytes_sent += stats.get("bytes_sent", 0.0)
            for cb in callbacks:
                cb.on_round_end(ctx, r, stats)
            if r in snap_at:
                W = algo.collaboration(state)
                if W is not None:
                    snapshots[r] = W.detach().float().cpu().numpy()
            row = record(r, stats) if r in evals else None
            if progress is not None:
                progress.advance(stats, row)
    except BaseException as err:  # keep what was measured, say where, re-raise
        _close(ops)
        if progress is not None:
            progress.stop()
        metrics_log.close()
        if rounds_log is not None:
            rounds_log.close()
        reason = (
            "interrupted" if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"
        )
        failed = {
            "status": "failed",
            "error": reason,
            "last_round": last_round,
            "algorithm": cfg.algorithm.name,
            "engine": cfg.engine.kind,
            "seed": cfg.seed,
            "rounds": cfg.rounds,
            "history": history,
            "wall_seconds": time.perf_counter() - start,
            "mlflow_run_id": ctx.mlflow_run_id,
        }
        (run_dir / "summary.json").write_text(json.dumps(failed, indent=2))
        for cb in callbacks:
            with contextlib.suppress(Exception):  # reporting must not mask the error
                cb.on_run_end(ctx, failed)
        if isinstance(err, ConfigError | KeyboardInterrupt):
            raise
        raise RunFailed(run_dir, reason) from err
    if progress is not None:
        progress.stop()
    metrics_log.close()
    if rounds_log is not None:
        rounds_log.close()

    final = history[-1]
    W = algo.collaboration(state)
    extras = algo.summary_extras() if hasattr(algo, "summary_extras") else None
    for name, obj in (algo.artifacts(state) if hasattr(algo, "artifacts") else {}).items():
        torch.save(obj, run_dir / f"{name}.pt")  # e.g. meta-L2C's encoder, for transfer
    _close(ops)
    W_np = W.detach().float().cpu().numpy() if W is not None else None
    if W_np is not None:
        np.save(run_dir / "collaboration.npy", W_np)
        snapshots.setdefault(cfg.rounds, W_np)
        np.savez_compressed(
            run_dir / "collaboration_rounds.npz", **{f"round_{r}": m for r, m in snapshots.items()}
        )
    summary = {
        "status": "completed",
        "name": cfg.name,
        "algorithm": cfg.algorithm.name,
        "engine": cfg.engine.kind,
        "dataset": cfg.data.name,
        "model": cfg.model.name if cfg.data.name != "quadratic" else None,
        "n_clients": ops.n_clients,
        "rounds": cfg.rounds,
        "seed": cfg.seed,
        "mean_accuracy": final["mean_accuracy"],
        "mean_loss": final["mean_loss"],
        "mean_perplexity": final.get("mean_perplexity"),
        "clients": final["clients"],
        "collaboration": W_np.tolist() if W_np is not None else None,
        "cluster_agreement": agreement_of(algo, state, W, ctx.clusters),
        "megabytes_sent": bytes_sent / 1e6 if bytes_sent else None,
        "membership": membership,
        "history": [{k: v for k, v in h.items() if k != "clients"} for h in history],
        "wall_seconds": time.perf_counter() - start,
        "mlflow_run_id": ctx.mlflow_run_id,
    }
    if extras is not None:
        summary["engine_report"] = extras
    from raycobo import plots

    plots.write_run_plots(run_dir, summary, snapshots, ctx.clusters)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    for cb in callbacks:
        cb.on_run_end(ctx, summary)
    return Result(run_dir, summary)


def _apply(algo, state, kind: str, ids: list[int], n: int, t: int, log: list) -> Any:
    """Clients ``ids`` join or leave after t completed rounds (algorithms with ``join`` /
    ``leave``, e.g. CoBo)."""
    if not ids:
        return state
    bad = [c for c in ids if not 0 <= c < n]
    if bad:
        raise ConfigError(f"invalid config key 'schedule': client {bad[0]} is not in 0..{n - 1}")
    fn = getattr(algo, kind, None)
    if fn is None:
        name = getattr(algo, "name", type(algo).__name__)
        raise ConfigError(
            f"invalid config key 'schedule': algorithm '{name}' has no clients joining or "
            "leaving (cobo has)"
        )
    log.append({"round": t, "event": kind, "clients": list(ids)})
    return fn(state, list(ids))


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
        from raycobo.engine.ray_engine import make_ray_run

        run = make_ray_run(cfg, data)
        return run, run  # the coordinator holds the state; the driver holds handles
    else:
        from raycobo.engine import make_local_ops

        ops = make_local_ops(cfg, data)
    return ops, algo


def _client_rows(r: int, ev: Evaluation, clusters: list[int | None]) -> list[dict[str, Any]]:
    acc = ev.accuracy.tolist() if ev.accuracy is not None else [None] * len(ev.loss)
    return [
        {"round": r, "client": i, "cluster": clusters[i], "accuracy": a, "loss": float(lv)}
        for i, (a, lv) in enumerate(zip(acc, ev.loss.tolist(), strict=True))
    ]


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
    custom = getattr(algo, "cluster_agreement", None)
    found = custom(state, clusters) if custom is not None else None
    if found is not None:
        return found
    return cluster_agreement(W, clusters) if W is not None else {}
