"""CoBo's regime matrix: Local, Oracle and CoBo (the defaults and named candidates) on
every cell of ``cells.yaml``, over seeds, on the cells' validation or test data.

Usage: python benchmarks/regimes/run.py [--quick] [--cells ID,...] [--seeds 0,1,2]
       [--split test|validation] [--candidates NAME,...] [--methods NAME,...]
       [--no-baselines] [--no-cobo] [--sweep | --tuned] [--jobs N]
       [--threads N] [--out DIR] [--copies-only]

Results go to ``OUT/<split>/results.jsonl``, one line per run, with the method settings
it ran (``settings``: the run's pinned ``algorithm`` section); a second call skips the
runs already there with the same settings (so an interrupted matrix resumes) and runs
again those whose entry's settings changed since (a new default), the report reading
the last row of each run; a run already there under another entry's name with the same
settings (a candidate that a new default made the defaults) is recorded under the new
name, not run again. ``report.py`` turns them into
the table and plot of REGIMES.md. ``--split validation`` holds out 20 % of every
client's training data and scores on it: that is where defaults are chosen; the test
split is where they are reported. Candidates (``candidates.yaml``) are named sets of
``algorithm.*`` overrides for CoBo, compared against the defaults (``cobo``); other
methods (``--methods``) run with their own defaults, each as the entry of its name.

A cell without ground-truth clusters (its ``baselines``: method -> a grid of its own
keys, ``{}`` for none) has no Oracle: CoBo is measured against the best of those
methods, each tuned as ``compare --tune`` tunes it. On the validation split every
point of a method's grid runs (entries ``method:key=value,...``; the method's name
where it has no grid); on the test split each method runs as the entry of its name
with the point best on validation.

The tuned ceiling, what a user who tunes CoBo on their own held-out data reaches:
``--split validation --sweep`` runs every point of ``candidates.yaml``'s ``sweep`` grid
(entries ``sweep:key=value,...``), and ``--split test --tuned`` runs, per cell, the
point with the best mean validation score as the entry ``tuned``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import yaml

from raycobo.bench.workers import die_with_parent

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VALIDATION = 0.2  # share of each client's training data held out with --split validation
# the quadratic has no samples to hold out: its validation runs draw other problems
# (centres, noise) under seeds offset by this, so that no test instance is seen
VALIDATION_SEED_OFFSET = 1000
FILELESS = ("quadratic", "digits", "mnist1d")  # generated or shipped: no data.root


def load_cells() -> list[dict]:
    return yaml.safe_load((HERE / "cells.yaml").read_text())["cells"]


def _candidates_file(section: str) -> dict:
    """One section of candidates.yaml ({} where the file or the section is absent)."""
    path = HERE / "candidates.yaml"
    if not path.is_file():
        return {}
    return (yaml.safe_load(path.read_text()) or {}).get(section) or {}


def load_candidates() -> dict[str, dict]:
    return _candidates_file("candidates")


def load_history() -> dict[str, str]:
    """Entries this raycobo cannot run as they ran, each with what it was: their rows
    are shown as recorded."""
    return _candidates_file("history")


SWEEP = "sweep:"  # the prefix of a sweep point's entry name


def load_sweep() -> dict[str, list]:
    """The grid of the tuned ceiling (candidates.yaml's ``sweep``: key -> values)."""
    return _candidates_file("sweep")


def sweep_entries(grid: dict[str, list]) -> dict[str, tuple[str, dict]]:
    """One CoBo entry per point of the grid, named ``sweep:key=value,...``."""
    return _points(SWEEP, "cobo", grid)


def _points(prefix: str, method: str, grid: dict[str, list]) -> dict[str, tuple[str, dict]]:
    """One entry of ``method`` per point of ``grid`` (key -> values), named
    ``prefix`` + ``key=value,...``."""
    import itertools

    keys = list(grid)
    entries = {}
    for values in itertools.product(*(grid[k] for k in keys)):
        over = dict(zip(keys, values, strict=True))
        entries[prefix + ",".join(f"{k}={v}" for k, v in over.items())] = (method, over)
    return entries


def tuned_choice(rows: list[dict], cell: dict, grid: dict[str, list]) -> dict | None:
    """The sweep point with the best mean validation score on ``cell`` (``best_point``)."""
    return best_point(rows, cell, sweep_entries(grid))


def best_point(rows: list[dict], cell: dict, points: dict[str, tuple[str, dict]]) -> dict | None:
    """Of ``points`` (entry -> (method, overrides)), the one with the best mean validation
    score on ``cell`` over the seeds every point ran (a diverged run scores worst; ties:
    the first in the points' order), as its overrides; None where some point has not run
    on any seed they share."""
    metric = cell.get("metric", "accuracy")
    last = {(r["entry"], r["seed"]): r for r in rows if r["cell"] == cell["id"]}
    seeds = None
    for name in points:
        ran = {seed for entry, seed in last if entry == name}
        seeds = ran if seeds is None else seeds & ran
    if not seeds:
        return None
    worst = -math.inf if metric == "accuracy" else math.inf

    def score(name: str) -> float:
        vals = [last[(name, s)] for s in sorted(seeds)]
        if any(r["diverged"] or r[metric] is None for r in vals):
            return worst
        return sum(r[metric] for r in vals) / len(vals)

    pick = max if metric == "accuracy" else min
    best = pick(points, key=score)  # max/min keep the first of equal scores
    return points[best][1]


def grid_points(method: str, grid: dict[str, list]) -> dict[str, tuple[str, dict]]:
    """One entry of ``method`` per point of ``grid`` (key -> values), named
    ``method:key=value,...``; the method's name alone where the grid is empty."""
    return _points(method + ":", method, grid) if grid else {method: (method, {})}


def baseline_of(entry: str, cell: dict) -> str | None:
    """The baseline method an entry of ``cell`` is (its name, or a point of its grid);
    None for any other entry, and on a cell with clusters."""
    method = entry.split(":", 1)[0]
    return method if method in (cell.get("baselines") or {}) else None


def baseline_entries(
    cell: dict, split: str, validation_rows: list[dict]
) -> tuple[dict[str, tuple[str, dict]], list[str]]:
    """A cell's ``baselines``: on validation every point of each method's grid; on test
    each method as the entry of its name with its point best on validation (one whose
    grid has not run there is left out). -> (entries, the methods left out)"""
    entries, missing = {}, []
    for method, grid in (cell.get("baselines") or {}).items():
        points = grid_points(method, grid or {})
        if split == "validation" or not grid:
            entries.update(points)
            continue
        over = best_point(validation_rows, cell, points)
        if over is None:
            missing.append(method)
        else:
            entries[method] = (method, over)
    return entries, missing


def cell_config(
    cell: dict, split: str, seed: int, device: str = "cpu", data_root: str | None = None
) -> dict:
    """The cell's config as a mapping, for ``split`` and ``seed``, tracking off, on
    ``device`` (``engine.device``), its data files under ``data_root`` (``data.root``)."""
    cfg = json.loads(json.dumps(cell["config"]))  # deep copy of plain YAML data
    cfg["seed"] = seed
    if device != "cpu":
        cfg.setdefault("engine", {})["device"] = device
    if data_root and cfg["data"]["name"] not in FILELESS:
        cfg["data"]["root"] = data_root
    cfg["tracking"] = {"enabled": False}
    cfg["checkpoint"] = {"every": 0}
    if split == "validation" and cfg["data"]["name"] == "quadratic":
        cfg["seed"] = VALIDATION_SEED_OFFSET + seed
    elif split == "validation":
        cfg["data"]["validation_fraction"] = VALIDATION
        cfg["data"]["evaluate_on"] = "validation"
    return cfg


def w_shares(summary: dict) -> dict:
    """W at the end as the run reports it (``summary.json`` ``cluster_agreement``): mean
    within/across the true clusters, the share of each row's mass inside its own
    cluster (averaged over rows), and with a pull threshold that share among the weights
    the pull reads (``mass_pulled_inside``); {} without W or clusters."""
    agree = summary.get("cluster_agreement") or {}
    keys = ("w_within", "w_across", "mass_inside", "mass_pulled_inside")
    return {k: agree[k] for k in keys if k in agree}


def ran_settings(run_dir: Path) -> dict | None:
    """The method settings a run ran with (its pinned config's ``algorithm``; None
    where it wrote none)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    return (yaml.safe_load(path.read_text()) or {}).get("algorithm") or None


def entry_settings(method: str, overrides: dict, cell: dict | None = None) -> dict:
    """The settings an entry runs with now, as a run pins them (the defaults' values
    written out), on ``cell`` with the cell's own algorithm keys (its step size): what a
    finished row must match to count as this entry's."""
    from raycobo.config import validate

    own = (cell or {}).get("config", {}).get("algorithm") or {}
    algorithm = {**own, "name": method, **overrides}
    return validate({"algorithm": algorithm}).pinned().to_dict()["algorithm"]


def clients(cell: dict) -> int | None:
    """A cell's client count from its partition: ``num_clients``, or its clusters' sizes
    (a list, or clients_per_cluster x num_clusters, either at its default)."""
    from raycobo.config.sections import PartitionConfig

    part = cell["config"]["data"].get("partition") or {}
    if part.get("num_clients") is not None:
        return int(part["num_clients"])
    if "clients_per_cluster" not in part and "num_clusters" not in part:
        return None
    return sum(PartitionConfig(**part).cluster_sizes())


# CoBo keys that act only where the sampler alone samples a pair fewer than K times in
# the run (S < K), or (fade_clients) past that many clients: a row from before them
# counts where they are inert on its cell (recheck_samples: the re-checks' target, a key
# until raycobo 0.5.0 and sampling_samples since, ``in_todays_terms``)
AFTER_ROWS = ("recheck_samples", "sampling_samples", "fade_clients")
# CoBo keys whose value here is off, as before the key: a row without them counts
OFF_AT = {
    "recheck_samples": 0,
    "sampling_samples": 0,
    "entry_samples": 1,
    "alignment_batches": 1,
    "sampling_start": 0,
    "fade": 0,
    "fade_clients": 0,
    "closure": 0,
    "start_all_pairs": False,
}
# keys raycobo 0.5.0 removed, at the value every run has had since: a row that recorded
# that value ran as one of today's does (another value: it did not)
FIXED_SINCE = {"fade_decay": "none", "sampling_scale_max": 4.0}


# keys renamed since rows recorded them (algorithm.rule became preset in raycobo 0.3.0)
RENAMED = {"rule": "preset"}


def _view(settings: dict):
    """A recorded row's settings as the package's rules read them (``settings.pull_cut``
    and the rules on it), with their defaults where a row left a key out."""
    from types import SimpleNamespace

    return SimpleNamespace(
        domain=settings.get("domain", "box"),
        pull_threshold=settings.get("pull_threshold"),
        sampling=settings.get("sampling"),
    )


def _folded(settings: dict) -> dict:
    """The CoBo keys raycobo 0.7.0 folded into others, at the values those others give
    them now (every CoBo row before 0.7.0 recorded them; ``in_todays_terms`` adds them
    to the settings of 0.7.0 on, so that both compare key for key)."""
    from raycobo.algorithms.cobo.pull import on_stepped
    from raycobo.algorithms.cobo.settings import initial_weight
    from raycobo.algorithms.cobo.wstep import FADE_CLIENTS

    box = settings.get("domain", "box") == "box"
    return {
        "pull_at": "stepped" if on_stepped(settings.get("pull")) else "current",
        "initial_weight": initial_weight(_view(settings)) if box else None,
        "fade_clients": FADE_CLIENTS if settings.get("fade") else None,
    }


def _folded_08(settings: dict) -> dict:
    """The CoBo keys raycobo 0.8.0 folded into the pull's threshold (the fade, re-checks
    and closure), at the values it gives them now, null where they did not apply (every
    CoBo row of 0.7.0 recorded them)."""
    from raycobo.algorithms.cobo import settings as rule

    view = _view(settings)
    return {
        "fade": rule.fade(view) or None,
        "recheck": rule.recheck(view) if view.domain == "box" else None,
        "closure": rule.closure(view) or None,
    }


def in_todays_terms(settings: dict) -> dict:
    """Settings as a row recorded them, in the terms ``same_settings`` compares: the
    keys raycobo 0.8.0 and 0.7.0 folded into others at the values they now take
    (``_folded_08``, ``_folded``), the re-checks' scale-up target as ``recheck_samples``
    (a key until raycobo 0.5.0; since then sampling_samples where there are re-checks),
    and a fade from before ``fade_decay`` existed as the decayed one it was."""
    out = dict(settings)
    cobo = out.get("name") == "cobo" and "pull" in out
    if cobo and "pull_at" not in out and "fade" not in out:  # 0.8.0 on
        out.update(_folded_08(out))
    if cobo and "pull_at" not in out:  # 0.7.0 on
        out.update(_folded(out))
    if "recheck_samples" not in out and "sampling_samples" in out:  # 0.5.0 on
        out["recheck_samples"] = out["sampling_samples"] if out.get("recheck") else None
    elif out.get("fade") and "fade_decay" not in out:  # before the fade's schedule key
        out["fade_decay"] = "gamma"
    return out


def _set(settings: dict) -> dict:
    """The keys that act: not null, and not at ``OFF_AT``'s value (off, as before the
    key) nor at ``FIXED_SINCE``'s (the only one since), under their names of now."""
    return {
        RENAMED.get(k, k): v
        for k, v in in_todays_terms(settings).items()
        if v is not None
        and not (k in OFF_AT and v == OFF_AT[k])
        and not (k in FIXED_SINCE and v == FIXED_SINCE[k])
    }


def inert_on(now: dict, cell: dict, keys: set[str], had: dict | None = None) -> bool:
    """Whether CoBo with settings ``now`` on ``cell`` runs as with ``keys`` (of
    ``AFTER_ROWS``) at ``had``'s values (absent: off): at neither's value does a key act
    there -- the sampler alone samples each pair at least sampling_samples and
    recheck_samples times in the cell's run, so it scales neither its rates nor the
    re-checks', and the cell has at most fade_clients clients, so the fade does not
    grow."""
    from raycobo.algorithms.cobo import CoBo
    from raycobo.config import validate

    n = clients(cell)
    if n is None:
        return False
    algo = CoBo(validate({"algorithm": now}).algorithm, cell["config"]["rounds"], 0)
    strategy = algo.sampler(n).strategy()
    for side in (_set(now), had or {}):
        for key in keys:
            value = float(side.get(key) or 0)
            if key == "fade_clients":
                if value and n > value:
                    return False
            elif strategy.shortfall(value) != 1.0:  # S < K: it scales a rate
                return False
    return True


def same_settings(ran: dict | None, now: dict, cell: dict | None = None) -> bool:
    """Whether a row that ran ``ran`` counts as an entry's run with ``now``: the same
    values, a null key the same as an absent one (a key added since, null while off,
    leaves the rows before it valid), and on ``cell`` a row whose ``AFTER_ROWS`` keys
    differ (or came after it) where at neither value do they change anything there
    (every pair sampled at least that often: the same rounds, draw for draw). A row
    written before rows recorded settings (``ran`` None) predates every key of
    ``OFF_AT``: it counts as ``now`` with those keys off."""
    have = _set(now)
    had = _set(ran) if ran is not None else {k: v for k, v in have.items() if k not in OFF_AT}
    if had == have:
        return True
    changed = {k for k in AFTER_ROWS if had.get(k) != have.get(k)}

    def rest(keys: dict) -> dict:
        return {k: v for k, v in keys.items() if k not in changed}

    if changed and cell is not None and rest(had) == rest(have):
        return inert_on(now, cell, changed, had)
    return False


def run_one(job: dict) -> dict:
    """One run (in a worker process); -> its result line (``threads``: torch's threads
    it ran with, the context of its ``seconds``)."""
    import torch

    from raycobo import api

    cfg = cell_config(
        job["cell"], job["split"], job["seed"], job.get("device", "cpu"), job.get("data_root")
    )
    over = {"algorithm__name": job["method"]}
    over.update({f"algorithm__{k}": v for k, v in job["overrides"].items()})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="regime-") as out:
        try:
            api.run(cfg, out=Path(out) / "run", track=False, **over)
        except Exception as err:  # a diverged or failed run is a result of the matrix
            summary = {"status": "failed", "error": f"{type(err).__name__}: {err}"}
        else:
            summary = json.loads((Path(out) / "run" / "summary.json").read_text())
        settings = ran_settings(Path(out) / "run")
    loss, acc = summary.get("mean_loss"), summary.get("mean_accuracy")
    diverged = summary.get("status") != "completed" or loss is None or not math.isfinite(loss)
    return {
        "cell": job["cell"]["id"],
        "entry": job["entry"],
        "method": job["method"],
        "overrides": job["overrides"],
        "seed": job["seed"],
        "split": job["split"],
        "accuracy": acc,
        "loss": loss,
        "diverged": diverged,
        "error": summary.get("error"),
        "seconds": round(time.perf_counter() - t0, 1),
        "threads": torch.get_num_threads(),
        "device": job.get("device", "cpu"),
        "settings": settings,
        "mass_of": "abs",  # mass_inside of |w| (rows before it: of w, the same for w >= 0)
        **w_shares(summary),
    }


