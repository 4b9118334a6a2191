"""The workers of a Ray that raycobo starts run at the driver's priority."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import os, ray
from raycobo.config import load_config
from raycobo.engine.ray.layout import start_ray
start_ray(load_config(None, ["data.name=quadratic", "engine.num_cpus=1"]))
print(ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote(), timeout=120))
"""


def test_workers_of_a_ray_started_here_are_not_niced():
    """Ray starts workers at nice 15; beside other work at nice 0 a sweep's trials then
    barely ran (on a 2-core machine at load 7 no trial had started after minutes). The
    Ray that raycobo starts (in a process of its own here: a Ray started by another
    test would answer instead) runs them at niceness 0 unless the user set
    RAY_worker_niceness."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "0", out.stdout
    env["RAY_worker_niceness"] = "5"  # the user's choice stands
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "5", out.stderr
