"""The design card's own workflow, run for real over SSH on this machine: `ray up`,
`ray submit ... examples/cluster_launch.py`, `ray exec ... 'ray status'`, `ray down`
with cluster/local.yaml pointed at a loopback sshd (tests/cluster/sshd_loopback.py).

The copy of the recipe changes only what one machine needs: the head at 127.0.0.1, the
test's key and a ProxyCommand to the test's sshd port, free ports for Ray's GCS and
MLflow, and the first setup command, which creates ~/raycobo-env with a .pth onto this
virtual environment's packages instead of a bare venv (so that the recipe's own torch and
raycobo installs find torch present instead of copying 5 GB again; raycobo itself is
installed, editable, from the mounted copy, as on a real node). Slow (a few minutes).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster.sshd_loopback import LoopbackSSH, free_port

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
WORKERS = (
    os.environ.get("RAYCOBO_TEST_WORKERS", "").split(",")
    if os.environ.get("RAYCOBO_TEST_WORKERS")
    else []
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists(),
        reason="needs openssh-server (.ci/run installs it)",
    ),
    pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync"),
]


def _recipe(ssh: LoopbackSSH, gcs: int, workers: list[str]) -> dict:
    c = yaml.safe_load((ROOT / "cluster" / "local.yaml").read_text())
    c["cluster_name"] = f"rc-{secrets.token_hex(3)}"
    c["provider"].update(head_ip="127.0.0.1", worker_ips=workers)
    c["max_workers"] = len(workers)
    c["auth"] = {
        "ssh_user": os.environ.get("USER") or "root",
        "ssh_private_key": str(ssh.key),
        "ssh_proxy_command": ssh.proxy_command(),
    }
    c["file_mounts"] = {"~/raycobo": str(ROOT)}
    site = sysconfig.get_paths()["purelib"]  # this venv's packages, seen through a .pth
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    env_bin = "~/raycobo-env/bin"
    c["setup_commands"][0] = " && ".join(
        [
            f"{sys.base_prefix}/bin/{py} -m venv --without-pip ~/raycobo-env",
            f"echo {site} > ~/raycobo-env/lib/{py}/site-packages/_host_venv.pth",
            # this venv's pip, installing into ~/raycobo-env; ray and mlflow run by its python
            f"printf '#!/bin/sh\\nexec {sys.executable} -m pip --python "
            f'$HOME/raycobo-env/bin/python "$@"\\n\' > {env_bin}/pip',
            f"printf '#!/bin/sh\\nexec $HOME/raycobo-env/bin/python -c \"from "
            f'ray.scripts.scripts import main; main()" "$@"\\n\' > {env_bin}/ray',
            f"printf '#!/bin/sh\\nexec $HOME/raycobo-env/bin/python -m mlflow "
            f'"$@"\\n\' > {env_bin}/mlflow',
            f"chmod +x {env_bin}/pip {env_bin}/ray {env_bin}/mlflow",
        ]
    )
    c["setup_commands"] = [
        cmd.replace("~/raycobo-env/bin/python -m pip", "~/raycobo-env/bin/pip")
        for cmd in c["setup_commands"]
    ]
    temp = tempfile.mkdtemp(prefix="ru-")  # short: Ray's socket paths max 107 bytes
    c["head_start_ray_commands"] = [
        cmd.replace(
            "--port=6379",
            f"--port={gcs} --node-ip-address=127.0.0.1 --temp-dir={temp} --num-cpus=2",
        )
        for cmd in c["head_start_ray_commands"]
        if " stop" not in cmd  # `ray stop` would stop every Ray of this user here
    ]
    c["worker_start_ray_commands"] = [
        cmd.replace(":6379", f":{gcs} --node-ip-address=127.0.0.2 --num-cpus=1")
        for cmd in c["worker_start_ray_commands"]
        if " stop" not in cmd
    ]
    return c


def _ray(*args, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "ray"), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.mark.timeout(1500)
def test_ray_up_submit_exec_down_over_ssh(tmp_path):
    """Prepare sshd on loopback and a copy of cluster/local.yaml; Execute ray up, ray
    submit (a run on the Ray engine, tracked on the head's MLflow server), ray exec 'ray
    status', ray down; Assert the setup ran (raycobo importable in the head's env), the
    run's numbers equal a local run's, its MLflow run reached the head, nothing is left."""
    token, mlflow_port, gcs = secrets.token_hex(32), free_port(), free_port()
    session_env = {
        "PATH": f"/usr/local/bin:/usr/bin:/bin:{VENV_BIN}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAYCOBO_MLFLOW_HOST": "127.0.0.1",
        "RAYCOBO_MLFLOW_PORT": str(mlflow_port),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }
    ssh = LoopbackSSH(tmp_path / "ssh", session_env)
    ssh.start()
    recipe = _recipe(ssh, gcs, workers=WORKERS)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    local_home = tmp_path / "local_home"  # ray up's own caches, not the real ~/.ray
    local_home.mkdir()
    env = {
        **os.environ,
        "HOME": str(local_home),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    head_home = ssh.home
    t0 = time.monotonic()
    try:
        up = _ray("up", "-y", "--no-config-cache", str(path), env=env, timeout=900)
        assert up.returncode == 0, (up.stdout + up.stderr)[-4000:]
        assert (head_home / "raycobo" / "pyproject.toml").is_file()  # the file mounts
        # the setup commands ran: raycobo importable in the env Ray was started from, from
        # the mounted copy (editable), with its own version
        probe = "import raycobo, ray; print(raycobo.__file__, raycobo.__version__)"
        check = ssh.ssh("127.0.0.1", f"cd / && ~/raycobo-env/bin/python -c '{probe}'")
        mounted = head_home / "raycobo" / "raycobo" / "__init__.py"
        assert check.returncode == 0 and str(mounted) in check.stdout, check
        nodes = 1 + len(WORKERS)
        deadline = time.monotonic() + 300  # the head's autoscaler starts the workers
        while True:
            status = _ray("exec", str(path), "ray status", env=env)
            active = status.stdout.split("Active:")[-1].split("Pending:")[0]
            count = sum(
                int(w.split()[0]) for w in active.strip().splitlines() if w.strip()[:1].isdigit()
            )
            if count >= nodes or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert count == nodes, status.stdout[-2000:]
        out = head_home / "runs" / "r"
        common = [
            "raycobo/examples/quickstart.yaml",
            "data.name=digits",
            "data.fraction=0.3",
            "data.partition.num_clusters=2",
            "data.partition.clients_per_cluster=2",
            "model.hidden=[16]",
            "rounds=12",
            "eval_every=6",
        ]
        sub = _ray(
            "submit",
            str(path),
            str(ROOT / "examples" / "cluster_launch.py"),
            "--",
            "run",
            *common,
            "engine.kind=ray",
            "-q",
            "--out",
            str(out),
            env=env,
        )
        assert sub.returncode == 0, (sub.stdout + sub.stderr)[-4000:]
        wall = time.monotonic() - t0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["engine"] == "ray"
        assert len(set(summary["engine_report"]["host_nodes"])) == nodes  # hosts on each
        status = _ray("exec", str(path), "ray status", env=env)
        assert status.returncode == 0 and "Resources" in status.stdout, status.stdout[-2000:]
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"http://127.0.0.1:{mlflow_port}")
        run = client.get_run(summary["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.metrics["mean_loss"] == pytest.approx(summary["mean_loss"])
        stop = _ray("exec", str(path), "~/raycobo/cluster/stop_mlflow.sh", env=env)
        assert stop.returncode == 0, stop.stderr[-1000:]
    finally:
        down = _ray("down", "-y", str(path), env=env, timeout=300)
        ssh.stop()
    assert down.returncode == 0, (down.stdout + down.stderr)[-3000:]
    import raycobo

    local = raycobo.run(
        str(ROOT / common[0].removeprefix("raycobo/")),
        tmp_path / "local",
        **{k.replace(".", "__"): yaml.safe_load(v) for k, v in (c.split("=") for c in common[1:])},
        track=False,
    )
    assert local.summary["mean_loss"] == pytest.approx(summary["mean_loss"], rel=1e-4)
    time.sleep(2)
    left = subprocess.run(
        ["pgrep", "-af", f"(gcs_server|raylet).*{gcs}|mlflow.*{mlflow_port}"],
        capture_output=True,
        text=True,
    )
    assert left.stdout.strip() == "", left.stdout
    print(f"ray up -> finished ray submit: {wall:.0f} s")
