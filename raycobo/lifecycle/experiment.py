"""One experiment: config -> run directory + summary, in five steps:
open the directory -> build the session -> restore or start -> loop -> finish.

The run's progress is one object (:class:`RunState`, ``loop.py``); the algorithm state
lives in the session (``raycobo.engine.session``), whichever engine it is; what the run
writes is a callback of its own (:class:`RunDir`). Checkpoints hold both, so
``resume=True`` continues a run from its latest checkpoint with the same numbers as a
run that was never interrupted (bit for bit on the local engine: all randomness is
counter-based). Tracking and progress are callbacks; the loop knows neither MLflow nor
Ray.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from raycobo.config import Config, ConfigError, load_stored_config, read_yaml, with_overrides
from raycobo.engine import Session, Task, open_session
from raycobo.lifecycle.callbacks import Callback, RunContext, StopRun
from raycobo.lifecycle.loop import Loop, RunState, change_membership
from raycobo.lifecycle.plugins import check_plugins
from raycobo.lifecycle.result import Result
from raycobo.lifecycle.run_dir import RESUMABLE_KEYS, Resume, RunDir, stored_config_path


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


def default_run_dir(cfg: Config, root: str | Path = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(root) / f"{stamp}-{cfg.name}-{cfg.algorithm.name}"


def resume_config(
    run_dir: str | Path, overrides: list[str] | None = None, trust_files: bool = False
) -> Config:
    """The stored config of ``run_dir`` with the overrides a resume allows (``rounds=``).
    Plugin code it names is imported only when the run recorded it (``trust_files``: in
    any case)."""
    path = stored_config_path(Path(run_dir))
    check_plugins(Path(run_dir), read_yaml(path), "run directory", trust_files)
    cfg = load_stored_config(path)
    over = list(overrides or [])
    for item in over:
        key = item.partition("=")[0].strip()
        if key not in RESUMABLE_KEYS:
            raise ConfigError(
                f"cannot override '{key}' when resuming {run_dir}: a resumed run keeps its "
                "config (only rounds=N, to extend it)"
            )
    return with_overrides(cfg, over) if over else cfg


SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Signals:
    """In the main thread, SIGTERM raises :class:`Terminated` (like Ctrl-C's
    KeyboardInterrupt) so the run ends through its interrupted path; ``deferred()`` holds
    both signals back while the failure summary is written."""

    def __init__(self):
        self.main = threading.current_thread() is threading.main_thread()
        self.previous = None
        self.received: int | None = None  # SIGTERM arrived (the run is ending)

    def install(self) -> None:
        """(Again, after Ray's init replaced the handler with its own.)"""
        if self.main:
            prev = signal.signal(signal.SIGTERM, self._raise)
            if self.previous is None:
                self.previous = prev

    def _raise(self, signum, frame):
        self.received = signum
        raise Terminated("SIGTERM")

    def restore(self) -> None:
        if self.main and self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    @contextlib.contextmanager
    def deferred(self):
        if not self.main:
            yield
            return
        held = [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)]
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, held[0])
            signal.signal(signal.SIGTERM, held[1])

    @contextlib.contextmanager
    def held(self):
        """A signal that arrives inside ends the run once the block is done (a round's
        count and its rows.csv row are written together), not in its middle."""
        if not self.main:
            yield
            return
        got: list[int] = []
        kept = {s: signal.signal(s, lambda n, _f: got.append(n)) for s in SIGNALS}
        try:
            yield
        finally:
            for s, handler in kept.items():
                signal.signal(s, handler)
        if got:
            handler = kept[got[0]]
            if callable(handler):
                handler(got[0], None)  # ours raises Terminated, Python's KeyboardInterrupt
            elif handler == signal.SIG_DFL:
                signal.raise_signal(got[0])


def run_experiment(
    cfg: Config,
    out: str | Path | None = None,
    callbacks: list[Callback] | tuple[Callback, ...] = (),
    progress: Any = None,
    resume: bool = False,
    start_from: Path | None = None,
) -> Result:
    """Run ``cfg`` and write its run directory. ``progress`` is an optional object with
    ``start(total)``, ``advance(stats, row)`` and ``stop()`` (``raycobo.lifecycle.progress``).
    ``resume``: continue the run in ``out`` from its latest checkpoint (from round 0 when
    it has none). ``start_from``: a new run that starts from another run's checkpoint
    (its models, W, round and history) under ``cfg``'s settings -- how population-based
    training continues a better trial with perturbed values; the summary names it."""
    if resume and out is None:
        raise ConfigError("resume needs the run directory to continue")
    if resume and start_from is not None:
        raise ConfigError("a run either resumes its own directory or starts from a checkpoint")
    cfg = cfg.pinned()  # the record says what ran, whatever later defaults are
    writer = RunDir(Path(out) if out is not None else default_run_dir(cfg), cfg)
    signals = _Signals()
    signals.install()
    try:
        found = writer.open(resume)  # the lock, the checks, config.yaml, a running summary
        return _run(cfg, writer, found, list(callbacks), progress, signals, start_from)
    finally:
        writer.close()
        signals.restore()


