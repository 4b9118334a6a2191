"""Progress over rounds: a bar (rich) on a terminal; elsewhere (a batch job's log, a
pipe, ``> log``) one plain line at each evaluation."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class RoundProgress:
    """``enabled``: the bar (default: when stderr is a terminal); without it, plain lines
    at each evaluation unless ``lines`` is False."""

    def __init__(self, label: str, enabled: bool | None = None, lines: bool = True):
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.lines = lines and not self.enabled
        self._p: Progress | None = None
        self._task = None
        self._last = ""
        self._total = 0
        self._done = 0
        self._t0 = 0.0

    def start(self, total: int, done: int = 0) -> None:
        """A bar of ``total`` rounds, ``done`` of them already (a resumed run)."""
        self._total, self._done, self._t0 = total, done, time.monotonic()
        if not self.enabled:
            return
        self._p = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=Console(stderr=True),
            transient=False,
        )
        self._p.start()
        self._task = self._p.add_task(self.label, total=total, completed=done, info="")

    def advance(self, stats: dict[str, float], row: dict[str, Any] | None) -> None:
        self._done += 1
        if row is not None:
            acc = row.get("mean_accuracy")
            self._last = (
                f"acc {100 * acc:.2f} %"
                if acc is not None
                else f"loss {row.get('mean_loss', 0):.4g}"
            )
        train = f"train {stats.get('train_loss', float('nan')):.3g}"
        if self._p is not None:
            self._p.update(self._task, advance=1, info=f"{train}  {self._last}")
        elif self.lines and row is not None:  # a log reader sees each evaluation
            elapsed = time.monotonic() - self._t0
            print(
                f"{self.label}: round {self._done}/{self._total}  {self._last}  {train}  "
                f"({elapsed:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None
