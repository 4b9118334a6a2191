"""Command line: ``raycobo run | compare | demo | bench``.

Bad input ends with a non-zero exit and one line naming the key or file; ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from raycobo.config import ConfigError, load_config, with_overrides

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="raycobo: collaborative-learning experiments (CoBo and baselines) with Ray and MLflow.",
)

Overrides = Annotated[
    list[str] | None, typer.Argument(help="dotted overrides, e.g. algorithm.rho=0.1 rounds=500")
]
Out = Annotated[
    Path | None, typer.Option("--out", help="run directory (default runs/<time>-<name>)")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")]
Debug = Annotated[bool, typer.Option("--debug", help="show tracebacks")]
NoTrack = Annotated[bool, typer.Option("--no-tracking", help="do not log to MLflow")]
Threads = Annotated[int | None, typer.Option(help="torch threads")]
TrustFiles = Annotated[
    bool,
    typer.Option(
        "--trust-files",
        help="with --resume: import the plugin code it names (and, for a sweep, accept "
        "Tune's files) though the directory did not record exactly that code",
    ),
]


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _guarded(debug: bool, fn, *args, **kwargs):
    from raycobo.lifecycle.experiment import RunFailed

    try:
        return fn(*args, **kwargs)
    except typer.Exit:
        raise
    except ConfigError as err:
        if debug:
            raise
        _fail(str(err).splitlines()[0] if str(err) else "invalid configuration")
    except RunFailed as err:
        if debug:
            raise
        _fail(f"{str(err).splitlines()[0]}; rerun with --debug for the traceback", code=1)
    except KeyboardInterrupt as err:
        from raycobo.lifecycle.experiment import Terminated

        what = "terminated (SIGTERM)" if isinstance(err, Terminated) else "interrupted"
        run_dir = getattr(err, "run_dir", None)
        if run_dir is None:
            _fail(f"{what}; partial results and checkpoints were kept in the run directory", 130)
        _fail(
            f"{what} after round {getattr(err, 'last_round', 0)}; partial results and "
            f"checkpoints are in {run_dir}; continue with: raycobo run --resume {run_dir}",
            130,
        )
    except Exception as err:  # noqa: BLE001 - one line for users; --debug shows the rest
        if debug:
            raise
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        _fail(f"{type(err).__name__}: {lines[-1] if lines else ''}"[:500], code=1)


def _set_threads(threads: int | None) -> None:
    """--threads of the bench commands: torch's intra-op threads (default: torch's own)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def _choices(text: str, flag: str, allowed: tuple[str, ...]) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in allowed]
    if bad or not names:
        raise ConfigError(f"{flag}: '{text}' (choose from {', '.join(allowed)})")
    return names


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated integers, got '{text}'") from None


SECTIONS = ("data", "partition", "model", "engine", "tracking", "checkpoint", "compare")


def _help_config(name: str, config: str | None) -> None:
    """``run [CONFIG] --help-config NAME``: the settings of a method (a plugin is looked up
    in CONFIG's plugin_paths too) or of a config section (``data``, ``engine``, ...),
    with their defaults and meaning."""
    from raycobo.algorithms import method
    from raycobo.config import read_config_tree
    from raycobo.registry import add_search_paths

    if name in SECTIONS:
        _section_help(name)
    try:
        if config is not None and "=" not in config:
            add_search_paths(read_config_tree(config).get("plugin_paths") or [])
    except ConfigError as err:
        _fail(str(err))
    try:
        settings = method(name).settings
    except ConfigError as err:
        _fail(f"--help-config: {str(err).partition(': ')[2]} (or a section: {', '.join(SECTIONS)})")
    doc = (settings.__doc__ or name).strip().splitlines()[0]
    _print_settings(f"{name}: {doc}", [("algorithm", settings)], skip={"name"})


def _section_help(name: str) -> None:
    """A config section's keys (``data`` with its partition's)."""
    from raycobo.config import Config, DataConfig, PartitionConfig

    fields = Config.model_fields
    if name == "partition":
        parts = [("data.partition", PartitionConfig)]
    elif name == "data":
        parts = [("data", DataConfig), ("data.partition", PartitionConfig)]
    else:
        parts = [(name, fields[name].annotation)]
    _print_settings(f"the {name} section", parts, skip={"partition"})