def _run(cfg, writer: RunDir, found: Resume | None, callbacks, progress, signals, start_from):
    ctx = RunContext(cfg, writer.path, provenance=writer.provenance)
    start = time.perf_counter()
    session: Session | None = None
    rs: RunState | None = None
    try:
        session, task = open_session(cfg)
        signals.install()  # Ray's init installs a SIGTERM handler of its own
        # the plotting modules now, not at the end: a SIGTERM landing inside a C
        # extension's initialization (matplotlib's) surfaced as "ImportError:
        # initialization failed", a failed run instead of an interrupted one
        import raycobo.plots  # noqa: F401

        _say_data(cfg, task, progress is not None)
        ctx.n_clients, ctx.clusters = session.n_clients, list(session.clusters)
        ctx.resumed_mlflow_run_id = found.mlflow_run_id if found is not None else None
        for cb in callbacks:
            cb.on_run_start(ctx)
        rs = _restore_or_start(cfg, session, found, start_from)
        loop = Loop(cfg, session, task, ctx, rs, writer, callbacks, start, signals.held)
        if not rs.history:  # a new run (or one resumed before its first checkpoint)
            loop.first_evaluation()
        if progress is not None:
            progress.start(cfg.rounds, done=rs.round)
        while rs.round < cfg.rounds:
            row, stats = loop.step()
            if progress is not None:
                progress.advance(stats, row)
        summary = _finish(cfg, session, task, ctx, rs, start, writer)
        if start_from is not None:
            summary["started_from"] = str(start_from)
            writer.write_summary(summary)
    except StopRun as stop:  # a callback's decision (a sweep's scheduler): not a failure
        with signals.deferred():
            summary = _record_stop(stop, writer, ctx, rs, start)
    except BaseException as caught:  # keep what was measured, say where, re-raise
        if isinstance(caught, ConfigError) and session is None and found is None:
            writer.discard()  # a new run refused as it starts: no run directory is left
            raise
        _fail(caught, writer, ctx, rs, start, callbacks, signals)
    finally:
        if progress is not None:
            progress.stop()
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()
    for cb in callbacks:
        cb.on_run_end(ctx, summary)
    return Result(writer.path, summary)


def _fail(caught: BaseException, writer: RunDir, ctx, rs, start, callbacks, signals) -> None:
    """Record how the run ended and raise what says so: the interruption (with where it
    stopped), a ConfigError as it is, anything else as RunFailed."""
    err = caught
    if signals.received is not None and not isinstance(err, KeyboardInterrupt):
        # what broke once SIGTERM had arrived is the interruption (raised inside a C
        # extension's import, matplotlib's at the end, it surfaces as ImportError)
        err = Terminated("SIGTERM")
    with signals.deferred():
        last, unwritten = _record_failure(err, writer, ctx, rs, start, callbacks)
    if isinstance(err, KeyboardInterrupt):  # the message says where and how to go on
        err.run_dir, err.last_round = writer.path, last  # type: ignore[attr-defined]
    if isinstance(err, ConfigError | KeyboardInterrupt):
        if err is caught:
            raise caught
        raise err from None
    reason = _reason(err) + (f"; {unwritten}" if unwritten else "")
    raise RunFailed(writer.path, reason, last) from err


def _say_data(cfg: Config, task: Task, show: bool) -> None:
    """The data report's line (with the progress) and its warnings (always)."""
    from raycobo.data.report import describe, warnings

    if task.data is None:
        return
    if show:
        print(describe(task.data), file=sys.stderr, flush=True)
    for line in warnings(task.data, cfg):
        print(line, file=sys.stderr, flush=True)


