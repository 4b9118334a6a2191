"""Your own method, data and model: plugins named by import path or entry point, found
by the registries the built-ins use, validated, run, resumed, compared, tracked and
swept like them; the Python API."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

import raycobo
from raycobo.cli import app
from raycobo.config import ConfigError, load_config
from tests.helpers import DIGITS

REPO = Path(__file__).resolve().parents[1]
FEDPROX = REPO / "examples" / "plugins" / "fedprox.py"
GOSSIP = REPO / "examples" / "plugins" / "gossip.py"

MODELS_PY = """
import torch
import yaml
from torch import nn


class TinyNet(nn.Module):
    def __init__(self, input_shape, num_classes, width=8):
        super().__init__()
        features = int(torch.tensor(input_shape).prod())
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(features, width), nn.Tanh())
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.body(x))


def not_a_module(input_shape, num_classes):
    return 3
"""

DATA_PY = '''
import torch
import yaml
from raycobo import RawDataset


def blobs(cfg, seed):
    """Four Gaussian blobs in 2-D (classes), sized by data.options."""
    g = torch.Generator().manual_seed(seed)
    n = cfg.options.get("n", 400)
    y = torch.randint(0, 4, (n,), generator=g)
    centers = torch.tensor([[2.0, 0], [0, 2.0], [-2.0, 0], [0, -2.0]])
    x = centers[y] + 0.5 * torch.randn(n, 2, generator=g)
    return RawDataset("blobs", x[: n // 2], y[: n // 2], x[n // 2 :], y[n // 2 :], 4)


def wrong(cfg, seed):
    return [1, 2, 3]
'''

BROKEN_PY = """
from raycobo import MethodConfig


class NoSettings:
    name = "x"


class Half:
    name = "half"
    Settings = MethodConfig

    def init(self, ops):
        return None
"""


@pytest.fixture
def plugins(tmp_path):
    """A plugin folder with FedProx (the example), a model, a data set and broken ones."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    shutil.copy(FEDPROX, folder / "fp_mod.py")
    shutil.copy(GOSSIP, folder / "examples_gossip.py")
    (folder / "my_models.py").write_text(MODELS_PY)
    (folder / "my_data.py").write_text(DATA_PY)
    (folder / "broken.py").write_text(BROKEN_PY)
    yield folder
    for name in ("fp_mod", "examples_gossip", "my_models", "my_data", "broken"):
        sys.modules.pop(name, None)


def fedprox(folder: Path, *extra: str) -> list[str]:
    return [
        *DIGITS,
        f"plugin_paths=[{folder}]",
        "algorithm.name=fp_mod:FedProx",
        "algorithm.local_steps=3",
        *extra,
    ]


def test_fedprox_with_mu_zero_gives_fedavgs_numbers(tmp_path, plugins):
    """The worked example is a real FedProx: with mu = 0 every client's metric at every
    evaluation is FedAvg's (metrics.csv byte for byte)."""
    prox = raycobo.run(load_config(None, fedprox(plugins, "algorithm.mu=0")), tmp_path / "p")
    base = load_config(None, [*DIGITS, "algorithm.name=fedavg", "algorithm.local_steps=3"])
    avg = raycobo.run(base, tmp_path / "a")
    assert (tmp_path / "p" / "metrics.csv").read_bytes() == (
        tmp_path / "a" / "metrics.csv"
    ).read_bytes()
    assert prox.summary["algorithm"] == "fp_mod:FedProx"
    mu = raycobo.run(load_config(None, fedprox(plugins, "algorithm.mu=1.0")), tmp_path / "m")
    assert mu.summary["mean_loss"] != avg.summary["mean_loss"]  # mu does something


def test_gossip_plugin_is_decentralized_sgd_on_a_ring(tmp_path, plugins):
    """The second example (a method that steps in rows): M is the ring's uniform
    neighbourhood mean; with no neighbours (M = I) it is Local, bit for bit; with k it
    averages the stepped models over i - k .. i + k."""
    import importlib

    from tests.helpers import build

    base = [*DIGITS, f"plugin_paths=[{plugins}]", "rounds=4"]
    cfg = load_config(
        None, [*base, "algorithm.name=examples_gossip:Gossip", "algorithm.neighbors=0"]
    )
    ring = importlib.import_module("examples_gossip").ring  # found on the plugin path
    M = ring(5, 1)
    assert torch.allclose(M.sum(1), torch.ones(5)) and M[0, 4] == M[0, 1] == M[0, 0] == 1 / 3
    assert M[0, 2] == 0 and torch.equal(ring(4, 0), torch.eye(4))
    local = load_config(None, [*base, "algorithm.name=local"])
    (_, ops, g), (_, ops_l, lo) = build(cfg), build(local)
    a, b = g.init(ops), lo.init(ops_l)
    for t in range(4):
        a, _ = g.round(a, t, ops)
        b, _ = lo.round(b, t, ops_l)
    assert torch.equal(g.eval_params(a), lo.eval_params(b))
    k1 = load_config(None, [*base, "algorithm.name=examples_gossip:Gossip"])
    _, ops, g1 = build(k1)
    s0 = g1.init(ops)
    s1, _ = g1.round(s0, 0, ops)
    G, _ = ops.grads(torch.arange(ops.n_clients), s0.X, 0, 1, 0)
    torch.testing.assert_close(s1.X, ring(ops.n_clients, 1) @ (s0.X - k1.algorithm.lr * G))


