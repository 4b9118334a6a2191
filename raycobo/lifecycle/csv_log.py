"""The run directory's CSV logs (``metrics.csv``, ``rounds.csv``): appended and flushed
row by row, widened when a row brings new columns, and truncated to a checkpoint's round
when a run resumes."""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import os
from pathlib import Path
from typing import Any

from raycobo.lifecycle.files import DiskFull, atomic_write_text


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
