"""The personalised-FL field's standard grid: PFLlib's benchmark protocol
(pfllib.com/benchmark, 2025-03) with every raycobo method, scaled to 2 cores.

Usage: python benchmarks/pfl_grid/run.py [--quick] [--settings pathological,dir0.1]
       [--entries cobo,fedavg,...] [--seeds 0,1,2] [--no-tune] [--out DIR]
       [--fraction F] [--rounds N]

The protocol (PFLlib's): Fashion-MNIST, 20 clients all taking part every round, its
4-layer CNN (``fedavg_cnn``), batch 10, one local epoch a round, lr 0.005, each client's
samples split 75/25 into train and test, two label skews:

- ``pathological``: PFLlib's unbalanced "pat" split, 2 of the 10 classes a client (the
  clients holding the same pair form 5 clusters of 4; Oracle, FC and IFCA can use them);
- ``dir0.1``: Dirichlet(0.1) label skew as PFLlib draws it (``min_samples``), no clusters.

Scaled (grid.yaml): 3 % of the 60,000 training images instead of all 70,000 (90 a client
on average: 68 to train on, 22 to test), 40 rounds instead of 2,000. An epoch is the same number of
steps for every client, round(mean training samples / 10) (PFLlib: each client its own,
len / 10); CoBo and FC take one step a round, so they run that many rounds an epoch and
are evaluated at the same epochs.

Each entry with a space in ``tune_spaces/`` (or the grid's own ``spaces/``, where an axis
counts rounds) is tuned first on validation data (20 % of
each client's training samples held out, seed 0), as ``compare --tune`` does; the picked
values then run on every seed, scored on the test split. Reported (``report.py``):
PFLlib's metric, the sample-weighted mean test accuracy (all clients' correct answers
over all their test samples), at the best evaluation (what PFLlib's table reports) and
at the last.

``--quick``: the pathological setting, one seed, 20 rounds, no tuning, five entries
(minutes; what CI runs). ``--fraction`` / ``--rounds``: the grid at another size (a
share of the training images, epochs), with the grid's tuned values, its runs and table
under ``runs/pfl-grid/<size>/`` (how the ordering moves toward PFLlib's full size).
Finished runs are kept: a second call runs what is missing. The full grid keeps what
it finds in the repository, as it finds it: each entry's tuned values in
``tuned/<setting>.json`` as its sweep ends (reused while grid.yaml and the entry's space
are unchanged), each run's accuracy by round in ``results/<setting>.jsonl`` as the run
ends (a run whose config changed runs again).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import sys
import time
from functools import cache
from pathlib import Path

from raycobo.api import with_tuned
from raycobo.comparison import run_compare
from raycobo.config import Config, load_config

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

SETTINGS: dict[str, dict] = {
    "pathological": {"data.partition.kind": "pathological"},
    "dir0.1": {
        "data.partition.kind": "dirichlet",
        "data.partition.alpha": 0.1,
        "data.partition.min_samples": 10,  # PFLlib: 1; a client needs a train/test split
    },
}
# entry -> (its algorithm keys, its tune space under tune_spaces/, needs clusters)
ENTRIES: dict[str, tuple[dict, str | None, bool]] = {
    "local": ({"algorithm.name": "local"}, None, False),
    "fedavg": ({"algorithm.name": "fedavg"}, None, False),
    "fedavg_ft": ({"algorithm.name": "fedavg_ft"}, "tune_fedavg_ft.yaml", False),
    "ditto": ({"algorithm.name": "ditto"}, "tune_ditto.yaml", False),
    "ifca": ({"algorithm.name": "ifca"}, "tune_ifca.yaml", False),
    "fc": ({"algorithm.name": "fc"}, None, True),
    "cobo": ({"algorithm.name": "cobo"}, None, False),
    "cobo_paper": ({"algorithm.name": "cobo", "algorithm.preset": "paper"}, None, False),
    "fedamp": ({"algorithm.name": "fedamp"}, "tune_fedamp.yaml", False),
    "fedfomo": ({"algorithm.name": "fedfomo"}, "tune_fedfomo.yaml", False),
    "apple": ({"algorithm.name": "apple"}, "tune_apple.yaml", False),
    "fedala": ({"algorithm.name": "fedala"}, "tune_fedala.yaml", False),
    "pfedgraph": ({"algorithm.name": "pfedgraph"}, "tune_pfedgraph.yaml", False),
    "oracle": ({"algorithm.name": "oracle"}, None, True),
}
# the protocol's keys, the same for every entry: a tune space's axis over one is dropped
FIXED = ("algorithm.lr",)
QUICK_ENTRIES = ["local", "fedavg", "cobo", "fedfomo", "oracle"]
QUICK_ROUNDS = 20


def base_config(setting: str, quick: bool, scale: dict | None = None) -> Config:
    """grid.yaml under the setting; ``quick``: QUICK_ROUNDS; ``scale``: other values of
    grid.yaml's size (``data.fraction``, ``rounds``)."""
    over = {**SETTINGS[setting], "name": f"pfl-grid-{setting}", **(scale or {})}
    if quick:
        over["rounds"] = QUICK_ROUNDS
    return load_config(HERE / "grid.yaml", [f"{k}={json.dumps(v)}" for k, v in over.items()])