def test_plugin_method_on_both_local_engines_and_its_settings(tmp_path, plugins):
    from tests.helpers import on_engines

    cfg = load_config(None, fedprox(plugins, "algorithm.mu=0.1"))
    assert type(cfg.algorithm).__name__ == "FedProxConfig" and cfg.algorithm.mu == 0.1
    (_, ops_a, a), (_, ops_b, b) = on_engines(cfg, 3)
    torch.testing.assert_close(a.w, b.w, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match=r"'algorithm.mu'.*greater than or equal to 0"):
        load_config(None, fedprox(plugins, "algorithm.mu=-1"))
    with pytest.raises(ConfigError, match="algorithm.lam': fp_mod:FedProx has no setting 'lam'"):
        load_config(None, fedprox(plugins, "algorithm.lam=1"))
    res = CliRunner().invoke(
        app, ["run", "--help-config", "fp_mod:FedProx"], env={"PYTHONPATH": str(plugins)}
    )
    assert res.exit_code == 0 and "algorithm.mu" in res.output and "0.01" in res.output


def test_plugin_method_resumes_bit_exactly(tmp_path, plugins):
    from raycobo.lifecycle import RunFailed
    from raycobo.lifecycle.experiment import resume_config, run_experiment
    from tests.helpers import StopAt

    cfg = load_config(None, fedprox(plugins, "rounds=8", "eval_every=2"))
    full = run_experiment(cfg, tmp_path / "full")
    with pytest.raises(RunFailed):
        run_experiment(cfg, tmp_path / "cut", [StopAt(5, RuntimeError("crash"))])
    resumed = run_experiment(resume_config(tmp_path / "cut"), tmp_path / "cut", resume=True)
    assert resumed.summary["resumed_from_round"] == 4
    for name in ("metrics.csv", "rounds.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
    assert resumed.summary["history"] == full.summary["history"]


def test_plugin_next_to_builtins_in_compare_and_mlflow(tmp_path, plugins):
    """`raycobo compare` runs the plugin as a variant beside FedAvg and CoBo; every run is
    an MLflow child with the plugin's own params."""
    from mlflow.tracking import MlflowClient

    db = tmp_path / "m.db"
    cfg = load_config(
        None,
        [
            *[d for d in DIGITS if not d.startswith("tracking.")],
            f"plugin_paths=[{plugins}]",
            f"tracking.uri=sqlite:///{db}",
            f"tracking.artifact_root={tmp_path / 'art'}",
            "compare.variants={fedprox: {algorithm.name: 'fp_mod:FedProx', algorithm.mu: 0.1}}",
        ],
    )
    cmp = raycobo.compare(cfg, ["fedavg", "cobo", "fedprox"], out=tmp_path / "c")
    assert [r["algorithm"] for r in cmp.rows] == ["fedavg", "cobo", "fedprox"]
    assert all(r["mean_accuracy"] is not None for r in cmp.rows)
    assert list(cmp.frame()["algorithm"]) == ["fedavg", "cobo", "fedprox"]
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    mine = [r for r in runs if r.data.params.get("algorithm.name") == "fp_mod:FedProx"]
    assert len(mine) == 1 and mine[0].data.params["algorithm.mu"] == "0.1"
    assert mine[0].info.status == "FINISHED"


def test_plugin_data_set_and_model(tmp_path, plugins):
    """A data set (a loader returning a RawDataset, partitioned like the built-ins, its
    settings in data.options) and a model (an nn.Module with constructor options)."""
    cfg = load_config(
        None,
        [
            "rounds=20",
            "eval_every=10",
            "tracking.enabled=false",
            f"plugin_paths=[{plugins}]",
            "data.name=my_data:blobs",
            "data.options={n: 600}",
            "data.partition.num_clusters=2",
            "data.partition.clients_per_cluster=2",
            "data.fraction=0.5",
            "model.name=my_models:TinyNet",
            "model.options={width: 6}",
            "algorithm.name=local",
        ],
    )
    res = raycobo.run(cfg, tmp_path / "r")
    assert res.summary["dataset"] == "my_data:blobs" and res.summary["model"] == "my_models:TinyNet"
    assert res.summary["n_clients"] == 4 and res.mean_accuracy > 0.4
    frame = res.frame("metrics")
    assert set(frame["client"]) == {0, 1, 2, 3} and len(res.rounds()) == 20


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("algorithm.name=nowhere.mod:X", "cannot import module 'nowhere.mod'"),
        ("algorithm.name=broken:Missing", "module 'broken' has no 'Missing'"),
        ("algorithm.name=broken:NoSettings", "has no settings class"),
        ("algorithm.name=broken:Half", "does not implement the Algorithm protocol"),
        ("algorithm.name=nosuchmethod", "unknown method 'nosuchmethod'"),
        ("data.name=my_data:wrong", "returned a list, not a raycobo RawDataset"),
        ("model.name=my_models:not_a_module", "built a int, not a torch.nn.Module"),
        ("model.options={depth: 3}", "model.options': mlp is a built-in model"),
        ("data.options={n: 3}", "data.options': digits is a built-in data set"),
    ],
)
def test_bad_plugins_stop_with_one_line_and_exit_2(tmp_path, plugins, override, needle):
    args = ["run", "-", *DIGITS, f"plugin_paths=[{plugins}]", override, "-q"]
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("name: p\n")
    args[1] = str(cfg_file)
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.strip().splitlines()
    assert needle in line, line


