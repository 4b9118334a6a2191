"""The documentation: the config reference is generated from the settings classes (a key
added in code appears with no hand edit), the site's navigation names pages that exist,
the README stays short and links into the docs, and every `raycobo run|compare|sweep`
command the docs and the README show loads its config with its overrides."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from pydantic import Field

from raycobo.cli.reference import index_markdown, markdown, page_rows, pages, rows

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _all_keys() -> set[str]:
    """Every dotted key of every settings class the reference covers, walked here
    independently of the reference's own walk (the built-ins' fields by name)."""
    from pydantic import BaseModel

    from raycobo.algorithms import METHODS
    from raycobo.cli.reference import sections_in
    from raycobo.config import Config
    from raycobo.tune.space import SweepSpec

    keys: set[str] = set()

    def walk(prefix: str, cls: type[BaseModel]) -> None:
        for key, field in cls.model_fields.items():
            name = f"{prefix}.{key}" if prefix else key
            keys.add(name)
            list_of = getattr(field.annotation, "__origin__", None) is list
            for inner in sections_in(field.annotation):
                walk(f"{name}[]" if list_of else name, inner)

    walk("", Config)
    for m in METHODS.values():
        walk("algorithm", m.settings)
    walk("sweep", SweepSpec)
    # the section keys themselves are pages, not rows; the sweep file's keys are its own
    sections = {k for k, f in Config.model_fields.items() if sections_in(f.annotation)}
    return {k.removeprefix("sweep.") for k in keys if k not in sections - {"schedule"}}


def test_every_settings_key_is_on_a_reference_page():
    documented = {r.key for page in pages() for r in page_rows(page)}
    missing = _all_keys() - documented
    assert not missing, f"keys the generated reference lacks: {sorted(missing)}"
    text = "".join(markdown(p) for p in pages())
    assert "`algorithm.rho`" in text and "`data.partition.alpha`" in text
    assert "`engine.staleness`" in text and "`scheduler.grace_period`" in text
    for page in pages():
        assert f"({page.slug}.md)" in index_markdown()


def test_every_key_has_a_description():
    """A key without a description would be a bare name in the reference and in
    --help-config: every key a user sets says what it does (the method's name aside)."""
    bare = [r.key for p in pages() for r in page_rows(p) if not r.description]
    assert set(bare) == {"algorithm.name"}, bare


def test_a_key_added_in_code_appears_with_no_hand_edit(monkeypatch):
    """A new method's settings class with a new key: the reference has its page and the
    key's row with type, default, range and description, from the class alone."""
    from raycobo.algorithms import METHODS, Method
    from raycobo.algorithms.ditto import Ditto, DittoConfig

    class Wider(DittoConfig):
        """Ditto with a made-up key, for this test."""

        spread: float = Field(default=0.25, ge=0, le=1, description="a made-up share")

    monkeypatch.setitem(METHODS, "wider", Method(Ditto, Wider))
    page = next(p for p in pages() if p.slug == "algorithm-wider")
    row = next(r for r in page_rows(page) if r.key == "algorithm.spread")
    assert (row.type, row.default, row.range, row.description) == (
        "float", "0.25", ">= 0, <= 1", "a made-up share",
    )  # fmt: skip
    assert "| `algorithm.spread` | `float` | `0.25` | >= 0, <= 1 | a made-up share |" in (
        markdown(page)
    )
    assert [r.key for r in rows("x", Wider)][-1] == "x.spread"


def _nav_files(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [f for item in node for f in _nav_files(item)]
    return [f for value in node.values() for f in _nav_files(value)]


def test_the_nav_names_pages_that_exist_or_are_generated():
    site = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    generated = {"reference/config/index.md", "reference/cli.md", "explanation/fidelity.md"}
    files = _nav_files(site["nav"])
    missing = [f for f in files if f not in generated and not (DOCS / f).is_file()]
    assert not missing and len(files) > 20, missing
    pages_on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages_on_disk <= set(files), sorted(pages_on_disk - set(files))


def test_the_readme_is_short_and_its_links_resolve():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\(((?!https?://)[^)#]+)", readme)
    assert len(links) > 15
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, missing
    for question in ("algorithm.rho", "ray up", "plugins/fedprox", "preset: paper"):
        assert question in readme, question


def _shown_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) for every `raycobo run|compare|sweep` line in a code block or an
    inline code span of the README and the docs pages."""
    found = []
    for path in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = path.read_text()
        blocks = re.findall(r"```(?:bash|text|)\n(.*?)```", text, re.S)
        spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
        for block in [*blocks, *spans]:
            for line in block.splitlines():
                line = line.split(" #")[0].strip()
                m = re.search(r"(?:^|\s)(?:\.venv/bin/)?raycobo (run|compare|sweep) (.*)", line)
                if m and "--resume" not in line and "|" not in line:
                    found.append((path.name, [m.group(1), *shlex.split(m.group(2))]))
    return found


def test_the_commands_the_docs_show_load_their_configs():
    """Each shown command's config file exists and validates with its overrides, so a
    renamed key or a moved example breaks this test, not a reader's first try (commands
    with placeholders such as CONFIG.yaml are the usage lines, skipped)."""
    from raycobo.config import load_config
    from raycobo.tune.space import load_sweep

    checked = 0
    for where, argv in _shown_commands():
        verb, args = argv[0], argv[1:]
        positional = [a for a in args if not a.startswith("-")]
        if not positional or not positional[0].endswith(".yaml") or positional[0].isupper():
            continue
        config = positional[0]
        if re.search(r"[A-Z]{3,}", config) or not (REPO / config).exists():
            assert re.search(r"[A-Z]{3,}|^raycobo/", config), f"{where}: no file {config}"
            continue
        overrides = [a for a in positional[1:] if "=" in a]
        try:
            if verb == "sweep":
                load_sweep(REPO / config, overrides)
            else:
                load_config(str(REPO / config), overrides)
        except Exception as err:  # noqa: BLE001 - the message names the command
            pytest.fail(f"{where}: raycobo {' '.join(argv)}: {err}")
        checked += 1
    assert checked >= 10, checked


def test_the_cli_reference_has_every_command():
    from raycobo.cli import app
    from raycobo.cli.reference import cli_markdown

    text = cli_markdown(app)
    for command in ("run", "compare", "sweep", "demo", "bench engine", "bench scaling"):
        assert f"## raycobo {command}\n" in text, command
    assert "Usage: raycobo run" in text and "--help-config" in text
