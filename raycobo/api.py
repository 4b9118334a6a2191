"""The Python API: what the command line does, as functions (the CLI is a thin layer over
them).

A config is a YAML path, a mapping (the YAML's content) or a :class:`Config`; keyword
overrides are dotted keys with ``__`` for the dots (``algorithm__rho=0.1`` is
``algorithm.rho=0.1``). Tracking follows ``tracking.enabled`` unless ``track`` says
otherwise; ``progress=True`` shows a progress bar.

>>> import raycobo
>>> res = raycobo.run("examples/quickstart.yaml", rounds=200, algorithm__name="cobo")
>>> res.mean_accuracy, res.run_dir
>>> res.frame("history")          # pandas: one row per evaluation
>>> cmp = raycobo.compare("examples/quickstart.yaml", ["local", "cobo"], rounds=200)
>>> cmp.frame()                   # the comparison table
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycobo.config import Config, ConfigError, load_config, validate, with_overrides
from raycobo.lifecycle import Result, resume_config, run_experiment
from raycobo.lifecycle.run_dir import read_summary

ConfigLike = str | Path | dict[str, Any] | Config


def dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """Keyword overrides as dotted keys: ``algorithm__rho`` -> ``algorithm.rho``."""
    return {k.replace("__", "."): v for k, v in overrides.items()}


def _path(value: Any, what: str) -> Path:
    """A path argument of the API, or a one-line error naming it."""
    if not isinstance(value, str | Path) or (isinstance(value, str) and not value):
        raise ConfigError(f"{what} must be a folder path (str or Path), not {value!r}")
    return Path(value)


def _check_keywords(fn: str, overrides: dict[str, Any], own: tuple[str, ...]) -> None:
    """Keywords are config overrides (``algorithm__rho=0.1``) besides ``own``: one close
    to an own keyword is that keyword misspelled, not a config key."""
    import difflib

    for key in overrides:
        if key in Config.model_fields:  # a config key (seed=1), whatever it resembles
            continue
        close = difflib.get_close_matches(key, own, n=1, cutoff=0.75)
        if close:
            raise ConfigError(
                f"raycobo.{fn}: unknown keyword '{key}' (did you mean '{close[0]}'?); its "
                f"keywords are {', '.join(own)}, the others config overrides (algorithm__rho=0.1)"
            )


def load(config: ConfigLike, **overrides: Any) -> Config:
    """A validated Config from a path, a mapping or a Config, with overrides applied. A
    mapping's relative ``plugin_paths`` are made absolute from the current directory
    (as a YAML's are from its folder), so that its run resumes from anywhere."""
    over = dotted(overrides)
    if isinstance(config, Config):
        return with_overrides(config, over) if over else config
    if isinstance(config, dict):
        tree = dict(config)
        if isinstance(tree.get("plugin_paths"), list):
            tree["plugin_paths"] = [str(Path(str(p)).resolve()) for p in tree["plugin_paths"]]
        cfg = validate(tree)
        return with_overrides(cfg, over) if over else cfg
    if isinstance(config, str | Path):
        cfg = load_config(Path(config))
        return with_overrides(cfg, over) if over else cfg
    raise ConfigError(
        f"a config is a YAML path, a mapping or a Config, not {type(config).__name__}"
    )


def _callbacks(cfg: Config, track: bool | None, run_name: str | None = None) -> list:
    if not (cfg.tracking.enabled if track is None else track):
        return []
    from raycobo.tracking import MLflowTracker

    tracking = (
        cfg.tracking if cfg.tracking.enabled else cfg.tracking.model_copy(update={"enabled": True})
    )
    return [MLflowTracker(tracking, run_name=run_name)]


def _progress(label: str, show: bool):
    if not show:
        return None
    from raycobo.lifecycle.progress import RoundProgress

    return RoundProgress(label)


def run(
    config: ConfigLike,
    out: str | Path | None = None,
    *,
    track: bool | None = None,
    progress: bool = False,
    **overrides: Any,
) -> Result:
    """Run one experiment into ``out`` (default ``runs/<time>-<name>-<method>``)."""
    _check_keywords("run", overrides, ("out", "track", "progress"))
    out = _path(out, "raycobo.run: out") if out is not None else None
    cfg = load(config, **overrides)
    label = cfg.algorithm.name
    return run_experiment(cfg, out, _callbacks(cfg, track), _progress(label, progress))


def resume(
    run_dir: str | Path,
    rounds: int | None = None,
    *,
    track: bool | None = None,
    progress: bool = False,
    trust_files: bool = False,
) -> Result:
    """Continue an interrupted or failed run from its newest checkpoint; ``rounds``
    extends a finished one. Plugin code the run names is imported only when the run
    recorded exactly that code (``trust_files``: whatever it is now)."""
    run_dir = _path(run_dir, "raycobo.resume: run_dir")
    over = [f"rounds={rounds}"] if rounds is not None else []
    cfg = resume_config(run_dir, over, trust_files)
    label = cfg.algorithm.name
    return run_experiment(
        cfg, Path(run_dir), _callbacks(cfg, track), _progress(label, progress), resume=True
    )


def load_run(run_dir: str | Path) -> Result:
    """A run directory's results (finished or not) without running anything."""
    path = _path(run_dir, "raycobo.load_run: run_dir")
    summary = read_summary(path)
    if summary is None:
        raise ConfigError(f"{path} holds no readable summary.json (not a run directory)")
    return Result(path, summary)


@dataclass
class Comparison:
    """A comparison: its folder, the table's rows and every entry's runs (by seed)."""

    root: Path
    rows: list[dict[str, Any]]
    results: dict[str, list[Result]]

    def frame(self):
        """The table as a pandas DataFrame, one row per entry."""
        import pandas as pd

        return pd.DataFrame.from_records(self.rows)

    @property
    def failed(self) -> list[str]:
        return [f"{r['algorithm']} ({note})" for r in self.rows for note in r.get("failed", [])]


def compare(
    config: ConfigLike,
    algorithms: list[str] | None = None,
    *,
    seeds: list[int] | None = None,
    out: str | Path | None = None,
    parallel: bool = False,
    track: bool | None = None,
    progress: bool = False,
    tune: dict[str, str | Path] | None = None,
    **overrides: Any,
) -> Comparison:
    """Several methods (or ``compare.variants``) on the same setting and seeds: a table,
    plots and an HTML report in ``out``. ``algorithms`` default to ``compare.algorithms``.
    ``tune``: entry -> sweep space; each entry's knobs are first tuned on validation data
    (``raycobo.tune.entry``), then compared with the values picked (``tuned.json``)."""
    from raycobo.comparison import tracked_compare
    from raycobo.comparison.plan import check_new_root, default_root

    own = ("algorithms", "seeds", "out", "parallel", "track", "progress", "tune")
    _check_keywords("compare", overrides, own)
    cfg = load(config, **overrides)
    if isinstance(algorithms, str):  # "cobo" or "local,cobo": names, not characters
        algorithms = [a.strip() for a in algorithms.split(",") if a.strip()]
    entries = list(algorithms) if algorithms else list(cfg.compare.algorithms)
    track_on = cfg.tracking.enabled if track is None else track
    root = _path(out, "raycobo.compare: out") if out is not None else None
    if root is not None:
        check_new_root(root)
    if tune:
        root = root if root is not None else default_root(cfg)
        cfg = tuned(cfg, entries, tune, root)
    root, rows, results = tracked_compare(
        cfg,
        entries,
        root,
        lambda label: _progress(label, progress),
        track_on,
        seeds,
        parallel,
    )
    return Comparison(root, rows, results)


def tuned(cfg: Config, entries: list[str], spaces: dict[str, str | Path], root: Path) -> Config:
    """``cfg`` with each tuned entry's picked values as its overrides (or in its variant);
    the sweeps go to ``root/tune-<entry>``, the picked values to ``root/tuned.json``."""
    import json

    from raycobo.comparison.plan import entry_config
    from raycobo.tune.entry import check_entry, tune_entry

    for entry, space in spaces.items():  # every space checked before any sweep runs
        if entry not in entries:
            raise ConfigError(f"--tune {entry}: '{entry}' is not compared ({', '.join(entries)})")
        check_entry(entry_config(cfg, entry), Path(space))
    picked: dict[str, dict[str, Any]] = {}
    for entry, space in spaces.items():
        picked[entry] = tune_entry(entry_config(cfg, entry), Path(space), root / f"tune-{entry}")
    root.mkdir(parents=True, exist_ok=True)
    (root / "tuned.json").write_text(json.dumps(picked, indent=2))
    return with_tuned(cfg, picked)


def with_tuned(cfg: Config, picked: dict[str, dict[str, Any]]) -> Config:
    """``cfg`` with tuned values (entry -> key -> value, as in ``tuned.json``) written into
    each entry's ``compare.overrides`` (or its ``compare.variants`` entry)."""
    for entry, values in picked.items():
        where = "variants" if entry in cfg.compare.variants else "overrides"
        table = {k: dict(v) for k, v in getattr(cfg.compare, where).items()}
        table[entry] = {**table.get(entry, {}), **values}
        cfg = with_overrides(cfg, {f"compare.{where}": table})
    return cfg


def resume_compare(
    root: str | Path,
    *,
    track: bool | None = None,
    progress: bool = False,
    trust_files: bool = False,
) -> Comparison:
    """Continue a comparison: finished runs are kept, the others resume. Plugin code it
    names is imported only when the comparison recorded exactly that code
    (``trust_files``: whatever it is now)."""
    from raycobo.comparison import tracked_compare
    from raycobo.config import load_stored_config, read_yaml
    from raycobo.lifecycle.plugins import check_plugins
    from raycobo.lifecycle.run_dir import stored_config_path

    root = _path(root, "raycobo.resume_compare: root")
    path = stored_config_path(root, "comparison")
    check_plugins(root, read_yaml(path), "comparison", trust_files)
    cfg = load_stored_config(path)
    track_on = cfg.tracking.enabled if track is None else track
    progress_of = lambda label: _progress(label, progress)  # noqa: E731
    entries = list(cfg.compare.algorithms)
    rows = tracked_compare(cfg, entries, root, progress_of, track_on, None, False, True)
    return Comparison(*rows)


def sweep(
    space: str | Path,
    *,
    out: str | Path | None = None,
    num_samples: int | None = None,
    smoke_test: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """A Ray Tune sweep (``tune_spaces/*.yaml``): every trial tracked, the best finished
    trial's config written as ``best_config.yaml``. -> the sweep's summary
    (``sweep_summary.json``; ``root`` is its folder)."""
    from raycobo.tune.space import load_sweep
    from raycobo.tune.sweep import run_sweep

    _check_keywords("sweep", overrides, ("out", "num_samples", "smoke_test"))
    out = _path(out, "raycobo.sweep: out") if out is not None else None
    spec, base = load_sweep(space, dotted(overrides))
    return run_sweep(spec, base, out, num_samples, smoke_test)


def resume_sweep(root: str | Path, *, trust_files: bool = False) -> dict[str, Any]:
    """Continue a sweep from its directory alone (unfinished and failed trials go on
    from their checkpoints). The directory is trusted like code: it must be yours, not
    writable by others, and Tune's files must be those the sweep recorded."""
    from raycobo.tune.sweep import resume_sweep as resume_from

    return resume_from(_path(root, "raycobo.resume_sweep: root"), trust_files)