def test_a_plugin_named_on_the_command_line_is_found_in_the_configs_plugin_paths(tmp_path):
    """plugin_paths in the YAML, the method on the command line (run and --help-config);
    a file path where an import path belongs is one line saying what to write instead."""
    folder = tmp_path / "plug"
    folder.mkdir()
    shutil.copy(FEDPROX, folder / "cmdline_prox.py")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: p\nplugin_paths: [plug]\nalgorithm: {name: cobo, lr: 0.1}\n")
    try:  # (each case in a fresh folder: a folder once searched stays on sys.path)
        args = [*DIGITS, "rounds=2", "algorithm.name=cmdline_prox:FedProx", "-q"]
        ran = CliRunner().invoke(app, ["run", str(cfg), *args, "--out", str(tmp_path / "o")])
        assert ran.exit_code == 0, ran.output
        assert json.loads((tmp_path / "o" / "summary.json").read_text())["algorithm"] == (
            "cmdline_prox:FedProx"
        )
        other = tmp_path / "other"
        (other / "plug").mkdir(parents=True)
        shutil.copy(FEDPROX, other / "plug" / "helped_prox.py")
        (other / "c.yaml").write_text("name: p\nplugin_paths: [plug]\n")
        helped = CliRunner().invoke(
            app, ["run", str(other / "c.yaml"), "--help-config", "helped_prox:FedProx"]
        )
        assert helped.exit_code == 0, helped.output
        assert "algorithm.mu" in helped.output
    finally:
        sys.modules.pop("helped_prox", None)
        sys.modules.pop("cmdline_prox", None)
    bad = CliRunner().invoke(
        app, ["run", str(cfg), *DIGITS, "algorithm.name=plug/cmdline_prox.py:FedProx", "-q"]
    )
    assert bad.exit_code == 2
    (line,) = bad.stderr.strip().splitlines()
    assert "is a file path" in line and "'cmdline_prox:FedProx'" in line, line


def _install_entry_point(site: Path, plugins: Path) -> None:
    """An installed distribution as importlib.metadata sees one: its module and a
    .dist-info with entry points (what `pip install` writes into site-packages)."""
    shutil.copy(plugins / "fp_mod.py", site / "fedprox_pkg.py")
    info = site / "fedprox_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedprox-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[raycobo.methods]\nfedprox = fedprox_pkg:FedProx\n"
        "[raycobo.models]\ntinynet = tiny_models:TinyNet\n"
    )
    (site / "tiny_models.py").write_text(MODELS_PY)


