"""What the commands share: the typer app, the argument types, and the helpers that
turn bad input into one line and a non-zero exit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from raycobo.config import ConfigError

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
    from raycobo.config import Config, PartitionConfig

    if name == "partition":
        parts = [("data.partition", PartitionConfig)]
    else:
        parts = [(name, Config.model_fields[name].annotation)]
    _print_settings(f"the {name} section", parts, skip=set())


def _print_settings(title: str, parts: list, skip: set[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    from raycobo.cli.reference import rows

    t = Table(title=title, title_justify="left")
    for col in ("key", "default", "range", "meaning"):
        t.add_column(col)
    for prefix, settings in parts:
        for r in rows(prefix, settings, frozenset(skip)):
            t.add_row(r.key, r.default, r.range, r.description)
    Console(width=120).print(t)
    raise typer.Exit(0)
