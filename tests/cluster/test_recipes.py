"""Cluster recipes pass Ray's own checks (what `ray up` runs before it connects to any
machine) and carry what raycobo needs on the nodes (no SSH or cloud account here)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "cluster").glob("*.yaml"))


def test_recipes_are_found():
    assert {p.name for p in RECIPES} >= {"cluster.yaml", "local.yaml"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_passes_ray_up_validation(path):
    """`ray up` first merges the provider's defaults (prepare_config) and then checks the
    result against the autoscaler's JSON schema (validate_config); for the local provider
    the whole bootstrap up to the first SSH connection runs offline."""
    import copy

    pytest.importorskip("jsonschema")
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(path.read_text())
    validate_config(prepare_config(copy.deepcopy(raw)))
    if raw["provider"]["type"] == "local":
        from ray.autoscaler._private.commands import _bootstrap_config

        done = _bootstrap_config(copy.deepcopy(raw), no_config_cache=True)
        assert done["available_node_types"]["local.cluster.node"]["min_workers"] == len(
            raw["provider"]["worker_ips"]
        )


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "cluster" / name).read_text())


def test_aws_cluster_yaml():
    c = load("cluster.yaml")
    for key in (
        "cluster_name",
        "provider",
        "auth",
        "available_node_types",
        "head_node_type",
        "setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    ):
        assert key in c, key
    assert c["provider"]["type"] == "aws" and c["provider"]["region"]
    assert c["head_node_type"] in c["available_node_types"]
    for name, node in c["available_node_types"].items():
        assert "InstanceType" in node["node_config"] and "ImageId" in node["node_config"], name
    workers = [n for k, n in c["available_node_types"].items() if k != c["head_node_type"]]
    assert all(n["max_workers"] >= n["min_workers"] for n in workers)
    assert any("pip install" in cmd and 'raycobo[cluster]"' in cmd for cmd in c["setup_commands"])
    assert any("constraints.txt" in cmd for cmd in c["setup_commands"])
    assert any("ray start --head" in cmd for cmd in c["head_start_ray_commands"])
    assert any("$RAY_HEAD_IP" in cmd for cmd in c["worker_start_ray_commands"])
    assert any("start_mlflow.sh" in cmd for cmd in c["head_setup_commands"])
    script = (ROOT / "cluster" / "start_mlflow.sh").read_text()
    assert "mlflow server" in script and "0.0.0.0" not in script  # the cluster address


def test_local_cluster_yaml():
    c = load("local.yaml")
    assert c["provider"]["type"] == "local"
    assert c["provider"]["head_ip"] and c["provider"]["worker_ips"]
    assert c["auth"]["ssh_user"]
    assert any("ray start --head" in cmd for cmd in c["head_start_ray_commands"])


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_mounts_the_project_not_the_checkout(path, tmp_path):
    """`ray up` reads every file under a mount to hash it before it syncs: the recipes
    mount the project's own paths, never the root (a virtual environment, runs/), and
    what they mount is enough for the setup commands' editable install."""
    import subprocess
    import sys

    mounts = yaml.safe_load(path.read_text())["file_mounts"]
    project = {r: local for r, local in mounts.items() if r.startswith("~/raycobo/")}
    assert set(mounts) - set(project) == {"~/data"}
    for remote, local in project.items():
        assert (ROOT / local).resolve() != ROOT and (ROOT / local).exists(), local
        assert remote == "~/raycobo/" + local.removeprefix("./"), remote
    assert {"raycobo", "pyproject.toml", "constraints.txt", "cluster"} <= {
        r.removeprefix("~/raycobo/") for r in project
    }
    copy = tmp_path / "raycobo"
    for local in project.values():
        src, dst = ROOT / local, copy / local
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    meta = subprocess.run(
        [
            sys.executable,
            "-c",
            "import setuptools.build_meta as b; "
            f"print(b.prepare_metadata_for_build_wheel({str(tmp_path)!r}))",
        ],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert meta.returncode == 0, meta.stderr[-2000:]
    assert (tmp_path / meta.stdout.split()[-1] / "METADATA").is_file()


def test_launcher_adds_cluster_defaults_only_where_unset():
    spec = importlib.util.spec_from_file_location("launch", ROOT / "examples" / "cluster_launch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = mod.cluster_args(["run", "x.yaml", "rounds=5"], tracking_host="head")
    assert args[-2:] == ["engine.address=auto", "tracking.uri=http://head:5000"]
    mine = mod.cluster_args(
        ["sweep", "s.yaml", "engine.address=ray://h:10001", "tracking.uri=http://m:5000"]
    )
    assert mine.count("engine.address=ray://h:10001") == 1 and len(mine) == 4
    assert mod.cluster_args(["--help"]) == ["--help"]
