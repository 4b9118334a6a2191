"""The run directory: one writer, crash-safe files, checkpoints (the contract in README
"Run directory" and "Long runs").

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
import csv
import errno
import fcntl
import io
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raycobo.config import Config, ConfigError
from raycobo.lifecycle import checkpoint as ckpt
from raycobo.lifecycle.callbacks import BaseCallback, RunContext
from raycobo.lifecycle.files import DiskFull, atomic_write, atomic_write_text, remove_stale_temps
from raycobo.lifecycle.plugins import PLUGINS_FILE, write_plugin_record
from raycobo.lifecycle.provenance import provenance
from raycobo.lifecycle.trust import check_plain_files, check_trusted

METRIC_COLUMNS = ["round", "client", "cluster", "accuracy", "loss"]
RESUMABLE_KEYS = {"rounds"}
# keys that say how a run is run, watched or compared, not what it computes: a resumed
# run may see them changed (a comparison stores its entries; a cluster's address moves)
OPERATIONAL = (
    "compare.",
    "tracking.",
    "checkpoint.",
    "engine.timeout_s",
    "engine.address",
    "engine.num_cpus",
    "engine.num_gpus",
    "engine.dashboard",
    "engine.max_restarts",
)


class RunDirBusy(ConfigError):
    """Another process writes this run directory (exit 2)."""


def _why(err: OSError) -> str:
    return err.strerror or str(err) or type(err).__name__


@dataclass
class Resume:
    """Where a resumed run continues: the newest readable checkpoint (None: from round
    0), its contents, and what the directory said before."""

    round: int
    checkpoint: Path | None
    data: dict[str, Any] | None
    previous: dict[str, Any] | None  # the summary.json found in the directory

    @property
    def from_round(self) -> int | None:
        """The round the run continues from (None: it starts over, no checkpoint)."""
        return self.round if self.checkpoint is not None else None

    @property
    def mlflow_run_id(self) -> str | None:
        """The MLflow run to continue (also when the run had no checkpoint yet)."""
        found = (self.previous or {}).get("mlflow_run_id")
        return found or (self.data or {}).get("mlflow_run_id")


def read_summary(path: Path) -> dict[str, Any] | None:
    """A run directory's summary.json, or None when it has none (or an unreadable one).
    A ``running`` summary whose writer is gone (nobody holds the directory's lock: the
    process was killed before it could write its last status) reads ``interrupted``."""
    try:
        data = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get("status") == "running" and not _locked(path / ".lock"):
        data = {**data, "status": "interrupted", "stale_running": True}
    extension = data.get("extension")  # an extension killed before it could say so
    running = isinstance(extension, dict) and extension.get("status") == "running"
    if running and not _locked(path / ".lock"):
        data = {**data, "extension": {**extension, "status": "interrupted"}}
    return data


def _locked(lock: Path) -> bool:
    """Whether a process holds this run directory's lock (flock; also this process
    through another descriptor)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False  # no lock file: no writer
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def stored_config_path(directory: Path, what: str = "run") -> Path:
    """``directory/config.yaml`` of a run or comparison to resume, or a one-line error."""
    path = Path(directory) / "config.yaml"
    if not path.is_file():
        raise ConfigError(
            f"nothing to resume in {directory}: no config.yaml (not a {what} directory)"
        )
    return path


def changed_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved config trees."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        dotted = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_keys(a, b, dotted + ".")
        elif a != b:
            out.append(dotted)
    return out


