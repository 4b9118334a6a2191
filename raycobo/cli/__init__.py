"""Command line: ``raycobo run | compare | demo | bench``.

Bad input ends with a non-zero exit and one line naming the key or file; ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from raycobo.cli.bench import bench_app
from raycobo.cli.common import (
    Debug,
    NoTrack,
    Out,
    Overrides,
    Quiet,
    TrustFiles,
    _fail,
    _guarded,
    _help_config,
    _int_list,
    app,
)
from raycobo.config import ConfigError, load_config, with_overrides

app.add_typer(bench_app, name="bench")


@app.command()
def run(
    config: Annotated[
        str | None, typer.Argument(help="experiment YAML (not with --resume)", show_default=False)
    ] = None,
    overrides: Overrides = None,
    out: Out = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="continue the run in this directory from its latest checkpoint "
            "(only rounds=N may be given, to extend it)",
        ),
    ] = None,
    trust_files: TrustFiles = False,
    quiet: Quiet = False,
    debug: Debug = False,
    no_tracking: NoTrack = False,
    help_config: Annotated[
        str | None,
        typer.Option(
            "--help-config",
            help="list the settings of this method (algorithm.<key>; a plugin: also from "
            "CONFIG's plugin_paths) or section (data, partition, model, engine, tracking, "
            "checkpoint, compare) with their defaults, then exit",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run one experiment and write its run directory, or continue one (--resume)."""

    if help_config is not None:
        return _help_config(help_config, config)

    def go():
        from raycobo import api

        over = list(overrides or [])
        track, progress = (False if no_tracking else None), not quiet
        _trust_needs_resume(trust_files, resume)
        if resume is not None:
            rounds = _resumed_rounds(resume, config, over, out, trust_files)
            res = api.resume(
                resume, rounds, track=track, progress=progress, trust_files=trust_files
            )
        else:
            if config is None:
                raise ConfigError("missing CONFIG (an experiment YAML), or --resume RUN_DIR")
            cfg = load_config(Path(config), over)
            res = api.run(cfg, out, track=track, progress=progress)
        _say_run(res)

    _guarded(debug, go)


def _trust_needs_resume(trust_files: bool, resume: Path | None) -> None:
    if trust_files and resume is None:
        raise ConfigError("--trust-files goes with --resume")


def _resumed_rounds(resume: Path, config, over: list[str], out, trust_files: bool):
    """`run --resume DIR [rounds=N]`: the rounds to extend to (None: as recorded)."""
    from raycobo.lifecycle.experiment import resume_config

    if config is not None and "=" not in config:
        raise ConfigError("--resume takes its config from the run directory; drop CONFIG")
    if config is not None:  # `run --resume DIR rounds=40`: the first override
        over.insert(0, config)
    if out is not None and out.resolve() != resume.resolve():
        raise ConfigError("--resume continues in its own directory; drop --out")
    return resume_config(resume, over, trust_files).rounds if over else None  # only rounds=N


def _say_run(res) -> None:
    from raycobo.comparison.table import fmt

    s = res.summary
    acc = s["mean_accuracy"]
    acc_s = f"mean accuracy {100 * acc:.2f}%  " if acc is not None else ""
    loss, wall = fmt(s["mean_loss"], ".4g"), s["wall_seconds"]
    ppl = s.get("mean_perplexity")
    ppl_s = f"  perplexity {ppl:.2f}" if ppl is not None else ""
    typer.echo(f"{s['algorithm']}: {acc_s}mean loss {loss}{ppl_s}  ({wall:.1f} s)")
    if s.get("resumed_from_round") is not None:
        typer.echo(f"resumed from round {s['resumed_from_round']}")
    typer.echo(f"run directory: {res.run_dir}")


def _print_table(rows) -> None:
    from rich.console import Console

    from raycobo.comparison import terminal_table

    Console().print(terminal_table(rows))


def _report_failures(rows) -> None:
    """Exit 1 after the table when some compared runs failed (their rows say where)."""
    bad = [f"{r['algorithm']} ({note})" for r in rows for note in r.get("failed", [])]
    if bad:
        _fail(f"{len(bad)} run(s) failed: {', '.join(bad)}; the others are in the table", 1)