def epoch_steps(cfg: Config) -> int:
    """Steps of one local epoch: the clients' mean training samples over the batch."""
    from raycobo.data import load_data

    data = load_data(cfg)
    mean = sum(t.numel() for t in data.train_idx) / len(data.train_idx)
    return max(1, round(mean / cfg.batch_size))


def has_local_steps(keys: dict) -> bool:
    from raycobo.algorithms import method_keys

    return "local_steps" in method_keys(keys["algorithm.name"])


def grid_config(
    setting: str, entries: list[str], quick: bool, scale: dict | None = None
) -> tuple[Config, int]:
    """The setting's comparison: every entry a ``compare.variants`` entry with the
    protocol's step size and one epoch a round. -> (config, steps of an epoch)"""
    cfg = base_config(setting, quick, scale)
    E = epoch_steps(cfg)
    variants = {}
    for entry in entries:
        keys, _, _ = ENTRIES[entry]
        v = {**keys, "algorithm.lr": cfg.algorithm.lr}
        if has_local_steps(keys):
            v["algorithm.local_steps"] = E
        else:  # one step a round: an epoch is E rounds, evaluated at the same epochs
            v.update(rounds=cfg.rounds * E, eval_every=cfg.eval_every * E)
        variants[entry] = v
    over = {"compare.variants": variants, "compare.algorithms": entries}
    return load_config(HERE / "grid.yaml", _flat(cfg, over)), E


def _flat(cfg: Config, over: dict) -> list[str]:
    """grid.yaml's overrides for ``cfg`` (its setting and size) plus ``over``."""
    keep = {
        "name": cfg.name,
        "rounds": cfg.rounds,
        "data.fraction": cfg.data.fraction,
        "data.partition": cfg.data.partition.model_dump(),
        **over,
    }
    return [f"{k}={json.dumps(v)}" for k, v in keep.items()]


def protocol_space(entry: str, root: Path) -> Path:
    """The entry's tune space without the protocol's FIXED keys (PFLlib runs every method
    at lr 0.005; Ditto's space also tunes lr): the file itself where it has none, else a
    copy under ``root/spaces/`` without them. A space in the grid's own ``spaces/``
    (one whose axis counts rounds) is used in place of ``tune_spaces/``'s."""
    import yaml

    own = HERE / "spaces" / ENTRIES[entry][1]  # a space sized for the grid's length
    src = own if own.is_file() else REPO / "tune_spaces" / ENTRIES[entry][1]
    space = yaml.safe_load(src.read_text())
    if not set(space["space"]) & set(FIXED):
        return src
    space["space"] = {k: v for k, v in space["space"].items() if k not in FIXED}
    dst = root / "spaces" / src.name
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(yaml.safe_dump(space, sort_keys=False))
    return dst


def entries_for(setting: str, wanted: list[str]) -> list[str]:
    """The wanted entries the setting can run (those needing clusters where it has them)."""
    clusters = setting == "pathological"
    return [e for e in wanted if clusters or not ENTRIES[e][2]]


def picks_file(setting: str) -> Path:
    """The setting's tuned values, kept in the repository: tuning is most of the grid's
    time, and a run directory does not outlive its machine."""
    return HERE / "tuned" / f"{setting}.json"


def _digest(*texts: str) -> str:
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]


def tune_entries(
    setting: str, cfg: Config, spaces: dict[str, Path], root: Path, reuse_only: bool = False
) -> dict:
    """Each entry's picked values (entry -> key -> value), tuned on validation one entry
    at a time; a pick is kept in ``picks_file`` as soon as its sweep ends and reused
    while the grid's config and the entry's space are unchanged. ``reuse_only``: a grid
    of another size runs the grid's picks, and one not yet made is an error."""
    from raycobo.comparison.plan import entry_config
    from raycobo.tune.entry import check_entry, tune_entry

    path = picks_file(setting)
    saved = json.loads(path.read_text()) if path.is_file() else {}
    grid = (HERE / "grid.yaml").read_text() + json.dumps(SETTINGS[setting], sort_keys=True)
    for entry, space in spaces.items():  # every space checked before any sweep runs
        check_entry(entry_config(cfg, entry), space)
    picked = {}
    for entry, space in spaces.items():
        key = _digest(grid, space.read_text())
        if saved.get(entry, {}).get("digest") == key:
            picked[entry] = saved[entry]["values"]
            continue
        if reuse_only:
            raise SystemExit(
                f"error: {entry} has no tuned values for {setting} in {path} (run the grid "
                "at its own size first, or --no-tune)"
            )
        print(f"[{setting}] tuning {entry} on validation ({space.name})", flush=True)
        sweep_dir = root / f"tune-{entry}"
        shutil.rmtree(sweep_dir, ignore_errors=True)  # a sweep cut off before it ended
        picked[entry] = tune_entry(entry_config(cfg, entry), space, sweep_dir)
        saved[entry] = {"digest": key, "values": picked[entry]}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    return picked


