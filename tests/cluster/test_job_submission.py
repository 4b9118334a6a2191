"""The cluster workflow users type, on a loopback head: `ray start --head`, then
`ray job submit --working-dir . -- python examples/cluster_launch.py run ...`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.sshd_loopback import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def loopback_head():
    """A Ray head on 127.0.0.1 with the dashboard's job server, run with --block so
    that stopping this one process stops exactly this head (not `ray stop`, which stops
    every Ray on the machine)."""
    pytest.importorskip("ray.dashboard")
    import tempfile

    ray_bin = Path(sys.executable).with_name("ray")
    temp = Path(tempfile.mkdtemp(prefix="rc-"))  # short: Ray's socket paths max 107 bytes
    port, dash, agent = free_port(), free_port(), free_port()
    import secrets

    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray 2.60 guards clusters with a token: the head and every client share one
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        # `python` in the job is the environment raycobo is installed in (an activated venv)
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    head = subprocess.Popen(
        [
            str(ray_bin),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            f"--dashboard-agent-listen-port={agent}",
            "--include-dashboard=true",
            "--num-cpus=2",
            f"--temp-dir={temp}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + 90
    while True:  # the job server answers once the dashboard is up
        assert head.poll() is None, head.stderr.read()
        probe = subprocess.run(
            [str(ray_bin), "job", "list", "--address", url],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        if probe.returncode == 0:
            break
        assert time.monotonic() < deadline, probe.stderr[-2000:]
        time.sleep(1)
    try:
        yield url, ray_bin, env
    finally:
        head.send_signal(signal.SIGINT)  # --block: ray start stops what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        # whatever of this head is left (every process names its temp dir)
        subprocess.run(["pkill", "-9", "-f", str(temp)], check=False)
        from ray._common.utils import reset_ray_address

        reset_ray_address()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.timeout(300)
def test_job_submit_runs_the_launcher_on_the_cluster(loopback_head, tmp_path):
    url, ray_bin, env = loopback_head
    out = tmp_path / "run"
    cmd = [
        str(ray_bin),
        "job",
        "submit",
        "--address",
        url,
        "--working-dir",
        str(ROOT),
        "--",
        "python",
        "examples/cluster_launch.py",
        "run",
        "examples/quickstart.yaml",
        "data.name=quadratic",
        "rounds=20",
        "eval_every=10",
        "engine.kind=ray",
        "--no-tracking",
        "-q",
        "--out",
        str(out),
    ]
    deadline = time.monotonic() + 60
    while True:  # the head's job agent comes up a few seconds after the job server
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
        if "No available agent" not in res.stderr or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "succeeded" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["engine"] == "ray"
    # it joined the head (engine.address=auto from the launcher), not a Ray of its own
    report = summary["engine_report"]
    assert report["hosts"] == 2 and len(set(report["host_nodes"])) == 1