def test_installed_plugins_are_found_by_name(tmp_path, plugins, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    _install_entry_point(site, plugins)
    monkeypatch.syspath_prepend(str(site))
    from raycobo.algorithms import method, method_names

    assert "fedprox" in method_names()
    assert method("fedprox").settings.__name__ == "FedProxConfig"
    cfg = load_config(None, [*DIGITS, "algorithm.name=fedprox", "model.name=tinynet"])
    res = raycobo.run(cfg, tmp_path / "r")
    assert res.status == "completed" and res.summary["algorithm"] == "fedprox"
    # the command line finds it too (a fresh process, the distribution on its path)
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-m", "raycobo", "run", "--help-config", "fedprox"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0 and "algorithm.mu" in out.stdout, out.stderr
    for mod in ("fedprox_pkg", "tiny_models"):
        sys.modules.pop(mod, None)


def test_python_api_round_trip(tmp_path):
    cfg = load_config(None, DIGITS)
    res = raycobo.run(cfg, tmp_path / "r", rounds=4, algorithm__name="cobo")
    assert isinstance(res, raycobo.Result) and res.summary["rounds"] == 4
    assert res.W is not None and res.W.shape == (4, 4)
    assert list(res.frame("history")["round"]) == [0, 3, 4]
    longer = raycobo.resume(tmp_path / "r", rounds=6)
    assert longer.summary["rounds"] == 6 and longer.summary["resumed_from_round"] == 4
    again = raycobo.load_run(tmp_path / "r")
    assert again.summary == longer.summary and len(again.metrics()) == 4 * 4
    with pytest.raises(ConfigError, match="not a run directory"):
        raycobo.load_run(tmp_path)
    tree = json.loads(json.dumps(cfg.to_dict()))
    from_dict = raycobo.run(tree, tmp_path / "d", rounds=4)
    assert from_dict.summary["mean_loss"] == res.summary["history"][-1]["mean_loss"]


def test_the_api_names_its_bad_arguments_and_pins_a_mappings_plugin_paths(tmp_path, monkeypatch):
    """(#39: 15, 17) A path argument that is not a path, a misspelled keyword (not taken
    for a config key), true/false for a number: one line naming the argument or key. A
    mapping's relative plugin_paths are stored absolute, so the run resumes from
    anywhere."""
    cfg = load_config(None, DIGITS)
    for call, needle in [
        (lambda: raycobo.run(cfg, out=42), "raycobo.run: out must be a folder path"),
        (lambda: raycobo.load_run(None), "raycobo.load_run: run_dir must be a folder path"),
        (lambda: raycobo.run(cfg, tmp_path / "x", trak=False), "did you mean 'track'"),
        (lambda: raycobo.compare(cfg, sedes=[0]), "raycobo.compare: unknown keyword 'sedes'"),
        (lambda: raycobo.compare(cfg, seed=[0]), "'seed': Input should be a valid integer"),
        (lambda: raycobo.run(cfg, tmp_path / "y", rounds=True), "'rounds': expected a number"),
        (lambda: load_config(None, ["algorithm.lr=true"]), "'algorithm.lr': expected a number"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            call()
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    folder = tmp_path / "work" / "plug"
    folder.mkdir(parents=True)
    shutil.copy(FEDPROX, folder / "api_prox.py")
    monkeypatch.chdir(tmp_path / "work")
    tree = {**cfg.to_dict(), "plugin_paths": ["plug"], "rounds": 2}
    tree["algorithm"] = {"name": "api_prox:FedProx"}
    try:
        raycobo.run(tree, tmp_path / "r")
        stored = load_config(tmp_path / "r" / "config.yaml").plugin_paths
        assert stored == [str(folder.resolve())]
    finally:
        sys.modules.pop("api_prox", None)


def test_arrays_from_one_file_through_every_partition(tmp_path):
    """A .npz with features and labels, split among clients by each partition; the same
    arrays in a .pt file give the same data."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 3, 4)).astype(np.float32)
    y = rng.integers(0, 6, size=600)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    torch.save({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, tmp_path / "d.pt")
    from raycobo.data import PARTITIONS, load_data

    for kind in PARTITIONS:
        over = [
            "data.name=arrays",
            f"data.path={tmp_path / 'd.npz'}",
            f"data.partition.kind={kind}",
            "data.partition.num_clusters=2",
            "data.partition.clients_per_cluster=2",
            "data.partition.classes_per_client=2",
            "data.partition.shards_per_class=2",
            "data.fraction=0.5",
        ]
        data = load_data(load_config(None, over))
        assert data.n_clients >= 2 and data.input_shape == (3, 4), kind
        assert all(t.numel() > 0 for t in data.train_idx), kind
        pt = load_data(load_config(None, [*over[:1], f"data.path={tmp_path / 'd.pt'}", *over[2:]]))
        assert torch.equal(pt.train_x, data.train_x) and all(
            torch.equal(a, b) for a, b in zip(pt.train_y, data.train_y, strict=True)
        )


def test_arrays_one_file_per_client_keep_their_clusters(tmp_path):
    folder = tmp_path / "clients"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for c in range(3):
        n = 30 + 10 * c
        np.savez(
            folder / f"client{c}.npz",
            x=rng.normal(size=(n, 5)).astype(np.float32),
            y=rng.integers(0, 3, size=n),
            cluster=np.int64(c % 2),
        )
    from raycobo.data import load_data

    cfg = load_config(None, ["data.name=arrays", f"data.path={folder}", "model.hidden=[8]"])
    data = load_data(cfg)
    assert data.n_clients == 3 and data.clusters == [0, 1, 0]
    assert [t.numel() + s.numel() for t, s in zip(data.train_idx, data.test_idx, strict=True)] == [
        30,
        40,
        50,
    ]
    res = raycobo.run(cfg, tmp_path / "r", rounds=3, eval_every=3, tracking__enabled=False)
    assert res.status == "completed"
    with pytest.raises(ConfigError, match="data.partition'"):
        load_data(load_config(None, [*cfg_over(folder), "data.partition.kind=shards"]))


def cfg_over(folder: Path) -> list[str]:
    return ["data.name=arrays", f"data.path={folder}"]


def test_image_folder_layout_through_the_partitions(tmp_path):
    from PIL import Image

    from raycobo.data import load_data

    rng = np.random.default_rng(2)
    for split in ("train", "test"):
        for k, cls in enumerate(["cat", "dog", "eel"]):
            d = tmp_path / "imgs" / split / cls
            d.mkdir(parents=True)
            for i in range(8 if split == "train" else 3):
                pixels = rng.integers(0, 255, size=(8, 8, 3), dtype=np.uint8) // (k + 1)
                Image.fromarray(pixels).save(d / f"{i}.png")
    over = ["data.name=image_folder", f"data.root={tmp_path / 'imgs'}", "data.fraction=1.0"]
    for kind in ("label_permutation", "disjoint_classes", "dirichlet"):
        extra = ["data.partition.num_clusters=3", "data.partition.clients_per_cluster=1"]
        data = load_data(load_config(None, [*over, f"data.partition.kind={kind}", *extra]))
        assert data.input_shape == (3, 8, 8) and data.n_clients == 3, kind
    resized = load_data(load_config(None, [*over, "data.image_size=4"]))
    assert resized.input_shape == (3, 4, 4)
    (tmp_path / "imgs" / "train" / "cat" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ConfigError, match="cannot read image .*bad.png"):
        load_data(load_config(None, over))


def test_bad_data_files_are_one_line(tmp_path):
    from raycobo.data import load_data

    (tmp_path / "t.npz").write_bytes(b"PK\x03\x04 truncated")
    for path, needle in [
        (tmp_path / "t.npz", "cannot read"),
        (tmp_path / "missing.npz", "is not a .npz or .pt file"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            load_data(load_config(None, ["data.name=arrays", f"data.path={path}"]))
    with pytest.raises(ConfigError, match="data.path': fashion_mnist does not read it"):
        load_data(load_config(None, ["data.name=fashion_mnist", f"data.path={tmp_path}"]))


def test_labels_are_checked_against_a_class_count_before_a_model_is_built(tmp_path):
    """One label of 10^9 made the output layer 10^9 wide (an 8 GB allocation): it stops
    at load naming the file, exit 2; data.num_classes declares C and is checked."""
    from raycobo.data import load_data

    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 5)).astype(np.float32)
    y = np.arange(40) % 4
    huge = y.copy()
    huge[3] = 10**9
    np.savez(tmp_path / "huge.npz", x=x, y=huge)
    np.savez(tmp_path / "fine.npz", x=x, y=y)
    args = ["run", str(tmp_path / "c.yaml"), "data.name=arrays", "rounds=2", "-q"]
    (tmp_path / "c.yaml").write_text(f"name: labels\ndata: {{path: {tmp_path / 'huge.npz'}}}\n")
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    (line,) = res.stderr.strip().splitlines()
    assert "huge.npz" in line and "largest label is 1000000000" in line, line
    fine = ["data.name=arrays", f"data.path={tmp_path / 'fine.npz'}"]
    assert load_data(load_config(None, fine)).num_classes == 4
    assert load_data(load_config(None, [*fine, "data.num_classes=6"])).num_classes == 6
    with pytest.raises(ConfigError, match=r"label 3 is out of range for data.num_classes = 3"):
        load_data(load_config(None, [*fine, "data.num_classes=3"]))
    with pytest.raises(ConfigError, match="data.num_classes.: applies to data.name=arrays"):
        load_config(None, ["data.name=digits", "data.num_classes=10"])


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("nan", "features 'x' hold NaN or infinite values"),
        ("strings", "features 'x' are <U"),
        ("width", "'x' rows are (5,), 'x_test' rows (4,)"),
        ("empty", "'x' holds no rows"),
        ("cluster", "'cluster' must be one integer"),
    ],
)
def test_bad_arrays_stop_at_load_naming_the_file(tmp_path, case, needle):
    """NaN or string features, train/test widths that differ, an empty client file and a
    non-scalar cluster failed mid-run (exit 1): now exit 2 at load, before any round, the
    file named, with no run directory left."""
    folder = tmp_path / "clients"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for c in range(3):
        arrays = {
            "x": rng.normal(size=(12, 5)).astype(np.float32),
            "y": np.arange(12) % 3,
            "x_test": rng.normal(size=(6, 5)).astype(np.float32),
            "y_test": np.arange(6) % 3,
            "cluster": np.int64(c % 2),
        }
        if c == 1:
            if case == "nan":
                arrays["x"][3, 2] = np.nan
            elif case == "strings":
                arrays["x"] = np.array([["a"] * 5] * 12)
            elif case == "width":
                arrays["x_test"] = arrays["x_test"][:, :4]
            elif case == "empty":
                arrays = {k: v[:0] if k in ("x", "y") else v for k, v in arrays.items()}
            elif case == "cluster":
                arrays["cluster"] = np.array([0, 1])
        np.savez(folder / f"client{c}.npz", **arrays)
    out = tmp_path / "o"
    (tmp_path / "c.yaml").write_text(f"name: a\ndata: {{name: arrays, path: {folder}}}\n")
    res = CliRunner().invoke(app, ["run", str(tmp_path / "c.yaml"), "-q", "--out", str(out)])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.strip().splitlines()
    assert "client1.npz" in line and needle in line, line
    assert not out.exists()  # refused as the run starts: no run directory is left (#70)


def test_a_failed_extension_never_changes_the_finished_runs_summary(tmp_path):
    """(#39 item 8) Resuming a finished run to more rounds after its plugin changed (here:
    it now fails in its round) left the run `failed` with its mean_loss nulled. The
    finished summary stays, the extension's failure beside it; the plugin put back, the
    extension goes on (each change of the plugin's source said: --trust-files)."""
    folder = tmp_path / "plug"
    folder.mkdir()
    good = FEDPROX.read_text()
    (folder / "ext_prox.py").write_text(good)
    cfg = load_config(
        None, [*DIGITS, "rounds=4", f"plugin_paths=[{folder}]", "algorithm.name=ext_prox:FedProx"]
    )
    try:
        done = raycobo.run(cfg, tmp_path / "r")
        before = json.loads((tmp_path / "r" / "summary.json").read_text())
        assert before["status"] == "completed" and before["mean_loss"] is not None
        broken = good.replace(
            "    def round(self",
            "    def round(self, *a):\n        raise RuntimeError('changed plugin')\n\n"
            "    def _old_round(self",
            1,
        )
        assert broken != good
        (folder / "ext_prox.py").write_text(broken)
        sys.modules.pop("ext_prox", None)
        with pytest.raises(ConfigError, match="'ext_prox' .* changed since it ran"):
            raycobo.resume(tmp_path / "r", rounds=8)
        with pytest.raises(Exception, match="changed plugin"):
            raycobo.resume(tmp_path / "r", rounds=8, trust_files=True)
        after = json.loads((tmp_path / "r" / "summary.json").read_text())
        ext = after.pop("extension")
        assert after == before  # the finished run's record, as it was
        assert ext["status"] == "failed" and "changed plugin" in ext["error"] and ext["rounds"] == 8
        assert raycobo.load_run(tmp_path / "r").summary["mean_loss"] == done.summary["mean_loss"]
        (folder / "ext_prox.py").write_text(good)
        sys.modules.pop("ext_prox", None)
        longer = raycobo.resume(tmp_path / "r", rounds=8, trust_files=True)
        assert longer.summary["status"] == "completed" and longer.summary["rounds"] == 8
        assert "extension" not in longer.summary
    finally:
        sys.modules.pop("ext_prox", None)


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        (
            "return state.w.expand(state.n, -1)",
            "return state.w",
            r"fedprox.eval_params returned shape \(\d+,\); expected a tensor of shape \(4, \d+\)",
        ),
        (
            "    def collaboration(self, state: FedProxState) -> None:\n        return None",
            "    def collaboration(self, state):\n        return [[1.0]]",
            r"fedprox.collaboration returned list; expected a tensor of shape \(4, 4\)",
        ),
        (
            "    def round(self",
            "    def round(self, *a):\n        return [][1]\n\n    def _old(self",
            r"IndexError: list index out of range \(at .*bad_\d+.py:\d+ in round\)"
            r".*rerun with --debug",
        ),
    ],
)
def test_a_plugins_mistake_names_the_member_or_its_line(tmp_path, old, new, needle):
    """(#39 item 9) A wrong shape or type from eval_params/collaboration names the member
    and the shape expected; an exception inside a plugin names its file:line and says how
    to see the traceback."""
    folder = tmp_path / "plug"
    folder.mkdir()
    src = FEDPROX.read_text()
    assert old in src
    module = f"bad_{abs(hash(new)) % 10**8}"  # one per case: a searched folder stays searched
    (folder / f"{module}.py").write_text(src.replace(old, new, 1))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"name: x\nplugin_paths: [plug]\nalgorithm: {{name: '{module}:FedProx'}}\n")
    try:
        res = CliRunner().invoke(
            app, ["run", str(cfg), *DIGITS, "rounds=2", "-q", "--out", str(tmp_path / "o")]
        )
    finally:
        sys.modules.pop(module, None)
    assert res.exit_code == 1, res.output
    (line,) = res.stderr.strip().splitlines()
    assert re.search(needle, line), line


def test_a_plugin_compared_by_its_import_path_gets_a_plain_folder(tmp_path, plugins):
    """(#39 item 19) `fp_mod:FedProx` as a compared entry wrote a folder with a colon in
    its name; it is `fp_mod_FedProx` now (the table still says the entry's name)."""
    cfg = load_config(None, [*DIGITS, f"plugin_paths=[{plugins}]"])
    cmp = raycobo.compare(cfg, ["local", "fp_mod:FedProx"], out=tmp_path / "c")
    assert [r["algorithm"] for r in cmp.rows] == ["local", "fp_mod:FedProx"]
    folders = sorted(p.name for p in (tmp_path / "c").iterdir() if p.is_dir())
    assert "fp_mod_FedProx" in folders and not any(":" in f for f in folders)
    assert (tmp_path / "c" / "fp_mod_FedProx" / "summary.json").is_file()


ENGINE_PY = '''
from pydantic import Field

from raycobo.engine import local_session
from raycobo.registry import EngineSpec
from raycobo.settings import Section


class TraceSettings(Section):
    trace: str = Field(description="a file each finished round's number is appended to")
    every: int = Field(default=1, ge=1, description="rounds between lines")


class Traced:
    """The local session, appending each finished round's number to engine.trace."""

    def __init__(self, inner, path, every):
        self.inner, self.path, self.every = inner, path, every

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def round(self, t):
        out = self.inner.round(t)
        if t % self.every == 0:
            with open(self.path, "a") as f:
                f.write(f"{t}\\n")
        return out


def traced_session(cfg, data):
    e = cfg.engine
    return Traced(local_session(cfg, data), e.trace, e.every)


TRACED = EngineSpec(traced_session, settings=TraceSettings, about="local, traced")
'''


def test_an_engine_is_one_module_and_one_registry_entry(tmp_path):
    """A new engine needs its module and its EngineSpec, nothing in raycobo: named by
    import path (or an entry point of raycobo.engines), its own engine.* keys validated by
    its settings section (defaults filled in, bad values and unknown keys refused with one
    line), refused under another engine, dropped when a run switches engines, and its
    session runs the method with the local engine's numbers."""
    (tmp_path / "examples_engine.py").write_text(ENGINE_PY)
    trace = tmp_path / "trace.txt"
    base = [*DIGITS, f"plugin_paths=[{tmp_path}]", "rounds=3", "tracking.enabled=false"]
    kind = "engine.kind=examples_engine:TRACED"
    cfg = load_config(None, [*base, kind, f"engine.trace={trace}"])
    assert cfg.engine.trace == str(trace) and cfg.engine.every == 1  # default filled in
    with pytest.raises(ConfigError, match=r"'engine.every'.*greater than or equal to 1"):
        load_config(None, [*base, kind, f"engine.trace={trace}", "engine.every=0"])
    with pytest.raises(ConfigError, match=r"unknown config key 'engine.evry'.*'engine.every'"):
        load_config(None, [*base, kind, f"engine.trace={trace}", "engine.evry=2"])
    with pytest.raises(ConfigError, match=r"'engine.trace'.*Field required"):
        load_config(None, [*base, kind])
    with pytest.raises(ConfigError, match=r"unknown config key 'engine.trace'"):
        load_config(None, [*base, f"engine.trace={trace}"])  # the local engine has none
    with pytest.raises(ConfigError, match=r"'engine.kind'.*unknown engine 'rya'"):
        load_config(None, [*base, "engine.kind=rya"])
    local = raycobo.run(load_config(None, base), tmp_path / "local")
    traced = raycobo.run(cfg, tmp_path / "traced")
    assert trace.read_text().split() == ["0", "1", "2"]
    assert traced.summary["mean_accuracy"] == local.summary["mean_accuracy"]
    assert traced.summary["mean_loss"] == local.summary["mean_loss"]
    from raycobo.config import with_overrides

    back = with_overrides(cfg, {"engine.kind": "local"})  # its own keys go with it
    assert "trace" not in back.engine.model_dump() and back.engine.kind == "local"


EVIL_PY = """
from pathlib import Path
Path(__file__).with_name("imported.marker").write_text("ran")
from raycobo.algorithms.local import Local
"""


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "raycobo", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_resuming_a_directory_imports_no_plugin_code_that_came_with_it(tmp_path, quad_cfg):
    """A shared run directory whose config.yaml names a plugin lying in the folder itself:
    `cd DIR && raycobo run --resume .` refuses in one line before importing it (no marker
    file), and a comparison's directory likewise; --trust-files is the user saying so."""
    from raycobo.version import __version__

    run = tmp_path / "shared_run"
    run.mkdir()
    tree = quad_cfg("rounds=4").to_dict()
    tree["algorithm"] = {"name": "evilplug:Local"}
    stamp = f"# written by raycobo {__version__}\n"  # as raycobo writes it
    (run / "config.yaml").write_text(stamp + yaml.safe_dump(tree))
    (run / "evilplug.py").write_text(EVIL_PY)
    refused = _cli(["run", "--resume", ".", "-q"], cwd=run)
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "refusing to resume the run directory" in line and "evilplug" in line, line
    assert "--trust-files" in line
    assert not (run / "imported.marker").exists()
    trusted = _cli(["run", "--resume", ".", "--trust-files", "-q"], cwd=run)
    assert (run / "imported.marker").exists(), trusted.stderr

    comparison = tmp_path / "shared_compare"
    comparison.mkdir()
    tree["compare"] = {"algorithms": ["evilplug:Local"], "seeds": [0]}
    (comparison / "config.yaml").write_text(stamp + yaml.safe_dump(tree))
    (comparison / "evilplug.py").write_text(EVIL_PY)
    refused = _cli(["compare", "--resume", ".", "-q"], cwd=comparison)
    assert refused.returncode == 2, refused.stderr
    assert "refusing to resume the comparison" in refused.stderr
    assert not (comparison / "imported.marker").exists()


def test_a_plugin_whose_source_changed_is_not_resumed_silently(tmp_path, plugins):
    """The run records its plugin's source (signed); after an interruption the module is
    edited: the resume is refused naming the module, and --trust-files resumes under the
    new code, recording it. A run that moved keeps resuming (the same code)."""
    from raycobo.lifecycle import RunFailed
    from raycobo.lifecycle.experiment import resume_config, run_experiment
    from tests.helpers import StopAt

    source = plugins / "edited_prox.py"  # a name of its own: folders stay on sys.path
    shutil.copy(FEDPROX, source)
    over = [*DIGITS, f"plugin_paths=[{plugins}]", "algorithm.name=edited_prox:FedProx"]
    cfg = load_config(None, [*over, "rounds=6", "eval_every=2"])
    with pytest.raises(RunFailed):
        run_experiment(cfg, tmp_path / "cut", [StopAt(3, RuntimeError("crash"))])
    record = json.loads((tmp_path / "cut" / "plugins.json").read_text())
    assert str(source) in record["modules"]["edited_prox"]
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "cut", moved)
    assert resume_config(moved).algorithm.name == "edited_prox:FedProx"

    source.write_text(source.read_text() + "\n# an edit after the run started\n")
    sys.modules.pop("edited_prox", None)
    with pytest.raises(ConfigError, match=r"plugin module 'edited_prox' .* changed since it"):
        resume_config(tmp_path / "cut")
    edited = tmp_path / "edited"
    shutil.copytree(tmp_path / "cut", edited)
    forged = json.loads((edited / "plugins.json").read_text())
    forged["modules"]["edited_prox"] = {str(source): "0" * 64}
    (edited / "plugins.json").write_text(json.dumps(forged))
    with pytest.raises(ConfigError, match="not signed with your key"):
        resume_config(edited)
    cfg = resume_config(tmp_path / "cut", trust_files=True)
    done = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert done.summary["status"] == "completed"
    assert resume_config(tmp_path / "cut").rounds == 6  # the new code is the one recorded
