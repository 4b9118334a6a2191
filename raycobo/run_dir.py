"""The run directory: one writer, crash-safe files, checkpoints (the contract in README
"Run directory" and "Long runs").

- ``config.yaml``        the fully resolved config (written first)
- ``summary.json``       ``status: running`` from the start, then replaced atomically by the
                         final summary (``completed``) or by ``failed`` / ``interrupted``
                         with the error and the last round reached
- ``metrics.csv``        one row per evaluation and client (appended and flushed)
- ``rounds.csv``         per-round statistics (train loss, sampled edges, gradients, ...)
- ``checkpoints/``       ``round_000120.pt``: everything needed to continue the run
- ``collaboration.npy``  the final W when the algorithm has one
- ``<name>.pt``          learned extras an algorithm exports (meta-L2C: ``encoder.pt``)
- ``plots/``             PNG: accuracy/loss curves, W heatmaps
- ``.lock``              held (flock) by the process writing the directory; holds its pid

:class:`RunDir` is a run callback (rows arrive through ``on_round_end`` / ``on_eval``) with
the life-cycle calls the training loop makes itself (``open``, ``checkpoint``, ``finish``,
``fail``, ``close``).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from raycobo import checkpoint as ckpt
from raycobo.callbacks import BaseCallback, RunContext
from raycobo.config import Config, ConfigError

METRIC_COLUMNS = ["round", "client", "cluster", "accuracy", "loss"]


class RunDirBusy(ConfigError):
    """Another process writes this run directory (exit 2)."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, sync it and rename it over."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def read_summary(path: Path) -> dict[str, Any] | None:
    """A run directory's summary.json, or None when it has none (or an unreadable one)."""
    try:
        data = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class _CsvLog:
    """An append-only CSV whose rows are flushed as they come. Opened on an existing file
    (resume), it first drops the rows after ``keep_through`` and any half-written line."""

    def __init__(self, path: Path, columns: list[str] | None, keep_through: int | None):
        self.path = path
        self._f = None
        self.columns = columns
        if keep_through is not None and path.exists():
            self.columns = _truncate_csv(path, keep_through) or columns
            if self.columns is not None:
                self._open("a")
        elif columns is not None:
            self._open("w")

    def _open(self, mode: str) -> None:
        self._f = self.path.open(mode, newline="")
        self._w = csv.DictWriter(self._f, fieldnames=self.columns, extrasaction="ignore")
        if mode == "w":
            self._w.writeheader()
            self._f.flush()

    def write(self, rows: list[dict[str, Any]]) -> None:
        if self._f is None:  # the first row names the columns
            self.columns = list(rows[0])
            self._open("w")
        self._w.writerows(rows)
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):  # a full disk must not stop the failure path
                self._f.close()
            self._f = None


def _truncate_csv(path: Path, keep_through: int) -> list[str] | None:
    """Keep the header and the rows of rounds <= keep_through; returns the header."""
    raw = path.read_text()
    if not raw.endswith("\n"):  # a row cut mid-line (crash, full disk)
        raw = raw[: raw.rfind("\n") + 1]
    lines = list(csv.reader(io.StringIO(raw)))
    if not lines:
        return None
    header, kept = lines[0], [lines[0]]
    for row in lines[1:]:
        with contextlib.suppress(ValueError, IndexError):
            if int(float(row[0])) <= keep_through:
                kept.append(row)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerows(kept)
    atomic_write_text(path, buf.getvalue())
    return header


