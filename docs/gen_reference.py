"""Writes the generated pages while `mkdocs build` runs (mkdocs-gen-files): a
page per config section and method from the settings classes (raycobo.cli.reference,
the source `raycobo run --help-config` reads), and the CLI's help from the Typer app."""

from __future__ import annotations

import re
from pathlib import Path

import mkdocs_gen_files

from raycobo.cli import app
from raycobo.cli.reference import cli_markdown, index_markdown, markdown, pages

for page in pages():
    with mkdocs_gen_files.open(f"reference/config/{page.slug}.md", "w") as f:
        f.write(markdown(page))
with mkdocs_gen_files.open("reference/config/index.md", "w") as f:
    f.write(index_markdown())
with mkdocs_gen_files.open("reference/cli.md", "w") as f:
    f.write(cli_markdown(app))

# FIDELITY.md (written by `make fidelity` and `make regimes`) as a page of the site, its
# plots beside it
ROOT = Path(__file__).resolve().parents[1]
fidelity = (ROOT / "FIDELITY.md").read_text()
for image in re.findall(r"\]\((benchmarks/[^)]+\.png)\)", fidelity):
    with mkdocs_gen_files.open(f"images/{Path(image).name}", "wb") as f:
        f.write((ROOT / image).read_bytes())
    fidelity = fidelity.replace(f"]({image})", f"](../images/{Path(image).name})")
# links into the site from the repository root (docs/X) as the page sees them
fidelity = fidelity.replace("](docs/", "](../")
with mkdocs_gen_files.open("explanation/fidelity.md", "w") as f:
    f.write(fidelity)
