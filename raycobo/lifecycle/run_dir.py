"""The run directory: one writer, crash-safe files, checkpoints (the contract in
docs/reference/run-directory.md and docs/howto/long-runs.md).

- ``config.yaml``        the fully resolved config (written first)
- ``summary.json``       ``status: running`` from the start, then replaced atomically by the
                         final summary (``completed``) or by ``failed`` / ``interrupted``
                         with the error and the last round reached, or ``stopped`` (a
                         sweep's scheduler ended it early) with who and its last metrics
- ``metrics.csv``        one row per evaluation and client (appended and flushed)
- ``rounds.csv``         per-round statistics (train loss, sampled edges, gradients, ...)
- ``checkpoints/``       ``round_000120.pt``: everything needed to continue the run
- ``collaboration.npy``  the final W when the algorithm has one
- ``<name>.pt``          learned extras an algorithm exports (meta-L2C: ``encoder.pt``)
- ``plots/``             PNG: accuracy/loss curves, W heatmaps
- ``.lock``              held (flock) by the process writing the directory; holds its pid

:class:`RunDir` is a run callback (rows arrive through ``on_round_end`` / ``on_eval``) with
the life-cycle calls the training loop makes itself (``open``, ``checkpoint``, ``finish``,
``fail``, ``close``). ``open`` decides everything a resume needs in one place and returns
it as a :class:`Resume` record.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from raycobo.config import Config, ConfigError
from raycobo.lifecycle import checkpoint as ckpt
from raycobo.lifecycle.callbacks import BaseCallback, RunContext
from raycobo.lifecycle.csv_log import _CsvLog
from raycobo.lifecycle.files import DiskFull, atomic_write, atomic_write_text
from raycobo.lifecycle.plugins import PLUGINS_FILE, write_plugin_record
from raycobo.lifecycle.provenance import provenance
from raycobo.lifecycle.run_dir_checks import (  # noqa: F401 - re-exported
    OPERATIONAL,
    RESUMABLE_KEYS,
    Resume,
    RunDirBusy,
    RunDirChecks,
    changed_keys,
    config_changes,
    read_summary,
)
from raycobo.lifecycle.trust import check_plain_files, check_trusted

METRIC_COLUMNS = ["round", "client", "cluster", "accuracy", "loss"]


def _why(err: OSError) -> str:
    return err.strerror or str(err) or type(err).__name__


def stored_config_path(directory: Path, what: str = "run") -> Path:
    """``directory/config.yaml`` of a run or comparison to resume, or a one-line error."""
    path = Path(directory) / "config.yaml"
    if not path.is_file():
        raise ConfigError(
            f"nothing to resume in {directory}: no config.yaml (not a {what} directory)"
        )
    return path


class RunDir(RunDirChecks, BaseCallback):
    def __init__(self, path: Path, cfg: Config):
        self.path = Path(path).absolute()
        self.cfg = cfg
        self.checkpoints = self.path / "checkpoints"
        self._lock = None
        self._metrics: _CsvLog | None = None
        self._rounds: _CsvLog | None = None
        self.started = time.time()
        self.resume: Resume | None = None
        self._made = False  # open made the folder
        self.provenance = provenance()  # who ran this, where, with which code

    # -- life cycle ------------------------------------------------------------------------
    def open(self, resume: bool) -> Resume | None:
        """Take the directory (lock), check what it holds, write config.yaml and a
        ``running`` summary. -> where a resumed run continues (None: a new run). A
        directory that cannot be made or written is bad input (one line); a full disk
        says so, naming the file."""
        if not resume:
            self._refuse_foreign()
        try:
            self._made = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
            self._take_lock()
        except RunDirBusy:
            raise
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise DiskFull(self.path, self._not_started(resume)) from None
            raise ConfigError(f"cannot write the run directory {self.path}: {_why(err)}") from None
        if resume:
            try:
                check_trusted(self.path, "run directory")
                check_plain_files(self.path, "run directory")
            except BaseException:
                self.close()
                raise
        try:
            found = self.resume = self._check(resume)
            atomic_write_text(self.path / "config.yaml", self.cfg.to_yaml())
            write_plugin_record(self.path, self.cfg.to_dict())  # what a resume may import
            # the CSVs are cut back to the checkpoint that loaded (from round 0: no row kept)
            keep = found.round if found is not None and found.checkpoint else None
            if found is not None and found.checkpoint is None:
                keep = -1
            self._metrics = _CsvLog(self.path / "metrics.csv", METRIC_COLUMNS, keep)
            self._rounds = _CsvLog(self.path / "rounds.csv", None, keep)
            running = {
                "status": "running",
                "pid": os.getpid(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **self.identity(),
                "resumed_from_round": self.resumed_from_round,
            }
            if self._extending():  # the finished run's summary stays until one replaces it
                running = {**found.previous, "extension": running}
            self.write_summary(running)
            return found
        except DiskFull as full:
            self.close()
            raise DiskFull(full.path, self._not_started(resume)) from None
        except OSError as err:
            self.close()
            if err.errno == errno.ENOSPC:
                raise DiskFull(self.path, self._not_started(resume)) from None
            raise ConfigError(f"cannot write the run directory {self.path}: {_why(err)}") from None
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _not_started(resume: bool) -> str:
        """What a full disk while the directory is opened means (the running summary is
        the last file ``open`` writes, atomically: it was not written)."""
        if resume:
            return "the run was not resumed (its summary.json is as it was)"
        return "the run did not start, and no summary.json could be written"

    def identity(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "name": c.name,
            "algorithm": c.algorithm.name,
            "engine": c.engine.kind,
            "seed": c.seed,
            "rounds": c.rounds,
            "provenance": self.provenance,
        }

    @property
    def resumed_from_round(self) -> int | None:
        """The round the opened run resumed from (None: it started fresh)."""
        return self.resume.from_round if self.resume is not None else None

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.path / "summary.json", json.dumps(summary, indent=2))

    # -- rows (callback) -------------------------------------------------------------------
    def on_round_end(self, ctx: RunContext, round: int, stats: dict[str, float]) -> None:
        self._rounds.write([{"round": round, **stats}])

    def on_eval(self, ctx: RunContext, round: int, metrics: dict[str, Any]) -> None:
        self._metrics.write(
            [
                {
                    "round": round,
                    "client": c["id"],
                    "cluster": c["cluster"],
                    "accuracy": c["accuracy"],
                    "loss": c["loss"],
                }
                for c in metrics["clients"]
            ]
        )

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoint(self, round: int, payload: dict[str, Any]) -> Path:
        payload = {**payload, "config": self.cfg.to_dict()}
        return ckpt.write_checkpoint(self.checkpoints, round, payload, self.cfg.checkpoint.keep)

    def latest_checkpoint(self) -> Path | None:
        found = ckpt.latest_checkpoint(self.checkpoints)
        return found[1] if found else None

    # -- endings ---------------------------------------------------------------------------
    def finish(
        self,
        summary: dict[str, Any],
        W: np.ndarray | None,
        snapshots: dict[int, np.ndarray],
        artifacts: dict[str, Any],
        clusters: list[int | None],
    ) -> None:
        import torch

        for name, obj in artifacts.items():  # e.g. meta-L2C's encoder, for transfer
            atomic_write(self.path / f"{name}.pt", lambda f, o=obj: torch.save(o, f), True)
        if W is not None:
            atomic_write(self.path / "collaboration.npy", lambda f: np.save(f, W), True)
            atomic_write(
                self.path / "collaboration_rounds.npz",
                lambda f: np.savez_compressed(f, **{f"round_{r}": m for r, m in snapshots.items()}),
                True,
            )
        from raycobo import plots

        self._close_logs()
        plots.write_run_plots(self.path, summary, snapshots, clusters)
        self.write_summary(summary)

    def fail(
        self,
        status: str,
        error: str | None,
        progress: tuple[int, list[dict[str, Any]], float] | None,
        wall_seconds: float,
        mlflow_run_id: str | None,
        extra: dict[str, Any] | None = None,
    ) -> tuple[int, str | None]:
        """The failure path (and a ``stopped`` run's, whose ``extra`` says by whom and
        its last metrics): ``progress`` is (last round, history, seconds before this
        session) of a run that had started, or None when it failed while starting (a
        resumed directory still holds its checkpoint and the history up to it). Writes
        the minimal summary first (small, so it fits where little space is left), then
        the full one; never raises. -> (the last round, None or why not even the minimal
        summary could be written)"""
        self._close_logs()
        found = self.resume
        if progress is None:  # failed while starting
            last = found.round if found is not None else 0
            prev = (found.previous or {}) if found is not None else {}
            history = [h for h in prev.get("history", []) if h.get("round", 0) <= last]
            progress = (last, history, prev.get("wall_seconds", 0.0))
            if found is not None:
                mlflow_run_id = mlflow_run_id or found.mlflow_run_id
        last, history, before = progress
        latest = self.latest_checkpoint()
        if self._extending():  # a failed extension leaves the finished run's summary as it was
            extension = {
                "status": status,
                "error": error,
                "last_round": last,
                "rounds": self.cfg.rounds,
                "checkpoint": str(latest) if latest is not None else None,
                **(extra or {}),
            }
            try:
                self.write_summary({**found.previous, "extension": extension})
            except OSError as err:
                return last, f"{self.path / 'summary.json'} not written: {_why(err)}"
            return last, None
        minimal = {
            "status": status,
            "error": error,
            "last_round": last,
            **self.identity(),
            "checkpoint": str(latest) if latest is not None else None,
            "mlflow_run_id": mlflow_run_id,
            "resumed_from_round": self.resumed_from_round,
            **(extra or {}),
        }
        try:
            self.write_summary(minimal)
        except OSError as err:
            return last, f"{self.path / 'summary.json'} not written: {_why(err)}"
        full = {**minimal, "history": history, "wall_seconds": before + wall_seconds}
        with contextlib.suppress(OSError):
            self.write_summary(full)
        return last, None

    def _extending(self) -> bool:
        """This session extends a finished run (``--resume rounds=N``)."""
        found = self.resume
        previous = (found.previous or {}) if found is not None else {}
        return previous.get("status") == "completed"

    def _close_logs(self) -> None:
        for log in (self._metrics, self._rounds):
            if log is not None:
                log.close()

    def discard(self) -> None:
        """Undo ``open`` for a new run refused as it starts (a setting the data or the
        engine rejects): the files it wrote go, and the folder when ``open`` made it."""
        self.close()
        for name in ("config.yaml", "summary.json", "metrics.csv", "rounds.csv", PLUGINS_FILE):
            with contextlib.suppress(OSError):
                (self.path / name).unlink()
        with contextlib.suppress(OSError):
            (self.path / ".lock").unlink()
            if self._made:
                self.path.rmdir()  # only when empty

    def close(self) -> None:
        self._close_logs()
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
                self._lock.close()
            self._lock = None