def run_setting(
    setting: str,
    wanted: list[str],
    seeds: list[int],
    out: Path,
    quick: bool,
    tune: bool,
    record: Path | None = None,
    scale: dict | None = None,
) -> None:
    """Every (entry, seed) of the setting not yet in ``record`` (a JSON-lines file, by
    default ``out/results/<setting>.jsonl``) with the config it would run now: each run
    is a comparison of its own under ``out/<setting>/<entry>/seed<k>``, and its accuracy
    by round is appended to ``record`` as it ends, so a grid cut off anywhere loses at
    most the run it was in."""
    root = out / setting
    record = record or out / "results" / f"{setting}.jsonl"
    entries = entries_for(setting, wanted)
    cfg, E = grid_config(setting, entries, quick, scale)
    spaces = {e: protocol_space(e, root) for e in entries if ENTRIES[e][1]}
    if tune and spaces:
        cfg = with_tuned(cfg, tune_entries(setting, cfg, spaces, root, bool(scale)))
    done = recorded(record)
    t0 = time.perf_counter()
    print(f"[{setting}] {', '.join(entries)}; seeds {seeds}; {E} steps an epoch", flush=True)
    for entry in entries:
        for seed in seeds:
            key = run_digest(cfg, entry, seed)
            if done.get((entry, seed)) == key:
                continue
            run_root = root / entry / f"seed{seed}"
            shutil.rmtree(run_root, ignore_errors=True)  # one cut off before it ended
            _, _, results = run_compare(cfg, [entry], run_root, seeds=[seed])
            append_row(record, entry, seed, key, results[entry][0])
    print(f"[{setting}] {time.perf_counter() - t0:.0f} s", flush=True)


def run_digest(cfg: Config, entry: str, seed: int) -> str:
    """What one run of the grid is: its config with the method's values written out,
    without the comparison's list of entries (which the others asked for at the same
    time does not change the run)."""
    from raycobo.comparison.plan import entry_config

    pinned = entry_config(cfg, entry, seed).pinned().to_dict()
    pinned.pop("compare", None)
    return _digest(json.dumps(pinned, sort_keys=True, default=str))


def recorded(record: Path) -> dict[tuple[str, int], str]:
    """(entry, seed) -> the digest of its last recorded run."""
    if not record.is_file():
        return {}
    return {key: row["digest"] for key, row in _report().last_rows(record).items()}


def append_row(record: Path, entry: str, seed: int, key: str, result) -> None:
    """One finished run's line: its status and sample-weighted test accuracy by round."""
    ok = result.status == "completed"
    acc = _report().weighted_accuracy(result.run_dir) if ok else {}
    row = {"entry": entry, "seed": seed, "digest": key, "status": result.status}
    row["accuracy"] = {str(r): round(a, 6) for r, a in acc.items()}
    record.parent.mkdir(parents=True, exist_ok=True)
    with record.open("a") as f:
        f.write(json.dumps(row) + "\n")


@cache
def _report():
    """report.py (beside this file) as a module, loaded once (its caches, such as the
    partitions' test sizes, then hold across the grid's runs)."""
    spec = importlib.util.spec_from_file_location("pfl_grid_report", HERE / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--settings", default=None)
    ap.add_argument("--entries", default=None)
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--fraction", type=float, default=None, help="of the training images")
    ap.add_argument("--rounds", type=int, default=None, help="epochs (communication rounds)")
    args = ap.parse_args()
    scale = {k: v for k, v in (("data.fraction", args.fraction), ("rounds", args.rounds)) if v}
    if scale and args.quick:
        print("error: --fraction and --rounds size the full grid, not --quick", file=sys.stderr)
        return 2
    settings = (
        args.settings.split(",")
        if args.settings
        else (["pathological"] if args.quick else list(SETTINGS))
    )
    wanted = (
        args.entries.split(",")
        if args.entries
        else (QUICK_ENTRIES if args.quick else list(ENTRIES))
    )
    for name, known in (("--settings", SETTINGS), ("--entries", ENTRIES)):
        bad = [x for x in (settings if name == "--settings" else wanted) if x not in known]
        if bad:
            print(f"error: {name}: no {bad[0]} (known: {', '.join(known)})", file=sys.stderr)
            return 2
    seeds = (
        [int(s) for s in args.seeds.split(",")]
        if args.seeds
        else ([0] if args.quick else [0, 1, 2])
    )
    sized = "-".join(f"{k.split('.')[-1]}{v}" for k, v in scale.items())
    out = args.out or REPO / "runs" / "pfl-grid" / ("quick" if args.quick else sized or "full")
    # the grid's record is the repository's (a run directory does not outlive its
    # machine); a quick grid's, one of another size, or one with its own --out, stays in
    # its folder (with its table beside it: report.py --quick)
    own = args.quick or args.out or scale
    results = out / "results" if own else HERE / "results"
    for setting in settings:
        tune = not (args.quick or args.no_tune)
        record = results / f"{setting}.jsonl"
        run_setting(setting, wanted, seeds, out, args.quick, tune, record, scale)
    print(f"wrote {_report().write_report(results, quick=bool(own))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