def _check_compare_resume(resume: Path, config, overrides, flags: dict) -> None:
    """compare --resume continues the comparison stored in its directory: a config,
    overrides or the flags that would choose another are refused, naming them."""
    given = [str(config)] if config is not None else []
    given += list(overrides or [])
    if given and "=" in given[0]:
        raise ConfigError(
            f"compare --resume takes no overrides (got {' '.join(given)}): a resumed "
            "comparison keeps the config stored in its directory"
        )
    if given:
        raise ConfigError(
            "compare --resume takes its config from the comparison's directory; "
            f"drop CONFIG ({given[0]})"
        )
    ignored = [flag for flag, value in flags.items() if value]
    if ignored:  # the directory's stored comparison decides them
        raise ConfigError(
            f"compare --resume continues the comparison stored in {resume}: drop "
            f"{', '.join(ignored)}"
        )


def _tune_spaces(items: list[str] | None) -> dict[str, Path] | None:
    """--tune ENTRY=SPACE.yaml (repeatable) -> {entry: space}, or None."""
    spaces = {}
    for item in items or []:
        entry, sep, space = item.partition("=")
        if not sep or not entry or not space:
            raise ConfigError(f"--tune {item}: give ENTRY=SPACE.yaml")
        spaces[entry.strip()] = Path(space.strip())
    return spaces or None


@app.command()
def compare(
    config: Annotated[
        Path | None, typer.Argument(help="experiment YAML (not with --resume)", show_default=False)
    ] = None,
    overrides: Overrides = None,
    algorithms: Annotated[
        str | None,
        typer.Option("--algorithms", "-a", help="comma-separated, e.g. local,fedavg,cobo"),
    ] = None,
    seeds: Annotated[
        str | None, typer.Option("--seeds", help="comma-separated seeds, e.g. 0,1,2")
    ] = None,
    parallel: Annotated[
        bool, typer.Option("--parallel", help="run (algorithm, seed) pairs as Ray tasks")
    ] = False,
    tune: Annotated[
        list[str] | None,
        typer.Option(
            "--tune",
            help="ENTRY=SPACE.yaml: tune the entry's knobs on validation data first (repeatable)",
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="continue this comparison: finished runs are kept, the others resume",
        ),
    ] = None,
    trust_files: TrustFiles = False,
    out: Out = None,
    quiet: Quiet = False,
    debug: Debug = False,
    no_tracking: NoTrack = False,
) -> None:
    """Run several algorithms on the same data and seeds; table, plots and an HTML report."""

    def go():
        from raycobo import api

        track, progress = (False if no_tracking else None), not quiet
        _trust_needs_resume(trust_files, resume)
        if resume is not None:
            flags = {"--algorithms": algorithms, "--seeds": seeds, "--out": out, "--tune": tune}
            _check_compare_resume(resume, config, overrides, flags)
            shown = {"track": track, "progress": progress, "trust_files": trust_files}
            res = api.resume_compare(resume, **shown)
        elif config is None:
            raise ConfigError("missing CONFIG (an experiment YAML), or --resume COMPARE_DIR")
        else:
            chosen = {"seeds": _int_list(seeds, "--seeds") if seeds else None, "out": out}
            chosen |= {"parallel": parallel, "track": track, "progress": progress}
            cfg = load_config(config, overrides or [])
            # "local,cobo": the API reads the names
            res = api.compare(cfg, algorithms, tune=_tune_spaces(tune), **chosen)
        _show_comparison(res)

    _guarded(debug, go)


def _show_comparison(res) -> None:
    """The table, where the files are, and the runs that failed."""
    _print_table(res.rows)
    typer.echo(f"comparison: {res.root}/comparison.md  report: {res.root}/report.html")
    _report_failures(res.rows)


