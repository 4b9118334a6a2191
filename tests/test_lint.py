"""The code base passes the project's own ruff configuration (lint and format)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: install the dev extra (pip install -e '.[dev]')")
    return [found]


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]])
def test_ruff(args):
    targets = [p for p in ("raycobo", "tests", "benchmarks") if (ROOT / p).exists()]
    res = subprocess.run([*_ruff(), *args, *targets], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]
