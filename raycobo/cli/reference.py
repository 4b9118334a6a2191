"""The reference, read off the code: every config key with its type, default, range and
description from the settings classes, and every command's help from the Typer app.
``run --help-config`` prints one section's rows and the docs site writes a page per
section from them (``docs/gen_reference.py``), so neither can drift from the code."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo

_BOUNDS = ((at.Ge, ">="), (at.Gt, ">"), (at.Le, "<="), (at.Lt, "<"))


@dataclass(frozen=True)
class Row:
    key: str  # dotted, as a YAML path or an override names it
    type: str
    default: str
    range: str
    description: str


@dataclass(frozen=True)
class Page:
    slug: str  # the docs page's file name
    title: str
    about: str
    parts: tuple[tuple[str, type[BaseModel]], ...]  # (key prefix, settings class)
    skip: frozenset[str] = frozenset()


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it in YAML: ``int | null``, ``'a' | 'b'``."""
    if annotation is type(None):
        return "null"
    origin = get_origin(annotation)
    if origin is Annotated:
        return type_name(get_args(annotation)[0])
    if origin is Literal:
        return " | ".join(repr(a) if isinstance(a, str) else str(a) for a in get_args(annotation))
    if origin in (Union, UnionType):
        return " | ".join(type_name(a) for a in get_args(annotation))
    if origin in (list, tuple, set):
        args = get_args(annotation)
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin is dict:
        args = get_args(annotation)
        return f"map[{type_name(args[0])}, {type_name(args[1])}]" if args else "map"
    if annotation is Any:
        return "any"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(metadata: list) -> list[str]:
    return [
        f"{sign} {getattr(m, cls.__name__.lower())}"
        for m in metadata
        for cls, sign in _BOUNDS
        if isinstance(m, cls)
    ]


def range_of(field: FieldInfo) -> str:
    """The field's numeric bounds (also those inside an ``Annotated`` member of a union)."""
    found = _bounds(field.metadata)
    for arg in get_args(field.annotation):
        if get_origin(arg) is Annotated:
            found += _bounds(list(get_args(arg)[1:]))
            for inner in get_args(arg)[1:]:
                if isinstance(inner, FieldInfo):
                    found += _bounds(inner.metadata)
    return ", ".join(found)


def default_of(field: FieldInfo) -> str:
    if field.is_required():
        return "(required)"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def sections_in(annotation: Any) -> list[type[BaseModel]]:
    """The settings classes a field holds (itself, a list's items, a union's members)."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [c for a in get_args(annotation) for c in sections_in(a)]


def rows(prefix: str, settings: type[BaseModel], skip: frozenset[str] = frozenset()) -> list[Row]:
    """One row per key of ``settings`` under ``prefix``, a nested section's keys after
    it (``schedule[].round``: the items of a list)."""
    out = []
    for key, field in settings.model_fields.items():
        if key in skip:
            continue
        name = f"{prefix}.{key}" if prefix else key
        out.append(
            Row(
                name,
                type_name(field.annotation),
                default_of(field),
                range_of(field),
                field.description or "",
            )
        )
        is_list = get_origin(field.annotation) is list
        for inner in sections_in(field.annotation):
            out += rows(f"{name}[]" if is_list else name, inner)
    return out


def pages() -> list[Page]:
    """The reference's pages: the run's own keys, each config section, each built-in
    method's settings, each engine's own and the sweep files'."""
    from raycobo.algorithms import METHODS
    from raycobo.config import Config
    from raycobo.registry import ENGINES
    from raycobo.tune.space import SweepSpec

    fields = Config.model_fields
    top = frozenset(k for k, f in fields.items() if sections_in(f.annotation) and k != "schedule")
    out = [
        Page("run", "The run", "The keys at the top of an experiment YAML.", (("", Config),), top),
        Page(
            "data",
            "data",
            "What the clients' data is and how it is split among them.",
            (("data", fields["data"].annotation),),
        ),
    ]
    for name, about in (
        ("model", "The network every client trains (one architecture, personal weights)."),
        ("engine", "Where and how rounds run: this process (local, loop) or Ray actors."),
        ("tracking", "MLflow tracking."),
        ("checkpoint", "Checkpoints, which resume and extension read."),
        ("compare", "What `raycobo compare` runs from one YAML."),
    ):
        out.append(Page(name, name, about, ((name, fields[name].annotation),)))
    for kind, spec in ENGINES.builtin.items():
        if spec.settings is not None:
            out.append(
                Page(f"engine-{kind}", f"engine: {kind}", spec.about, (("engine", spec.settings),))
            )
    for name, m in METHODS.items():
        doc = " ".join((m.settings.__doc__ or name).strip().split("\n\n")[0].split())
        out.append(
            Page(f"algorithm-{name}", f"algorithm: {name}", doc, (("algorithm", m.settings),))
        )
    out.append(Page("sweep", "Sweep files", (SweepSpec.__doc__ or "").strip(), (("", SweepSpec),)))
    return out


def page_rows(page: Page) -> list[Row]:
    return [r for prefix, cls in page.parts for r in rows(prefix, cls, page.skip)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(page: Page) -> str:
    """A page of the reference: a table of its keys."""
    lines = [
        f"# {page.title}",
        "",
        page.about,
        "",
        "| key | type | default | range | meaning |",
        "|---|---|---|---|---|",
    ]
    for r in page_rows(page):
        cells = (f"`{r.key}`", f"`{r.type}`", f"`{r.default}`", r.range, r.description)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def index_markdown() -> str:
    """The reference's first page: what a key is, and a link to each section's page."""
    lines = [
        "# Config reference",
        "",
        "Every key of an experiment YAML, generated from the settings classes (the same "
        "source `raycobo run --help-config SECTION` prints). A key is a dotted path: "
        "`algorithm.rho: 0.5` in the YAML is `algorithm.rho=0.5` on the command line. "
        "Unknown keys, wrong types and values out of range stop the run with one line "
        "naming the key; so does a key the chosen method or engine would not read.",
        "",
        "| page | what |",
        "|---|---|",
    ]
    for page in pages():
        lines.append(f"| [{page.title}]({page.slug}.md) | {_cell(page.about)} |")
    return "\n".join(lines) + "\n"


def cli_markdown(app) -> str:
    """The CLI reference: every command's ``--help``, from the Typer app itself."""
    import os

    import typer
    from typer.testing import CliRunner

    lines = ["# Command line", "", "Every command's `--help`, generated from the CLI.", ""]
    runner = CliRunner()
    env = {"COLUMNS": "100", "TERMINAL_WIDTH": "100", "NO_COLOR": "1", **os.environ}

    def walk(command, path: list[str]) -> None:
        shown = runner.invoke(app, [*path, "--help"], env=env, color=False, prog_name="raycobo")
        lines.extend([f"## raycobo {' '.join(path)}".rstrip(), "", "```text"])
        lines.extend(ln.rstrip() for ln in shown.output.strip("\n").splitlines())
        lines.extend(["```", ""])
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return "\n".join(lines)
