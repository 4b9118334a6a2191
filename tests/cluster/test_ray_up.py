"""The design card's own workflow, run for real over SSH on this machine: `ray up`,
`ray exec ... 'ray status'`, `ray submit ... examples/cluster_launch.py` (a Ray-engine run,
and a sweep that loses its worker host), `ray down`, with cluster/local.yaml pointed at a
head on a throwaway sshd (tests/cluster/sshd_loopback.py) and, where network namespaces
can be made, a worker host in one (tests/cluster/netns_hosts.py).

The copy of the recipe changes only what one machine needs: the head's address, the
test's key and a ProxyCommand to the head's sshd port, free ports for Ray's GCS and
MLflow, and the first setup command, which creates ~/raycobo-env with a .pth onto this
virtual environment's packages instead of a bare venv (so that the recipe's own torch and
raycobo installs find torch present instead of copying 5 GB again, and install with
--no-index: the worker host has no route to the package index); raycobo itself is
installed, editable, from the mounted copy, as on a real node. Slow (about 2 minutes).
"""

from __future__ import annotations

import contextlib
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

from tests.cluster import netns_hosts
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


def _recipe(ssh: LoopbackSSH, gcs: int, workers: list[str], head_ip: str = "127.0.0.1") -> dict:
    c = yaml.safe_load((ROOT / "cluster" / "local.yaml").read_text())
    c["cluster_name"] = f"rc-{secrets.token_hex(3)}"
    c["provider"].update(head_ip=head_ip, worker_ips=workers)
    c["max_workers"] = len(workers)
    c["auth"] = {
        "ssh_user": os.environ.get("USER") or "root",
        "ssh_private_key": str(ssh.key),
        "ssh_proxy_command": ssh.proxy_command(),
    }
    # the recipe's project mounts from this checkout (no data set here)
    mounts = {r: str(ROOT / local) for r, local in c["file_mounts"].items()}
    c["file_mounts"] = {r: p for r, p in mounts.items() if r.startswith("~/raycobo/")}
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
    # every requirement is already there through the .pth, and a worker host in a
    # namespace has no route to the package index: install from what is present
    c["setup_commands"] = [
        cmd.replace(
            "~/raycobo-env/bin/python -m pip install",
            "~/raycobo-env/bin/pip install --no-index --no-build-isolation",
        )
        for cmd in c["setup_commands"]
    ]
    temp = tempfile.mkdtemp(prefix="ru-")  # short: Ray's socket paths max 107 bytes
    c["head_start_ray_commands"] = [
        cmd.replace(
            "--port=6379",
            f"--port={gcs} --node-ip-address={head_ip} --temp-dir={temp} --num-cpus=2",
        )
        for cmd in c["head_start_ray_commands"]
        if " stop" not in cmd  # `ray stop` would stop every Ray of this user here
    ]
    # a worker in a namespace finds its one address itself, as a real machine does
    own_ip = "" if head_ip != "127.0.0.1" else " --node-ip-address=127.0.0.2"
    c["worker_start_ray_commands"] = [
        cmd.replace(":6379", f":{gcs}{own_ip} --num-cpus=1")
        for cmd in c["worker_start_ray_commands"]
        if " stop" not in cmd
    ]
    return c


def _ray(*args, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "ray"), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


NETNS_MISSING = netns_hosts.available()  # None: worker hosts in namespaces can be made

SWEEP_SPACE = {
    "name": "two-hosts",
    "base": {
        "name": "digits-sweep",
        "rounds": 300,
        "eval_every": 20,
        "checkpoint": {"every": 20},
        "data": {"name": "digits", "fraction": 0.3, "partition": {"num_clusters": 2}},
        "model": {"hidden": [16]},
        "algorithm": {"name": "cobo"},
    },
    "space": {"algorithm.rho": {"grid": [0.5, 1.0, 2.0, 4.0]}},
    "metric": "mean_accuracy",
    "mode": "max",
    # ASHA's first rung (round 100) after the worker host is lost: trials end completed
    # or stopped, never failed
    "scheduler": {"kind": "asha", "grace_period": 5, "reduction_factor": 2},
    "num_samples": 1,
    "max_concurrent": 3,
    "resources": {"cpu": 1},
}


def _active_nodes(status: str) -> int:
    """The live nodes in `ray status` output: the counts under "Active:" (autoscaler v2)
    or "Healthy:" (v1), up to "Pending:"."""
    for heading in ("Active:", "Healthy:"):
        if heading in status:
            section = status.split(heading, 1)[1].split("Pending:", 1)[0]
            return sum(int(w.split()[0]) for w in section.splitlines() if w.strip()[:1].isdigit())
    return 0


