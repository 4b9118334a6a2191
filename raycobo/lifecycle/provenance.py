"""Where a result came from: the raycobo version and commit, the command line, the
machine and the libraries, written into ``summary.json``, MLflow tags and reports so a
shared result can be traced back and rerun."""

from __future__ import annotations

import functools
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GIT_TIMEOUT_S = 5.0  # git is asked once per process; a hung git must not hold a run


@functools.cache
def git_state(where: str | None = None) -> dict[str, Any]:
    """The commit of the checkout raycobo is imported from (None outside one, or without
    git) and whether tracked files differ from it."""
    root = Path(where) if where else Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return {"commit": None, "dirty": None}
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": head.stdout.strip(), "dirty": dirty}


# what a process running someone else's job (a Ray task of a parallel compare) reports
# as its command and folder: the command that asked for the job
_LAUNCHED_BY: dict[str, Any] = {}


def launched_by(record: dict[str, Any]) -> None:
    """This process runs jobs for the command in ``record`` (a provenance record of the
    process that submitted them): its runs name that command and folder as theirs."""
    _LAUNCHED_BY.clear()
    _LAUNCHED_BY.update({k: record[k] for k in ("command", "cwd") if k in record})


def command_line() -> str:
    """The command as typed (``raycobo ...`` for the console script or ``python -m
    raycobo``, else the argv as it is)."""
    argv = list(sys.argv)
    if not argv or not argv[0]:
        return "python (interactive)"
    first = Path(argv[0])
    if first.name == "raycobo" or (first.name == "__main__.py" and first.parent.name == "raycobo"):
        argv[0] = "raycobo"
    return shlex.join(argv)


def raycobo_version() -> str:
    """The package's version; from the installed metadata where the package's
    ``__init__`` was not run (a checkout synced next to a script on a Ray cluster node
    imports as a namespace package)."""
    try:
        from raycobo.version import __version__

        return __version__
    except ImportError:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("raycobo")
        except PackageNotFoundError:
            return "unknown"


@functools.cache
def _libraries() -> dict[str, str]:
    import torch

    return {
        "raycobo": raycobo_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def provenance() -> dict[str, Any]:
    """One record of where and how this process produces a result."""
    git = git_state()
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command_line(),
        "cwd": os.getcwd(),
        "git_commit": git["commit"],
        "git_dirty": git["dirty"],
        "host": platform.node(),
        "platform": platform.platform(terse=True),
        "cpus": os.cpu_count(),
        **{f"{k}_version": v for k, v in _libraries().items()},
        **_LAUNCHED_BY,
    }


def mlflow_tags(record: dict[str, Any]) -> dict[str, str]:
    """A provenance record as MLflow tags: its own source fields (the UI's Source and
    Version columns) and the rest under ``raycobo.provenance.*``."""
    tags = {
        "mlflow.source.type": "LOCAL",
        "mlflow.source.name": record["command"][:500],
        "mlflow.user": os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown",
    }
    if record.get("git_commit"):
        tags["mlflow.source.git.commit"] = record["git_commit"]
    for key, value in record.items():
        if value is not None:
            tags[f"raycobo.provenance.{key}"] = str(value)[:500]
    return tags


def describe(record: dict[str, Any]) -> str:
    """One line for a report: when, what, where."""
    commit = record.get("git_commit")
    if commit:
        version = f"raycobo {record['raycobo_version']} ({commit[:12]}"
        version += ", uncommitted changes)" if record.get("git_dirty") else ")"
    else:
        version = f"raycobo {record['raycobo_version']}"
    return (
        f"{record['date']} · {version} · torch {record['torch_version']}, "
        f"Python {record['python_version']} · {record['host']} ({record['platform']}, "
        f"{record['cpus']} CPUs)"
    )
