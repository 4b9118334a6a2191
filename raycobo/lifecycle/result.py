"""A run's results as a Python object: the summary, and the tables of its run directory
(per-round statistics, per-client metrics, W) read when asked for."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def _number(text: str) -> Any:
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a run's CSV with numbers as numbers (empty cells as None)."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


@dataclass
class Result:
    """One run: ``run_dir`` and its ``summary`` (``summary.json``). The tables are read
    from the run directory when asked for; ``frame(...)`` gives them as pandas
    DataFrames."""

    run_dir: Path
    summary: dict[str, Any]

    @property
    def status(self) -> str | None:
        return self.summary.get("status")

    @property
    def mean_accuracy(self) -> float | None:
        return self.summary.get("mean_accuracy")

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every evaluation: round, mean accuracy and loss, W within/across, ..."""
        return list(self.summary.get("history", []))

    def metrics(self) -> list[dict[str, Any]]:
        """One record per evaluation and client: round, client, cluster, accuracy, loss."""
        return read_csv(self.run_dir / "metrics.csv")

    def rounds(self) -> list[dict[str, Any]]:
        """One record per round: training loss, sampled edges, gradients, ..."""
        return read_csv(self.run_dir / "rounds.csv")

    @property
    def W(self) -> np.ndarray | None:
        """The final collaboration matrix (None when the method has none)."""
        path = self.run_dir / "collaboration.npy"
        return np.load(path, allow_pickle=False) if path.is_file() else None

    def W_at(self) -> dict[int, np.ndarray]:
        """W at the heatmap rounds (``tracking.heatmap_rounds``): round -> matrix."""
        path = self.run_dir / "collaboration_rounds.npz"
        if not path.is_file():
            return {}
        with np.load(path, allow_pickle=False) as z:
            return {int(k.split("_")[1]): z[k] for k in z.files}

    def frame(self, table: str = "metrics"):
        """A pandas DataFrame of ``metrics`` (per client), ``rounds`` (per round) or
        ``history`` (per evaluation)."""
        import pandas as pd

        tables = {"metrics": self.metrics, "rounds": self.rounds, "history": lambda: self.history}
        if table not in tables:
            raise ValueError(f"table must be one of {', '.join(tables)}, got {table!r}")
        return pd.DataFrame.from_records(tables[table]())
