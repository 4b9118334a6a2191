"""A progress bar over rounds (rich), off when output is not a terminal."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class RoundProgress:
    def __init__(self, label: str, enabled: bool | None = None):
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._p: Progress | None = None
        self._task = None
        self._last = ""

    def start(self, total: int, done: int = 0) -> None:
        """A bar of ``total`` rounds, ``done`` of them already (a resumed run)."""
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
        if self._p is None:
            return
        if row is not None:
            acc = row.get("mean_accuracy")
            self._last = (
                f"acc {acc:.3f}" if acc is not None else f"loss {row.get('mean_loss', 0):.3g}"
            )
        info = f"train {stats.get('train_loss', float('nan')):.3g}  {self._last}"
        self._p.update(self._task, advance=1, info=info)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None