def _rounds_run(trial_dir: Path) -> int | None:
    """The last round in a trial's rounds.csv, as its process writes it (the hosts share
    the file system)."""
    path = trial_dir / "run" / "rounds.csv"
    lines = path.read_text().splitlines() if path.is_file() else []
    last = lines[-1].split(",", 1)[0] if len(lines) > 1 else ""
    return int(last) if last.isdigit() else None


def _trials_running_in(ns: str) -> set[str]:
    """The trial folders' names that processes of a host work in: Tune runs a trial with
    its working directory named as the trial's folder. (Tune's result.json in the sweep's
    folder is the driver's copy, synced now and then: it can lag a trial by many reports.)"""
    names = set()
    for pid in netns_hosts.namespace_pids(ns):
        with contextlib.suppress(OSError):
            names.add(Path(os.readlink(f"/proc/{pid}/cwd")).name)
    return names


def _result_nodes(trial_dir: Path) -> list[str]:
    """The node_ip of every result a Tune trial reported, in order."""
    path = trial_dir / "result.json"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line).get("node_ip"))
    return rows


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("hosts", ["head", "head+worker"])
def test_ray_up_submit_exec_down_over_ssh(tmp_path, hosts):
    """Prepare sshd on loopback (and, as root, a worker host: a network namespace with its
    own address and sshd) and a copy of cluster/local.yaml; Execute ray up, ray exec 'ray
    status', ray submit of a run on the Ray engine (tracked on the head's MLflow server),
    with a worker host also ray submit of a sweep whose worker is killed mid-sweep, ray
    down; Assert the setup ran on every host, the run's client hosts span the nodes and its
    numbers equal a local run's, the sweep's trials ran on both hosts, were tracked on the
    head and finished after the loss (the lost one retried), and nothing is left running.
    """
    two = hosts == "head+worker"
    if two and NETNS_MISSING:
        pytest.skip(NETNS_MISSING)
    if not two and not NETNS_MISSING:
        pytest.skip("the head+worker case runs every step of this one here")
    net = None
    if two:
        netns_hosts.sweep_stale()  # what a crashed earlier run left
        net = netns_hosts.NamespaceHosts(secrets.token_hex(2), 1).open()
    head_ip = net.head_ip if net else "127.0.0.1"
    workers = net.ips if net else WORKERS
    token, mlflow_port, gcs = secrets.token_hex(32), free_port(), free_port()
    session_env = {
        "PATH": f"/usr/local/bin:/usr/bin:/bin:{VENV_BIN}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAYCOBO_MLFLOW_HOST": head_ip,
        "RAYCOBO_MLFLOW_PORT": str(mlflow_port),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }
    ssh = LoopbackSSH(tmp_path / "ssh", session_env, listen=(head_ip,) if net else ())
    path = tmp_path / "cluster.yaml"
    local_home = tmp_path / "local_home"  # ray up's own caches, not the real ~/.ray
    local_home.mkdir()
    env = {
        **os.environ,
        "HOME": str(local_home),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_UP_enable_autoscaler_v2": "0",  # as cluster/local.yaml says: v2 starts no worker
    }
    head_home, down, stopped, timings = ssh.home, None, False, {}
    t0 = time.monotonic()
    try:
        ssh.start()
        worker_homes = net.start_sshd(ssh) if net else []
        path.write_text(yaml.safe_dump(_recipe(ssh, gcs, workers, head_ip), sort_keys=False))
        up = _ray("up", "-y", "--no-config-cache", str(path), env=env, timeout=900)
        assert up.returncode == 0, (up.stdout + up.stderr)[-4000:]
        assert (head_home / "raycobo" / "pyproject.toml").is_file()  # the file mounts
        # the setup commands ran: raycobo importable in the env Ray was started from, from
        # the mounted copy (editable), with its own version
        probe = "import raycobo, ray; print(raycobo.__file__, raycobo.__version__)"
        check = ssh.ssh(head_ip, f"cd / && ~/raycobo-env/bin/python -c '{probe}'")
        mounted = head_home / "raycobo" / "raycobo" / "__init__.py"
        assert check.returncode == 0 and str(mounted) in check.stdout, check
        nodes = 1 + len(workers)
        deadline = time.monotonic() + 300  # the head's autoscaler starts the workers
        while True:
            status = _ray("exec", str(path), "ray status", env=env)
            count = _active_nodes(status.stdout)
            if count >= nodes or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert count == nodes, status.stdout[-2000:]
        timings["ray up, every node active"] = time.monotonic() - t0
        for home, ip in zip(worker_homes, workers, strict=True):  # set up there too
            check = ssh.ssh(ip, f"cd / && ~/raycobo-env/bin/python -c '{probe}'", port=22)
            mounted = home / "raycobo" / "raycobo" / "__init__.py"
            assert check.returncode == 0 and str(mounted) in check.stdout, check
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
        timings["ray up -> finished run"] = time.monotonic() - t0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["engine"] == "ray"
        assert len(set(summary["engine_report"]["host_nodes"])) == nodes  # hosts on each
        status = _ray("exec", str(path), "ray status", env=env)
        assert status.returncode == 0 and "Resources" in status.stdout, status.stdout[-2000:]
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"http://{head_ip}:{mlflow_port}")
        run = client.get_run(summary["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.metrics["mean_loss"] == pytest.approx(summary["mean_loss"])
        if net:
            timings.update(_sweep_losing_the_worker(path, env, net, head_home, client))
        stop = _ray("exec", str(path), "~/raycobo/cluster/stop_mlflow.sh", env=env)
        assert stop.returncode == 0, stop.stderr[-1000:]
        stopped = True
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            if not stopped:  # the MLflow server of a test that failed on the way
                _ray("exec", str(path), "~/raycobo/cluster/stop_mlflow.sh", env=env, timeout=60)
            down = _ray("down", "-y", str(path), env=env, timeout=300)
        ssh.stop()
        if net:
            left_in_worker = [
                p
                for ns in net.names
                for p in netns_hosts.namespace_pids(ns)
                if p not in net.sshd_pids()
            ]
            net.close()
    assert down is not None and down.returncode == 0, (down.stdout + down.stderr)[-3000:]
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
    if net:
        assert left_in_worker == [], "processes left in the worker host after ray down"
    print(", ".join(f"{k}: {v:.0f} s" for k, v in timings.items()))


def _sweep_losing_the_worker(path: Path, env, net, head_home: Path, client) -> dict:
    """`ray submit` of a sweep; once a trial has reported from the worker host, every
    process there is killed (a machine lost: raylet, workers, the trial, its sshd);
    the sweep must finish every trial, the lost one retried from its checkpoint on the
    head, each trial an MLflow run under the sweep's parent on the head's server."""
    space = head_home / "space.yaml"
    space.write_text(yaml.safe_dump(SWEEP_SPACE, sort_keys=False))
    sweep_dir = head_home / "sweeps" / "s"
    t0 = time.monotonic()
    cmd = [str(VENV_BIN / "ray"), "submit", str(path), str(ROOT / "examples" / "cluster_launch.py")]
    cmd += ["--", "sweep", "space.yaml", "--out", str(sweep_dir)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    worker, lost, seen = net.ips[0], None, {}
    try:
        deadline = time.monotonic() + 300
        while lost is None:
            assert proc.poll() is None, proc.stdout.read()[-4000:]
            assert time.monotonic() < deadline, f"no trial caught running on the worker: {seen}"
            running = _trials_running_in(net.names[0])
            for trial_dir in sorted((sweep_dir / "tune").glob("trial_*")):
                done = _rounds_run(trial_dir)
                seen[trial_dir.name] = (trial_dir.name in running, done)
                # on the worker, past its checkpoint at round 20 (reported: the run is at
                # the next evaluation's rounds) and well before its first rung (100)
                if trial_dir.name in running and done is not None and 30 <= done <= 70:
                    lost, lost_at = trial_dir, done
            time.sleep(0.1)
        killed_at = time.monotonic() - t0
        for ns in net.names:  # the machine lost, sshd too: the autoscaler cannot revive it
            netns_hosts.kill_namespace_processes(ns)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((sweep_dir / "sweep_summary.json").read_text())
    trials = summary["trials"]
    assert len(trials) == 4 and {t["status"] for t in trials} <= {"completed", "stopped"}, trials
    assert summary["completed"] >= 1 and summary["failed"] == 0
    assert summary["test"]["mean_accuracy"] is not None  # the best values run once on test
    reported = _result_nodes(lost)
    run = json.loads((lost / "run" / "summary.json").read_text())
    what = f"killed at round {lost_at}; {reported}; its run: {run}\n{output[-3000:]}"
    # the lost trial: results from the worker, then (retried from its checkpoint) the head
    assert reported[0] == worker and reported[-1] == net.head_ip, what
    assert 20 <= run["resumed_from_round"] < 100, what  # from a checkpoint of the worker's
    assert {t["node"] for t in trials} <= {worker, net.head_ip}
    runs = client.search_runs(
        experiment_ids=[client.get_run(summary["mlflow_parent_run_id"]).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{summary['mlflow_parent_run_id']}'",
    )
    trial_runs = [r for r in runs if r.data.tags.get("raycobo.sweep_role") == "trial"]
    assert len(trial_runs) >= 4  # every trial tracked on the head (the lost one may hold two)
    # each trial's run ends FINISHED (stopped ones too); the lost host's first run of
    # its trial may be left as its killed process had it, beside the retry's
    assert sum(r.info.status == "FINISHED" for r in trial_runs) >= 4
    return {"sweep: worker killed at": killed_at, "sweep finished": time.monotonic() - t0}