class RunDir(BaseCallback):
    def __init__(self, path: Path, cfg: Config):
        self.path = Path(path)
        self.cfg = cfg
        self.checkpoints = self.path / "checkpoints"
        self._lock = None
        self._metrics: _CsvLog | None = None
        self._rounds: _CsvLog | None = None
        self.started = time.time()
        self.previous: dict[str, Any] | None = None  # the summary found at open (resume)

    # -- life cycle ------------------------------------------------------------------------
    def open(self, resume: bool) -> tuple[int, Path] | None:
        """Take the directory (lock), check what it holds, write config.yaml and a
        ``running`` summary. -> the latest checkpoint when resuming (None: from round 0)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            found = self._check(resume)
            atomic_write_text(self.path / "config.yaml", self.cfg.to_yaml())
            # resuming without a checkpoint starts over: no row is kept
            keep = found[0] if found is not None else (-1 if resume else None)
            self._metrics = _CsvLog(self.path / "metrics.csv", METRIC_COLUMNS, keep)
            self._rounds = _CsvLog(self.path / "rounds.csv", None, keep)
            self.write_summary(
                {
                    "status": "running",
                    "pid": os.getpid(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    **self.identity(),
                    "resumed_from_round": found[0] if found is not None else None,
                }
            )
            return found
        except BaseException:
            self.close()
            raise

    def _take_lock(self) -> None:
        f = (self.path / ".lock").open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                f.close()
                raise
            f.seek(0)
            owner = f.read().strip() or "unknown"
            f.close()
            raise RunDirBusy(
                f"run directory {self.path} is in use by another raycobo process (pid {owner})"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock = f

    def _check(self, resume: bool) -> tuple[int, Path] | None:
        old = self.previous = read_summary(self.path)
        status = old.get("status") if old else None
        if not resume:
            if status == "completed":
                raise ConfigError(
                    f"run directory {self.path} already holds a finished run; choose another "
                    f"--out, or extend it with: raycobo run --resume {self.path} rounds=N"
                )
            nothing_done = (
                status in ("failed", "interrupted")
                and old.get("last_round") == 0
                and ckpt.latest_checkpoint(self.checkpoints) is None
            )
            if nothing_done:  # e.g. a setting refused while the run started: begin anew
                return None
            if old is not None or (self.path / "config.yaml").exists():
                where = f" at round {old.get('last_round', 0)}" if old else ""
                raise ConfigError(
                    f"run directory {self.path} holds a{'n' if status == 'interrupted' else ''} "
                    f"{status or 'unfinished'} run{where}; continue it with: "
                    f"raycobo run --resume {self.path}"
                )
            return None
        found = ckpt.latest_checkpoint(self.checkpoints)
        if status == "completed" and (found is None or found[0] >= self.cfg.rounds):
            raise ConfigError(
                f"run directory {self.path} holds a finished run of {old.get('rounds')} rounds; "
                "to extend it, pass rounds=N with N larger than that"
            )
        if found is not None and found[0] > self.cfg.rounds:
            raise ConfigError(
                f"invalid config key 'rounds': {self.cfg.rounds}, but the checkpoint in "
                f"{self.path} is at round {found[0]}"
            )
        return found

    def identity(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "name": c.name,
            "algorithm": c.algorithm.name,
            "engine": c.engine.kind,
            "seed": c.seed,
            "rounds": c.rounds,
        }

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

        for name, obj in artifacts.items():
            torch.save(obj, self.path / f"{name}.pt")  # e.g. meta-L2C's encoder, for transfer
        if W is not None:
            np.save(self.path / "collaboration.npy", W)
            np.savez_compressed(
                self.path / "collaboration_rounds.npz",
                **{f"round_{r}": m for r, m in snapshots.items()},
            )
        from raycobo import plots

        self._close_logs()
        plots.write_run_plots(self.path, summary, snapshots, clusters)
        self.write_summary(summary)

    def fail(self, status: str, error: str | None, last_round: int, extra: dict[str, Any]) -> None:
        """The failure path: the minimal summary first (small, so it fits where little
        space is left), then the full one; never raises. Prints one line if even the
        minimal summary could not be written."""
        self._close_logs()
        latest = self.latest_checkpoint()
        minimal = {
            "status": status,
            "error": error,
            "last_round": last_round,
            **self.identity(),
            "checkpoint": str(latest) if latest is not None else None,
            "mlflow_run_id": extra.get("mlflow_run_id"),
        }
        try:
            self.write_summary(minimal)
        except OSError as err:
            print(
                f"error: could not write {self.path / 'summary.json'} ({err.strerror or err})",
                file=sys.stderr,
            )
            return
        with contextlib.suppress(OSError):
            self.write_summary({**minimal, **extra})

    def _close_logs(self) -> None:
        for log in (self._metrics, self._rounds):
            if log is not None:
                log.close()

    def close(self) -> None:
        self._close_logs()
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
                self._lock.close()
            self._lock = None