def _print_settings(title: str, parts: list, skip: set[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("key", "default", "meaning"):
        t.add_column(col)
    for prefix, settings in parts:
        for key, field in settings.model_fields.items():
            if key in skip:
                continue
            default = field.get_default(call_default_factory=True)
            t.add_row(f"{prefix}.{key}", repr(default), field.description or "")
    Console(width=120).print(t)
    raise typer.Exit(0)


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


bench_app = typer.Typer(help="Throughput and scaling measurements (figures, not tests).")
app.add_typer(bench_app, name="bench")


@bench_app.command("engine")
def bench_engine_cmd(
    models: Annotated[str, typer.Option("--model", help="comma-separated models")] = "mlp,cnn",
    clients: Annotated[str, typer.Option(help="comma-separated client counts")] = "8,40,80",
    algorithms: Annotated[str, typer.Option(help="comma-separated: cobo, fedavg")] = "cobo",
    rounds: Annotated[int, typer.Option(help="timed rounds per measurement")] = 5,
    batch_size: Annotated[int, typer.Option()] = 32,
    threads: Threads = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    strategy: Annotated[
        str, typer.Option(help="comma-separated local-engine strategies: auto, vmap, chunked")
    ] = "auto",
    out: Out = None,
    debug: Debug = False,
) -> None:
    """The local engine (its automatic strategy, or those named) vs the per-client loop:
    time per round and peak memory, per model and n (each measured in a fresh process)."""

    def go():
        from raycobo.bench.engine import SHAPES, as_markdown, bench_engine

        names = [m.strip() for m in models.split(",") if m.strip()]
        bad = [m for m in names if m not in SHAPES]
        if bad:
            raise ConfigError(
                f"--model: unknown model '{bad[0]}' (choose from {', '.join(SHAPES)})"
            )
        algos = [a.strip() for a in algorithms.split(",") if a.strip()]
        if any(a not in ("cobo", "fedavg") for a in algos):
            raise ConfigError(f"--algorithms must be cobo and/or fedavg, got '{algorithms}'")
        ns = _int_list(clients, "--clients")
        strategies = _choices(strategy, "--strategy", ("auto", "vmap", "chunked"))
        rows = bench_engine(
            names,
            ns,
            rounds,
            batch_size,
            out,
            typer.echo,
            algos,
            threads,
            device=device,
            strategies=strategies,
        )
        typer.echo(as_markdown(rows))
        if out is not None:
            typer.echo(f"wrote {out}/bench_engine.csv")

    _guarded(debug, go)


@bench_app.command("paper")
def bench_paper_cmd(
    setting: Annotated[
        str, typer.Option(help="comma-separated: cross_silo, cross_device")
    ] = "cross_silo,cross_device",
    device: Annotated[str, typer.Option(help="cuda or cpu")] = "cuda",
    precision: Annotated[str, typer.Option(help="comma-separated: fp32, tf32, bf16")] = "fp32",
    layout: Annotated[str, typer.Option(help="comma-separated: nchw, nhwc")] = "nchw",
    rounds: Annotated[int, typer.Option(help="timed rounds per measurement")] = 3,
    batch_size: Annotated[int, typer.Option()] = 128,
    clients: Annotated[
        int | None, typer.Option(help="scale the settings down to this many clients (smoke)")
    ] = None,
    threads: Threads = None,
    out: Out = None,
    debug: Debug = False,
) -> None:
    """The CoBo paper's ResNet-9 experiments at full size: s/round, images/s against one
    plain ResNet-9 at the same batch, precision and layout, and the projected wall time."""

    def go():
        from raycobo.bench.paper import bench_paper

        _set_threads(threads)
        rows = bench_paper(
            _choices(setting, "--setting", ("cross_silo", "cross_device")),
            device,
            _choices(precision, "--precision", ("fp32", "tf32", "bf16")),
            [x == "nhwc" for x in _choices(layout, "--layout", ("nchw", "nhwc"))],
            rounds,
            batch_size,
            clients,
            out,
            echo=typer.echo,
        )
        if out is not None:
            typer.echo(f"wrote {out}/bench_paper.csv ({len(rows)} rows)")

    _guarded(debug, go)


@bench_app.command("profile")
def bench_profile_cmd(
    model: Annotated[str, typer.Option("--model")] = "mlp",
    clients: Annotated[int, typer.Option()] = 40,
    algorithm: Annotated[str, typer.Option(help="cobo or fedavg")] = "cobo",
    engine: Annotated[str, typer.Option(help="local or loop")] = "local",
    strategy: Annotated[str, typer.Option(help="auto, vmap, chunked")] = "auto",
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    rounds: Annotated[int, typer.Option(help="rounds timed, then profiled")] = 3,
    batch_size: Annotated[int, typer.Option()] = 32,
    rows: Annotated[int, typer.Option(help="operators listed")] = 25,
    threads: Threads = None,
    debug: Debug = False,
) -> None:
    """Where one round's time goes: ms/round, then torch.profiler's operator table."""

    def go():
        from raycobo.bench.engine import SHAPES
        from raycobo.bench.profile import profile_round

        _set_threads(threads)
        _choices(model, "--model", tuple(SHAPES))
        _choices(algorithm, "--algorithm", ("cobo", "fedavg"))
        _choices(engine, "--engine", ("local", "loop"))
        _choices(strategy, "--strategy", ("auto", "vmap", "chunked"))
        typer.echo(
            profile_round(
                model, clients, algorithm, engine, strategy, device, rounds, batch_size, rows
            )
        )

    _guarded(debug, go)


@bench_app.command("scaling")
def bench_scaling_cmd(
    clients: Annotated[
        str, typer.Option(help="comma-separated client counts")
    ] = "80,320,1000,3000,10000",
    rounds: Annotated[int, typer.Option(help="timed rounds per n")] = 50,
    task: Annotated[str, typer.Option(help="quadratic or mlp")] = "quadratic",
    clusters: Annotated[int, typer.Option(help="ground-truth clusters")] = 10,
    threads: Threads = None,
    out: Out = None,
    no_tracking: NoTrack = False,
    debug: Debug = False,
) -> None:
    """CoBo with O(1/n) sampling at growing n: round time, memory, quality (CSV + plot)."""

    def go():
        from raycobo.bench import bench_scaling

        if task not in ("quadratic", "mlp"):
            raise ConfigError(f"--task must be quadratic or mlp, got '{task}'")
        _set_threads(threads)
        ns = _int_list(clients, "--clients")
        target = out or Path("runs") / "bench-scaling"
        tracker = None
        if not no_tracking:
            from raycobo.config import TrackingConfig
            from raycobo.tracking.mlflow_tracker import ScalingLogger

            tracker = ScalingLogger(TrackingConfig(experiment="raycobo-bench"))
        bench_scaling(ns, rounds, task, clusters, target, echo=typer.echo, tracking=tracker)
        typer.echo(f"wrote {target}/bench_scaling.csv and bench_scaling.png")

    _guarded(debug, go)


@bench_app.command("ray")
def bench_ray_cmd(
    clients: Annotated[str, typer.Option(help="comma-separated client counts")] = "8,40,80",
    per_actor: Annotated[str, typer.Option(help="clients per host actor")] = "8,40",
    rounds: Annotated[int, typer.Option(help="timed rounds per measurement")] = 10,
    slow: Annotated[float, typer.Option(help="extra seconds per gradient on host 1")] = 0.0,
    schedule: Annotated[
        str, typer.Option(help="comma-separated engine.rounds: sync, stale, resident")
    ] = "sync,resident",
    staleness: Annotated[int, typer.Option(help="engine.staleness of the stale rows")] = 1,
    threads: Threads = None,
    gpus_per_client: Annotated[
        float, typer.Option(help="engine.gpus_per_client of the Ray hosts")
    ] = 0.0,
    device: Annotated[str, typer.Option(help="the local engine's device (cpu, cuda)")] = "cpu",
    data_root: Annotated[str | None, typer.Option(help="Fashion-MNIST folder (idx files)")] = None,
    fraction: Annotated[float, typer.Option(help="data.fraction of Fashion-MNIST")] = 0.05,
    model: Annotated[str, typer.Option(help="mlp or cnn")] = "mlp",
    host_threads: Annotated[
        int | None, typer.Option(help="torch threads per host (default: shared out)")
    ] = None,
    algorithm: Annotated[str, typer.Option(help="the method measured")] = "cobo",
    local_steps: Annotated[
        int | None, typer.Option(help="algorithm.local_steps of a method that has it")
    ] = None,
    out: Out = None,
    debug: Debug = False,
) -> None:
    """A method (CoBo by default) on the Ray engine vs the local engine: ms per round,
    coordination share, start-up time."""

    def go():
        from raycobo.bench import bench_ray

        _set_threads(threads)
        bench_ray(
            _int_list(clients, "--clients"),
            _int_list(per_actor, "--per-actor"),
            rounds,
            slow,
            staleness,
            out,
            echo=typer.echo,
            schedules=_choices(schedule, "--schedule", ("sync", "stale", "resident")),
            gpus_per_client=gpus_per_client,
            device=device,
            data_root=data_root,
            fraction=fraction,
            model=_choices(model, "--model", ("mlp", "cnn"))[0],
            threads=host_threads,
            algorithm=algorithm,
            local_steps=local_steps,
        )

    _guarded(debug, go)


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # e.g. `raycobo ... | head`
        sys.exit(0)


if __name__ == "__main__":
    main()
