"""A sweep's console: one line per finished trial for the user; Ray's and Tune's own
output (the experiment box, the TensorBoard hint, start-up and snapshot warnings) goes to
``sweep.log`` in the sweep's folder instead of the terminal. Nothing of Ray's is turned
off: its messages are kept, in the log."""

from __future__ import annotations

import contextlib
import logging
import sys
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


def trial_lines(tune: Any, total: int, metric: str):
    """A Tune callback printing one line to stderr per trial that ends (Tune keeps its
    callbacks in the experiment state, so it holds no stream)."""

    class TrialLines(tune.Callback):
        def __init__(self) -> None:
            self.done = 0

        def _line(self, trial, status: str) -> None:
            self.done += 1
            print(trial_line(self.done, total, trial, metric, status), file=sys.stderr, flush=True)

        def on_trial_complete(self, iteration, trials, trial, **info):
            error = (trial.last_result or {}).get("config_error")
            self._line(trial, f"invalid config: {error}" if error else "finished")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trial, "failed")

    return TrialLines()