def _restore_or_start(
    cfg: Config, session: Session, found: Resume | None, start_from: Path | None
) -> RunState:
    if found is not None and found.data is not None:
        return RunState.restore(session, found.data)
    if start_from is not None:
        from raycobo.lifecycle.checkpoint import read_checkpoint

        return RunState.restore(session, read_checkpoint(Path(start_from)))
    session.start()
    rs = RunState()
    change_membership(cfg, session, rs, "leave", cfg.initially_absent(), 0)
    return rs


def _reason(err: BaseException) -> str:
    if isinstance(err, KeyboardInterrupt):
        return "SIGTERM" if isinstance(err, Terminated) else "SIGINT"
    return f"{type(err).__name__}: {err}{_user_frame(err)}"


def _user_frame(err: BaseException) -> str:
    """' (at FILE:LINE in FUNC)' for the innermost frame of the traceback in code that is
    neither raycobo's nor an installed package's (a plugin), or ''."""
    import sys
    import traceback

    ours = str(Path(__file__).resolve().parents[1])
    installed = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix)}
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not str(Path(f.filename).resolve()).startswith((ours, *installed))
        and not f.filename.startswith("<")
    ]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno} in {f.name})"


def _record_failure(err, writer: RunDir, ctx: RunContext, rs, start, callbacks):
    """The failed or interrupted summary, and the callbacks told. -> (the last round,
    None or why the summary could not be written)"""
    status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
    reason = _reason(err)
    progress = (rs.round, rs.compact_history(), rs.wall_before) if rs is not None else None
    wall = time.perf_counter() - start
    last, unwritten = writer.fail(status, reason, progress, wall, ctx.mlflow_run_id)
    ended = {"status": status, "error": reason, "last_round": last}
    for cb in callbacks:
        with contextlib.suppress(Exception):  # reporting must not mask the error
            cb.on_run_end(ctx, ended)
    return last, unwritten


def _record_stop(stop: StopRun, writer: RunDir, ctx: RunContext, rs, start) -> dict:
    """The ``stopped`` summary: who stopped the run, the round, the last evaluation's
    metrics (the callbacks are told by the caller, as for a completed run)."""
    last = rs.history[-1] if rs is not None and rs.history else {}
    metrics = {k: last.get(k) for k in ("mean_accuracy", "mean_loss", "mean_perplexity")}
    progress = (rs.round, rs.compact_history(), rs.wall_before) if rs is not None else None
    wall = time.perf_counter() - start
    extra = {"stopped_by": stop.by, **metrics}
    round_, _ = writer.fail("stopped", None, progress, wall, ctx.mlflow_run_id, extra)
    return {"status": "stopped", "last_round": round_, **extra}


def _finish(cfg, session: Session, task: Task, ctx, rs: RunState, start, writer) -> dict:
    """The final summary and files (W, snapshots, artifacts, plots)."""
    W = session.collaboration()
    W_np = W.detach().float().cpu().numpy() if W is not None else None
    final = rs.history[-1]
    summary = {
        "status": "completed",
        "name": cfg.name,
        "algorithm": cfg.algorithm.name,
        "engine": cfg.engine.kind,
        "dataset": cfg.data.name,
        "model": task.model,
        "n_clients": session.n_clients,
        "data": task.data,  # what the clients got
        "rounds": cfg.rounds,
        "last_round": rs.round,
        "seed": cfg.seed,
        "mean_accuracy": final["mean_accuracy"],
        "mean_loss": final["mean_loss"],
        "mean_perplexity": final.get("mean_perplexity"),
        "clients": final["clients"],
        "collaboration": W_np.tolist() if W_np is not None else None,
        # the least w_ij the update reads (CoBo's pull threshold; null: all of W)
        "collaboration_cut": cfg.algorithm.collaboration_cut() if W_np is not None else None,
        "cluster_agreement": session.agreement(W),
        "megabytes_sent": rs.bytes_sent / 1e6 if rs.bytes_sent is not None else None,
        # the round where the training loss exploded (finite: nothing stopped the run)
        "diverged": rs.diverged,
        "membership": rs.membership,
        "history": rs.compact_history(),
        "resumed_from_round": writer.resumed_from_round,
        "wall_seconds": rs.wall_before + time.perf_counter() - start,
        "mlflow_run_id": ctx.mlflow_run_id,
        "provenance": ctx.provenance,
        **session.report(),
    }
    if W_np is not None:
        rs.snapshots.setdefault(cfg.rounds, W_np)
    writer.finish(summary, W_np, rs.snapshots, session.artifacts(), ctx.clusters)
    return summary
