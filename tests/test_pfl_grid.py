"""The personalised-FL grid (benchmarks/pfl_grid): its entries' configs follow the
protocol, the report reads PFLlib's metric from the runs, and a CI-sized run on
Fashion-MNIST (where its files are) keeps what holds with margin: on PFLlib's
pathological split (two classes a client) Local and Oracle beat FedAvg by far."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from raycobo.data import fashion_mnist_available

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "benchmarks" / "pfl_grid"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"pfl_grid_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _load("report")
grid = _load("run")


def test_the_entries_take_one_epoch_a_round_at_the_protocols_step_size(monkeypatch):
    monkeypatch.setattr(grid, "epoch_steps", lambda cfg: 7)
    cfg, E = grid.grid_config("dir0.1", grid.entries_for("dir0.1", list(grid.ENTRIES)), False)
    assert E == 7
    assert "oracle" not in cfg.compare.algorithms and "fc" not in cfg.compare.algorithms
    v = cfg.compare.variants
    assert v["fedavg"]["algorithm.local_steps"] == 7 and v["fedavg"]["algorithm.lr"] == 0.005
    assert v["cobo"]["rounds"] == 7 * cfg.rounds and v["cobo"]["eval_every"] == 7 * cfg.eval_every
    assert v["cobo_paper"]["algorithm.preset"] == "paper"
    assert cfg.data.partition.kind == "dirichlet" and cfg.data.partition.alpha == 0.1
    assert cfg.model.name == "fedavg_cnn" and cfg.batch_size == 10
    assert cfg.data.partition.test_split == 0.25 and cfg.data.partition.num_clients == 20
    every = grid.entries_for("pathological", list(grid.ENTRIES))
    assert every == list(grid.ENTRIES)  # the clusters are there for Oracle and FC


def test_the_accuracy_is_weighted_by_the_clients_test_samples(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\ndata: {name: x}\n")
    (run / "metrics.csv").write_text(
        "round,client,cluster,accuracy,loss\n0,0,0,1.0,0.1\n0,1,0,0.0,2.0\n"
        "5,0,0,0.5,0.1\n5,1,0,1.0,0.1\n"
    )
    monkeypatch.setattr(report, "_sizes_by_key", lambda key, config: (3, 1))
    acc = report.weighted_accuracy(run)
    assert acc == {0: 0.75, 5: (1.5 + 1.0) / 4}  # not the clients' plain means 0.5, 0.75


def test_a_difference_counts_only_outside_both_noises():
    assert report.verdict((97.0, 0.5), (99.4, 0.1)).endswith("(outside noise)")
    assert report.verdict((99.0, 0.5), (99.4, 0.1)).endswith("(within noise)")
    assert report.verdict((50.0, 1.0), None) == ""
    assert "one seed" in report.verdict((97.0, 0.0), (99.4, 0.1), seeds=1)


@pytest.mark.skipif(not fashion_mnist_available(), reason="needs Fashion-MNIST's files")
def test_quick_grid_local_and_oracle_far_above_fedavg_on_the_pathological_split(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(grid, "QUICK_ROUNDS", 10)
    grid.run_setting("pathological", ["local", "fedavg", "oracle"], [0], tmp_path, True, False)
    table = report.collect(tmp_path / "results")["pathological"]
    assert set(table) == {"local", "fedavg", "oracle"}
    fedavg = table["fedavg"]["best"][0]
    assert table["local"]["best"][0] > fedavg + 10
    assert table["oracle"]["best"][0] > fedavg + 10
    text = report.table(report.collect(tmp_path / "results"))
    assert "| fedavg |" in text and "80.41 ± 0.08" in text  # PFLlib's figure beside ours


def test_the_protocols_step_size_is_not_tuned(tmp_path):
    """PFLlib runs every method at lr 0.005: Ditto's space loses its lr axis in the grid
    (its lam axis stays); a space without lr is used as it is."""
    import yaml

    ditto = yaml.safe_load(grid.protocol_space("ditto", tmp_path).read_text())
    assert "algorithm.lr" not in ditto["space"] and "algorithm.lam" in ditto["space"]
    assert grid.protocol_space("fedfomo", tmp_path) == REPO / "tune_spaces" / "tune_fedfomo.yaml"


def test_every_entrys_space_fits_the_grids_runs(tmp_path, monkeypatch):
    """Every entry's config builds in both settings, and each tuned entry's space, as the
    grid uses it, is checked against it (fedavg_ft's fine-tuning rounds fit 40 rounds:
    the grid's own space)."""
    from raycobo.comparison.plan import entry_config
    from raycobo.tune.entry import check_entry

    monkeypatch.setattr(grid, "epoch_steps", lambda cfg: 7)
    for setting in grid.SETTINGS:
        entries = grid.entries_for(setting, list(grid.ENTRIES))
        cfg, _ = grid.grid_config(setting, entries, False)
        for entry in entries:  # every entry's config valid (a retired key is refused)
            entry_cfg = entry_config(cfg, entry)
            if grid.ENTRIES[entry][1]:
                check_entry(entry_cfg, grid.protocol_space(entry, tmp_path))
    assert grid.protocol_space("fedavg_ft", tmp_path) == HERE / "spaces" / "tune_fedavg_ft.yaml"


def test_a_tuned_pick_is_kept_and_reused_until_its_space_changes(tmp_path, monkeypatch):
    """Each entry's pick is written as its sweep ends and reused by the next call; an
    entry whose space changed is tuned again, the others are not."""
    import raycobo.tune.entry as tune_entry

    monkeypatch.setattr(grid, "epoch_steps", lambda cfg: 7)
    monkeypatch.setattr(grid, "picks_file", lambda setting: tmp_path / f"{setting}.json")
    swept = []

    def fake_sweep(cfg, space, out):
        swept.append(cfg.algorithm.name)
        return {"algorithm.lam": 0.1} if cfg.algorithm.name == "ditto" else {"algorithm.k": 1}

    monkeypatch.setattr(tune_entry, "tune_entry", fake_sweep)
    monkeypatch.setattr(tune_entry, "check_entry", lambda cfg, space: None)
    cfg, _ = grid.grid_config("pathological", ["ditto", "fedfomo"], False)
    spaces = {e: tmp_path / f"{e}.yaml" for e in ("ditto", "fedfomo")}
    for e, path in spaces.items():
        path.write_text(f"space of {e}\n")
    first = grid.tune_entries("pathological", cfg, spaces, tmp_path / "runs")
    assert swept == ["ditto", "fedfomo"]
    assert first["ditto"] == {"algorithm.lam": 0.1}
    assert grid.tune_entries("pathological", cfg, spaces, tmp_path / "runs") == first
    assert len(swept) == 2  # nothing swept again
    spaces["fedfomo"].write_text("a wider space\n")
    grid.tune_entries("pathological", cfg, spaces, tmp_path / "runs")
    assert swept == ["ditto", "fedfomo", "fedfomo"]  # fedfomo alone, again
    saved = json.loads((tmp_path / "pathological.json").read_text())
    assert set(saved) == {"ditto", "fedfomo"} and saved["ditto"]["values"] == first["ditto"]
    # a grid of another size runs these picks, and tunes nothing itself
    wider, _ = grid.grid_config("pathological", ["ditto"], False, {"data.fraction": 0.3})
    assert wider.data.fraction == 0.3
    again = grid.tune_entries("pathological", wider, spaces, tmp_path / "runs", True)
    assert again == first and len(swept) == 3
    spaces["ditto"].write_text("another space\n")
    with pytest.raises(SystemExit, match="ditto has no tuned values for pathological"):
        grid.tune_entries("pathological", wider, spaces, tmp_path / "runs", True)


def test_a_recorded_run_is_not_run_again_until_its_config_changes(tmp_path, monkeypatch):
    """Each finished run is a line of the setting's record as it ends; a second call runs
    only what is missing, a run that failed counts as a failed seed, and the report
    reads the table from the record alone."""
    from types import SimpleNamespace

    monkeypatch.setattr(grid, "epoch_steps", lambda cfg: 7)
    ran = []

    def fake_compare(cfg, entries, out, seeds):
        (entry,), (seed,) = entries, seeds
        ran.append((entry, seed))
        status = "failed" if (entry, seed) == ("fedavg", 1) else "completed"
        run = SimpleNamespace(status=status, run_dir=out / entry / f"seed{seed}")
        return out, [], {entry: [run]}

    accuracy = {"local": {0: 0.5, 5: 0.9, 10: 0.8}, "fedavg": {0: 0.4, 5: 0.6, 10: 0.7}}
    monkeypatch.setattr(grid, "run_compare", fake_compare)
    fake_report = SimpleNamespace(
        weighted_accuracy=lambda run: accuracy[run.parent.name], last_rows=report.last_rows
    )
    monkeypatch.setattr(grid, "_report", lambda: fake_report)
    record = tmp_path / "results" / "pathological.jsonl"
    grid.run_setting("pathological", ["local", "fedavg"], [0, 1], tmp_path, True, False, record)
    assert ran == [("local", 0), ("local", 1), ("fedavg", 0), ("fedavg", 1)]
    grid.run_setting("pathological", ["local", "fedavg"], [0, 1], tmp_path, True, False, record)
    assert len(ran) == 4  # everything recorded: nothing runs again
    grid.run_setting("pathological", ["local"], [0, 1], tmp_path, True, False, record)
    assert len(ran) == 4  # nor when asked with other entries beside it
    monkeypatch.setattr(grid, "QUICK_ROUNDS", 10)  # another config: every run again
    grid.run_setting("pathological", ["local"], [0], tmp_path, True, False, record)
    assert ran[4:] == [("local", 0)]
    table = report.collect(tmp_path / "results")["pathological"]
    assert table["local"]["best"] == (90.0, 0.0) and table["local"]["last"] == (80.0, 0.0)
    assert table["fedavg"]["seeds"] == 1 and table["fedavg"]["failed"] == [1]
    text = report.table(report.collect(tmp_path / "results"))  # a partial grid says so
    assert "| fedavg | 1 (1 failed) |" in text and "| local | 2 |" in text
    assert "**Dirichlet(0.1)**: no run recorded yet." in text