def _worker(job: dict, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return run_one(job)


def plan_jobs(cells, entries, seeds, split, done, **where) -> list[dict]:
    """The runs not yet in ``done`` ((cell, entry, seed, split) -> the settings the row
    ran, None for a row written before rows recorded them) with the entry's settings of
    now, longest cells first; ``entries``: name -> (method, overrides), or a function of
    the cell giving them; ``where``: device, data_root."""
    jobs = []
    for cell in sorted(cells, key=lambda c: -c.get("minutes", 1)):
        own = entries(cell) if callable(entries) else entries
        for entry, (method, overrides) in own.items():
            now = entry_settings(method, overrides, cell)
            for seed in seeds:
                key = (cell["id"], entry, seed, split)
                if key in done and same_settings(done[key], now, cell):
                    continue
                jobs.append(
                    dict(
                        cell=cell,
                        entry=entry,
                        method=method,
                        overrides=overrides,
                        seed=seed,
                        split=split,
                        **where,
                    )
                )
    return jobs


def copied_runs(jobs: list[dict], rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """The jobs whose run is already in ``rows`` under another entry's name: the same
    method, cell, seed, split and device, and recorded settings that count as the job's
    entry's now (a run is a function of these: its seed fixes every draw), e.g. a
    candidate's runs once a new default makes it the defaults. -> (the jobs still to
    run, one row per job found: the latest such run's row under the job's entry, with
    ``copied_from`` naming the entry it ran as)."""
    todo, copies = [], []
    for job in jobs:
        cell = job["cell"]
        now = entry_settings(job["method"], job["overrides"], cell)
        found = next(
            (
                r
                for r in reversed(rows)
                if r.get("settings") is not None
                and r["entry"] != job["entry"]
                and (r["cell"], r["seed"], r.get("split"), r["method"])
                == (cell["id"], job["seed"], job["split"], job["method"])
                and r.get("device", "cpu") == job.get("device", "cpu")
                and same_settings(r["settings"], now, cell)
            ),
            None,
        )
        if found is None:
            todo.append(job)
        else:
            copies.append(
                {
                    **found,
                    "entry": job["entry"],
                    "overrides": job["overrides"],
                    "copied_from": found.get("copied_from", found["entry"]),
                }
            )
    return todo, copies


def read_results(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def execute(jobs: list[dict], results: Path, n_jobs: int, threads: int | None = None) -> None:
    """``threads``: torch threads per job (default: the cores shared among the jobs)."""
    threads = threads or max(1, (os.cpu_count() or 1) // n_jobs)
    with (
        results.open("a") as f,
        ProcessPoolExecutor(
            n_jobs, mp_context=get_context("spawn"), initializer=die_with_parent
        ) as pool,
    ):
        futures = [pool.submit(_worker, j, threads) for j in jobs]
        # each row as its run ends: a slow run does not hold back the rows of those
        # that ended after it started (a call stopped at a time limit keeps them)
        for k, fut in enumerate(as_completed(futures), 1):
            row = fut.result()
            f.write(json.dumps(row) + "\n")
            f.flush()
            shown = (
                "diverged"
                if row["diverged"]
                else (
                    f"acc {100 * row['accuracy']:.2f}"
                    if row["accuracy"] is not None
                    else f"loss {row['loss']:.4g}"
                )
            )
            print(
                f"[{k}/{len(jobs)}] {row['cell']} {row['entry']} seed {row['seed']}: "
                f"{shown} ({row['seconds']:.0f} s)",
                flush=True,
            )


def select_cells(cells: list[dict], named: str, quick: bool, device: str) -> list[dict]:
    """The cells named (comma-separated; KeyError for one not there), else the quick
    ones, else all of them but, on the CPU, those marked ``gpu``."""
    if named:
        wanted = named.split(",")
        unknown = sorted(set(wanted) - {c["id"] for c in cells})
        if unknown:
            raise KeyError(unknown[0])
        return [c for c in cells if c["id"] in wanted]
    if quick:
        return [c for c in cells if c.get("quick")]
    return [c for c in cells if device != "cpu" or not c.get("gpu")]


def choose_entries(args, known: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    """Local and Oracle (unless --no-baselines), the defaults, the candidates named, the
    other methods named (--methods: each with its defaults, an entry of its name) and,
    with --sweep, every point of the grid; ValueError naming a bad option."""
    from raycobo.algorithms import METHODS

    entries: dict[str, tuple[str, dict]] = {}
    if not args.no_baselines:
        entries = {"local": ("local", {}), "oracle": ("oracle", {})}
    if not args.no_cobo:
        entries["cobo"] = ("cobo", {})
    for name in filter(None, args.methods.split(",")):
        if name not in METHODS or name in ("cobo", "local", "oracle"):
            raise ValueError(f"--methods: no other method {name} (known: {', '.join(METHODS)})")
        entries[name] = (name, {})
    history = load_history()
    for name in filter(None, args.candidates.split(",")):
        if name in history:
            raise ValueError(
                f"--candidates: {name} is history (candidates.yaml): {history[name]}; its "
                "rows are what it ran, and this raycobo cannot run it again"
            )
        if name not in known:
            raise ValueError(f"--candidates: no candidate {name} in candidates.yaml")
        entries[name] = ("cobo", known[name])
    if args.sweep:
        if args.split != "validation":
            raise ValueError("--sweep runs on the validation split (--split validation)")
        grid = load_sweep()
        if not grid:
            raise ValueError("--sweep: candidates.yaml has no sweep grid")
        entries.update(sweep_entries(grid))
    return entries


def cell_entries(
    cell: dict, entries: dict[str, tuple[str, dict]], args, validation_rows: list[dict]
) -> dict[str, tuple[str, dict]]:
    """The entries of one cell: ``entries``, where the cell has no clusters its
    ``baselines`` (``baseline_entries``) in place of Local and Oracle."""
    if not cell.get("baselines"):
        return entries
    own = {e: v for e, v in entries.items() if e not in ("local", "oracle")}
    if args.no_baselines:
        return own
    base, missing = baseline_entries(cell, args.split, validation_rows)
    if missing:
        print(
            f"{cell['id']}: {', '.join(missing)} not run: tune on validation first "
            "(--split validation runs every point of their grids)"
        )
    return {**base, **own}


def tuned_jobs(cells: list[dict], args, seeds: list[int], done: dict) -> list[dict]:
    """--tuned: per cell, the sweep point that scored best on the validation split
    (OUT/validation/results.jsonl), run as the entry ``tuned``; ValueError where no
    cell has a complete sweep there."""
    if args.split != "test":
        raise ValueError("--tuned runs on the test split: the point is chosen on validation")
    grid = load_sweep()
    rows = read_results(args.out / "validation" / "results.jsonl")
    jobs, missing = [], []
    for cell in cells:
        over = tuned_choice(rows, cell, grid) if grid else None
        if over is None:
            missing.append(cell["id"])
            continue
        jobs += plan_jobs(
            [cell], {"tuned": ("cobo", over)}, seeds, "test", done,
            device=args.device, data_root=args.data_root,
        )  # fmt: skip
    if missing and len(missing) == len(cells):
        raise ValueError(
            "--tuned: no cell has a complete sweep on the validation split: run "
            "--split validation --sweep on the same cells first"
        )
    if missing:
        print(f"--tuned: no complete sweep on validation for {', '.join(missing)}: skipped")
    return jobs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the cells marked quick, seed 0")
    ap.add_argument("--cells", default="")
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--split", choices=["test", "validation"], default="test")
    ap.add_argument("--candidates", default="", help="named CoBo variants to add")
    ap.add_argument(
        "--no-baselines", action="store_true", help="skip Local and Oracle (a cell's baselines)"
    )
    ap.add_argument("--no-cobo", action="store_true", help="skip CoBo's defaults")
    ap.add_argument(
        "--methods", default="", help="other methods to add, each with its defaults (fedamp,...)"
    )
    ap.add_argument(
        "--sweep", action="store_true", help="every point of candidates.yaml's sweep grid"
    )
    ap.add_argument(
        "--tuned", action="store_true", help="the grid point best on validation, per cell"
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads per job (default: cores / jobs)"
    )
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument(
        "--device", default="cpu", help="engine.device of every run (cuda: the GPU cells too)"
    )
    ap.add_argument("--data-root", default=None, help="data.root of the file data sets")
    ap.add_argument(
        "--copies-only",
        action="store_true",
        help="record the runs already there under another entry's name, run nothing",
    )
    args = ap.parse_args()
    try:
        cells = select_cells(load_cells(), args.cells, args.quick, args.device)
    except KeyError as err:
        print(f"error: --cells: no cell {err.args[0]}", file=sys.stderr)
        return 2
    seeds = (
        [int(s) for s in args.seeds.split(",")]
        if args.seeds
        else ([0] if args.quick else [0, 1, 2])
    )
    out = args.out / args.split
    results = out / "results.jsonl"
    rows = read_results(results)
    done = {
        (r["cell"], r["entry"], r["seed"], r["split"]): r.get("settings")
        for r in rows  # the last row of a run counts
    }
    try:
        entries = choose_entries(args, load_candidates())
        validation_rows = read_results(args.out / "validation" / "results.jsonl")
        jobs = plan_jobs(
            cells, lambda cell: cell_entries(cell, entries, args, validation_rows),
            seeds, args.split, done, device=args.device, data_root=args.data_root,
        )  # fmt: skip
        if args.tuned:
            jobs += tuned_jobs(cells, args, seeds, done)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    jobs, copies = copied_runs(jobs, rows)
    if copies:
        with results.open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in copies)
    again = sum((j["cell"]["id"], j["entry"], j["seed"], j["split"]) in done for j in jobs)
    print(
        f"{len(jobs)} runs ({len(done)} already in {results}"
        + (f"; {again} again: their entry's settings changed" if again else "")
        + (f"; {len(copies)} recorded from the same runs under another entry" if copies else "")
        + ")",
        flush=True,
    )
    if args.copies_only:
        for j in jobs:
            print(f"not run (--copies-only): {j['cell']['id']} {j['entry']} seed {j['seed']}")
        return 0
    execute(jobs, results, args.jobs, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