def config_changes(saved: dict[str, Any], cfg: Config) -> list[str]:
    """The keys in which ``cfg`` differs from the config a checkpoint recorded, but for
    those a resumed run may change (``rounds``, the OPERATIONAL keys)."""
    return [
        k
        for k in changed_keys(saved, cfg.to_dict())
        if k not in RESUMABLE_KEYS and not k.startswith(OPERATIONAL)
    ]


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
        new = [k for row in rows for k in row if k not in self.columns]
        if new:  # a statistic that starts later (a late result's loss): widen the file
            self._widen(list(dict.fromkeys(new)))
        try:
            self._w.writerows(rows)
            self._f.flush()
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise DiskFull(self.path) from None
            raise

    def _widen(self, new: list[str]) -> None:
        """Rewrite the file with ``new`` columns after the old ones (earlier rows blank
        there), through a temporary file renamed over it."""
        self._f.close()
        with self.path.open(newline="") as f:
            old_rows = list(csv.DictReader(f))
        self.columns = [*self.columns, *new]
        tmp = self.path.with_name(self.path.name + ".widen")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns)
            w.writeheader()
            w.writerows(old_rows)
        os.replace(tmp, self.path)
        self._open("a")

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
                "resumed_from_round": found.from_round if found is not None else None,
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

    def _refuse_foreign(self) -> None:
        """A new run goes into a new or empty folder, or one that holds a raycobo run
        (which ``_check_new`` judges): a folder of the user's own files is not written."""
        try:
            names = sorted(p.name for p in self.path.iterdir())
        except OSError:
            return  # none yet (or one that cannot be: making it says why)
        own = [n for n in names if n != ".lock" and not (n.startswith(".") and n.endswith(".tmp"))]
        if own and "summary.json" not in own and "checkpoints" not in own:
            shown = ", ".join(own[:4]) + (", ..." if len(own) > 4 else "")
            raise ConfigError(
                f"run directory {self.path} is not empty and holds no raycobo run ({shown}); "
                "choose a new or empty folder for --out"
            )

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

    def _check(self, resume: bool) -> Resume | None:
        old = read_summary(self.path)
        status = old.get("status") if old else None
        if not resume:
            self._check_new(old, status)
            return None
        remove_stale_temps(self.checkpoints)  # what killed checkpoint writes left behind
        remove_stale_temps(self.path)
        found = ckpt.newest_readable(self.checkpoints, lambda msg: print(msg, file=sys.stderr))
        if status == "completed" and found is None and self.cfg.rounds > old.get("rounds", 0):
            raise ConfigError(
                f"run directory {self.path} holds a finished run of {old.get('rounds')} rounds "
                "but no checkpoint to extend it from (checkpoint.every was 0, or the "
                "checkpoints were removed); start a new run with rounds="
                f"{self.cfg.rounds} instead"
            )
        if status == "completed" and (found is None or found[0] >= self.cfg.rounds):
            raise ConfigError(
                f"run directory {self.path} holds a finished run of {old.get('rounds')} rounds; "
                "to extend it, pass rounds=N with N larger than that"
            )
        if found is None:
            return Resume(0, None, None, old)
        round, path, data = found
        if round > self.cfg.rounds:
            raise ConfigError(
                f"invalid config key 'rounds': {self.cfg.rounds}, but the checkpoint in "
                f"{self.path} is at round {round}"
            )
        self._check_config(data.get("config"), path)
        return Resume(round, path, data, old)

    def _check_new(self, old: dict[str, Any] | None, status: str | None) -> None:
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
            return
        if old is not None or (self.path / "config.yaml").exists():
            where = f" at round {old.get('last_round', 0)}" if old else ""
            raise ConfigError(
                f"run directory {self.path} holds a{'n' if status == 'interrupted' else ''} "
                f"{status or 'unfinished'} run{where}; continue it with: "
                f"raycobo run --resume {self.path}"
            )

    def _check_config(self, saved: dict[str, Any] | None, path: Path) -> None:
        """The config a checkpoint was written under must be the one resumed with (but
        for ``rounds`` and the OPERATIONAL keys): config.yaml edited by hand is refused,
        naming the keys."""
        if saved is None:  # checkpoints of versions that did not record it
            return
        diff = config_changes(saved, self.cfg)
        if diff:
            shown = ", ".join(diff[:6]) + (", ..." if len(diff) > 6 else "")
            raise ConfigError(
                f"{self.path / 'config.yaml'} no longer matches the config its checkpoint "
                f"{path.name} was written under ({shown} changed); a resumed run keeps its "
                "config (only rounds=N may change): restore those keys, or start a new run"
            )

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
