"""Run callbacks: how tracking, progress and sweeps observe a run without the training
loop knowing about them (the pfl-research pattern)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from raycobo.config import Config


@dataclass
class RunContext:
    cfg: Config
    run_dir: Path
    n_clients: int = 0
    clusters: list[int | None] = field(default_factory=list)
    mlflow_run_id: str | None = None
    parent_run_id: str | None = None
    # membership changes asked for while the run goes (applied before the next round)
    requests: list[tuple[str, list[int]]] = field(default_factory=list)
    # (round, path) of the newest checkpoint written by this run, once there is one
    checkpoint: tuple[int, Path] | None = None
    # a resumed run: the MLflow run of the run before it (tracking continues it)
    resumed_mlflow_run_id: str | None = None
    # where and how the run was started (raycobo.lifecycle.provenance)
    provenance: dict[str, Any] = field(default_factory=dict)

    def join(self, clients: list[int]) -> None:
        """Let ``clients`` join before the next round (algorithms with elastic clients)."""
        self.requests.append(("join", list(clients)))

    def leave(self, clients: list[int]) -> None:
        """Let ``clients`` leave before the next round."""
        self.requests.append(("leave", list(clients)))


class StopRun(Exception):  # noqa: N818 - a decision, not an error
    """Raised by a callback in ``on_eval`` to end the run there, by someone's decision (a
    sweep's scheduler): the run is recorded ``stopped`` -- by whom, at which round, with
    the metrics of that evaluation -- its checkpoints are kept, and ``run_experiment``
    returns instead of raising."""

    def __init__(self, by: str):
        super().__init__(f"stopped by {by}")
        self.by = by


class Callback(Protocol):
    def on_run_start(self, ctx: RunContext) -> None: ...
    def on_round_end(self, ctx: RunContext, round: int, stats: dict[str, float]) -> None: ...
    def on_eval(self, ctx: RunContext, round: int, metrics: dict[str, Any]) -> None: ...
    def on_run_end(self, ctx: RunContext, summary: dict[str, Any]) -> None: ...


class BaseCallback:
    """No-op callback; subclass and override what you need."""

    def on_run_start(self, ctx: RunContext) -> None:
        pass

    def on_round_end(self, ctx: RunContext, round: int, stats: dict[str, float]) -> None:
        pass

    def on_eval(self, ctx: RunContext, round: int, metrics: dict[str, Any]) -> None:
        pass

    def on_run_end(self, ctx: RunContext, summary: dict[str, Any]) -> None:
        pass