@app.command()
def demo(
    config: Annotated[Path, typer.Argument(help="experiment YAML")] = Path(
        "examples/quickstart.yaml"
    ),
    overrides: Overrides = None,
    out: Out = None,
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """The quickstart: compare the config's algorithms, then say where everything is."""

    def go():
        from raycobo import api
        from raycobo.data import fashion_mnist_available
        from raycobo.tracking.mlflow_tracker import resolve_uri, runs_link, ui_command

        cfg = load_config(config, overrides or [])
        if cfg.data.name == "fashion_mnist" and not fashion_mnist_available(cfg.data.root):
            typer.echo(
                "notice: Fashion-MNIST not found (Debian package dataset-fashion-mnist); "
                "using sklearn's digits instead",
                err=True,
            )
            cfg = with_overrides(
                cfg, {"data.name": "digits", "data.fraction": 0.5, "model.hidden": [32]}
            )
        res = api.compare(cfg, out=out, progress=not quiet)
        root, rows = res.root, res.rows
        _print_table(rows)
        typer.echo(f"run directories: {root}/<algorithm>/   (summary.json, metrics.csv, plots/)")
        typer.echo(f"comparison:      {root}/comparison.md   report: {root}/report.html")
        typer.echo(f"plots:           {root}/plots/curves.png, {root}/plots/collaboration.png")
        if cfg.tracking.enabled:
            store, exp = resolve_uri(cfg.tracking.uri), cfg.tracking.experiment
            typer.echo(f"MLflow store:    {store}  (experiment '{exp}')")
            typer.echo(f"open it with:    {ui_command(cfg.tracking)}")
            link = runs_link(cfg.tracking)
            if link:
                typer.echo(f"then the runs:   {link}")
        _report_failures(rows)

    _guarded(debug, go)


@app.command()
def sweep(
    space: Annotated[
        Path | None,
        typer.Argument(
            help="sweep YAML (tune_spaces/*.yaml); not with --resume", show_default=False
        ),
    ] = None,
    overrides: Overrides = None,
    num_samples: Annotated[int | None, typer.Option("--num-samples", help="trials")] = None,
    smoke_test: Annotated[bool, typer.Option("--smoke-test", help="few short trials")] = False,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="continue the sweep in this directory (nothing else)"),
    ] = None,
    trust_files: TrustFiles = False,
    out: Out = None,
    debug: Debug = False,
) -> None:
    """Ray Tune sweep; every trial is an MLflow run under one parent; writes best_config.yaml."""

    def go():
        from raycobo import api

        if resume is not None:
            given = [str(space)] if space is not None else []
            given += list(overrides or [])
            if given or out is not None or num_samples is not None or smoke_test:
                raise ConfigError(
                    "sweep --resume takes everything from the sweep's directory; drop "
                    f"{' '.join(given) or 'the other options'}"
                )
            summary = api.resume_sweep(resume, trust_files=trust_files)
        elif space is None:
            raise ConfigError("missing SPACE (a sweep YAML), or --resume SWEEP_DIR")
        else:
            from raycobo.tune.space import load_sweep
            from raycobo.tune.sweep import run_sweep

            spec, base = load_sweep(space, overrides or [])
            summary = run_sweep(spec, base, out, num_samples, smoke_test)
        _say_sweep(summary)

    _guarded(debug, go)


def _say_sweep(summary: dict) -> None:
    counts = ", ".join(
        f"{summary[k]} {k}" for k in ("completed", "stopped", "failed", "interrupted")
    )
    typer.echo(f"{summary['num_trials']} trials: {counts}; results in {summary['root']}")
    if summary["interrupted"]:
        _fail(
            f"sweep interrupted; continue it with: raycobo sweep --resume {summary['root']}",
            code=130,
        )
    best = summary["best"]
    if best is None:
        _fail("no trial finished with the metric; see sweep_summary.json", code=1)
    metric, split = summary["metric"], summary["chosen_on"]
    marked = "" if split == "validation" else " (chosen on the TEST split: optimistic)"
    value = best["metrics"][metric]
    typer.echo(f"best {metric} on {split}: {value:.4g} with {best['config']}{marked}")
    test = summary.get("test")
    if test is not None:
        shown = test.get(metric)
        value = f"{shown:.4g}" if isinstance(shown, int | float) else "-"
        typer.echo(f"on test (run once, {test['run_dir']}): {metric} {value}")
    typer.echo(f"best config: {summary['best_config']}  (raycobo run {summary['best_config']})")
    typer.echo(f"report: {Path(summary['root']) / 'sweep_report.html'}")


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # e.g. `raycobo ... | head`
        sys.exit(0)
