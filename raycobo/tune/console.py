"""A sweep's console: one line per finished trial for the user; Ray's and Tune's own
output (the experiment box, the TensorBoard hint, start-up and snapshot warnings) goes to
``sweep.log`` in the sweep's folder instead of the terminal. Nothing of Ray's is turned
off: its messages are kept, in the log."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOG_FILE = "sweep.log"
_LOGGERS = ("ray", "ray.tune", "ray.train", "ray.data")


@contextlib.contextmanager
def console_to_log(root: Path) -> Iterator[None]:
    """While a sweep runs: Python-level prints and the Ray/Tune loggers write to
    ``root/sweep.log``; stderr (the trial lines, our own warnings) stays the user's."""
    with (root / LOG_FILE).open("a") as log:
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        saved = {}
        for name in _LOGGERS:
            logger = logging.getLogger(name)
            saved[name] = (logger.handlers[:], logger.propagate)
            logger.handlers = [handler]
            logger.propagate = False
        try:
            # Tune prints its experiment box and TensorBoard hint; our own warnings (an
            # MLflow store that cannot be reached) stay on stderr
            with contextlib.redirect_stdout(log):
                yield
        finally:
            for name, (handlers, propagate) in saved.items():
                logger = logging.getLogger(name)
                logger.handlers, logger.propagate = handlers, propagate


def trial_number(trial_id: str) -> str:
    """Tune's ``e8d59_00003`` -> ``3``."""
    return str(trial_id).rsplit("_", 1)[-1].lstrip("0") or "0"


def sampled_values(config: dict[str, Any]) -> str:
    """A trial's sampled keys, shortest names: ``lr=0.1 sampling=full`` (the ``__``
    entries of the param space are not sampled)."""
    return " ".join(
        f"{k.rsplit('.', 1)[-1]}={format(v, '.3g') if isinstance(v, float) else v}"
        for k, v in config.items()
        if not k.startswith("__")
    )


def trial_line(done: int, total: int, trial: Any, metric: str, status: str) -> str:
    """``[3/8] trial 2  rho=0.5 sampling=mixed -> mean_loss 0.0123 (finished)``"""
    result = (trial.last_result or {}).get(metric)
    shown = f"{metric} {result:.4g}" if isinstance(result, int | float) else f"{metric} -"
    number, values = trial_number(trial.trial_id), sampled_values(trial.config or {})
    return f"[{done}/{total}] trial {number}  {values} -> {shown} ({status})"


def ended_status(trial: Any, rounds: int, stopper: str) -> str:
    """How a terminated trial ended: ``finished``, ``stopped by asha at round 40``, or
    its invalid config."""
    last = trial.last_result or {}
    if last.get("config_error"):
        return f"invalid config: {last['config_error']}"
    reached = last.get("round")
    if isinstance(reached, int) and reached < rounds:
        return f"stopped by {stopper} at round {reached}"
    return "finished"


STATUS_S = 10.0  # at most one status line this often, when something changed
QUIET_S = 60.0  # and one this often when nothing did (the sweep is still alive)


def status_line(elapsed: float, trials: list[Any], rounds: int, metric: str, mode: str) -> str:
    """``  45 s: 2 running, 3 pending, 2 finished, 1 stopped, 0 failed; best mean_loss
    0.0123 (trial 4)`` -- what a sweep is doing, for a console that would be silent
    until a trial ends."""
    counts = {"running": 0, "pending": 0, "finished": 0, "stopped": 0, "failed": 0}
    best = None
    for t in trials:
        last = t.last_result or {}
        if t.status == "RUNNING":
            counts["running"] += 1
        elif t.status in ("PENDING", "PAUSED"):
            counts["pending"] += 1
        elif t.status == "ERROR":
            counts["failed"] += 1
        elif t.status == "TERMINATED":
            stopped = isinstance(last.get("round"), int) and last["round"] < rounds
            counts["stopped" if stopped else "finished"] += 1
        value = last.get(metric)
        if not isinstance(value, int | float) or value != value:  # none yet, or NaN
            continue
        if best is None or (value < best[0] if mode == "min" else value > best[0]):
            best = (value, trial_number(t.trial_id))
    parts = ", ".join(f"{n} {k}" for k, n in counts.items())
    shown = f"; best {metric} {best[0]:.4g} (trial {best[1]})" if best else ""
    return f"  {elapsed:.0f} s: {parts}{shown}"


def trial_lines(tune: Any, total: int, metric: str, rounds: int, stopper: str, mode: str):
    """A Tune callback printing one line to stderr per trial that ends, and a status line
    while trials run (every STATUS_S seconds when something changed, QUIET_S when not).
    Tune keeps its callbacks in the experiment state, so it holds no stream."""

    class TrialLines(tune.Callback):
        def __init__(self) -> None:
            self.done = 0
            self.start = self.last = time.monotonic()
            self.shown = ""

        def _line(self, trial, status: str) -> None:
            self.done += 1
            print(trial_line(self.done, total, trial, metric, status), file=sys.stderr, flush=True)

        def on_step_end(self, iteration, trials, **info):
            now = time.monotonic()
            if now - self.last < STATUS_S:
                return
            line = status_line(now - self.start, trials, rounds, metric, mode)
            state = line.split(":", 1)[1]
            if state != self.shown or now - self.last >= QUIET_S:  # changed, or a heartbeat
                print(line, file=sys.stderr, flush=True)
                self.last, self.shown = now, state

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._line(trial, ended_status(trial, rounds, stopper))

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trial, "failed")

    return TrialLines()
