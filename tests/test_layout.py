"""The house rules docs/explanation/architecture.md states, checked on the source: imports
point downward only, rooms stay small, one mode is one object."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "raycobo"

# lower ranks first; a module may import its own rank and below (lazy imports included)
RANKS = {
    "settings": 0,
    "version": 0,
    "rng": 0,
    "state": 0,
    "plots": 0,
    "registry": 0,
    "algorithms": 1,
    "config": 2,
    "data": 3,
    "models": 3,
    "engine": 4,
    "lifecycle": 5,
    "tracking": 6,
    "comparison": 7,
    "tune": 7,
    "bench": 7,
    "api": 8,
    "__init__": 8,
    "cli": 9,
    "__main__": 10,
}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        yield path, rel.parts[0].removesuffix(".py"), ast.parse(path.read_text())


def _is_module(dotted: str) -> bool:
    path = PKG.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The import nodes under ``if TYPE_CHECKING:`` (never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def _imported(tree: ast.AST) -> list[str]:
    """The package's modules a module imports (lazy imports included): a name imported
    from a package is that submodule where there is one, else the package itself
    (``from raycobo import __version__`` imports the package's ``__init__``)."""
    out = []
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.append(full if _is_module(full) else node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return [
        m if m != "raycobo" else "raycobo.__init__" for m in out if m.split(".")[0] == "raycobo"
    ]


def test_imports_point_downward():
    wrong = []
    for path, top, tree in _modules():
        for mod in _imported(tree):
            target = mod.split(".")[1]
            if target in RANKS and RANKS[target] > RANKS[top]:
                wrong.append(f"{path.relative_to(PKG)} imports {mod}")
    assert not wrong, "\n".join(wrong)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycles():
    """No two modules import each other, directly or around a loop, lazily or not (a
    package's ``__init__`` counts as the package): what one needs from the other belongs
    below both."""
    graph: dict[str, set[str]] = {}
    for path, _, tree in _modules():
        me = _module_name(path)
        seen = {m.removesuffix(".__init__") for m in _imported(tree)}
        graph[me] = {m for m in seen if m != me and _is_module(m)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                loops.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not loops, "\n".join(" <-> ".join(p) for p in loops)


def test_no_function_over_60_lines():
    """Every function of the package (the CLI and the benchmarks too: #34 item 6)."""
    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(PKG)}:{node.lineno} {node.name} ({lines})")
    assert not long, "\n".join(long)


def test_engine_modes_are_objects_not_flags():
    """The Ray engine's round schedule is resolved once (the driver's session: hosts,
    then the coordinator's policy from the same object), not tested per call."""
    text = "\n".join(p.read_text() for p in (PKG / "engine").rglob("*.py"))
    assert "if self.resident" not in text and "e.resident" not in text
    calls = [
        p.relative_to(PKG).as_posix()
        for p in (PKG / "engine").rglob("*.py")
        for _ in range(p.read_text().count("schedule_for("))
    ]
    assert sorted(calls) == ["engine/ray/policies.py", "engine/ray/session.py"]
    assert "hasattr(" not in text and "__wrapped__" not in text


def test_engines_look_up_no_capability_by_name():
    """An engine asks what a method (or its row step) can do through the protocols of
    raycobo.algorithms.base (isinstance), never by probing for an attribute: no
    ``getattr(obj, name, default)`` in raycobo/engine but on an exception (Ray's wrapped
    ``cause``)."""
    probes = []
    for path in (PKG / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) == 3
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "err")
            ):
                probes.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert not probes, probes


def test_no_module_shadows_a_name_of_the_api():
    """`import raycobo.x` sets the attribute `raycobo.x` to the module: a subpackage
    named like an API function (run, compare, ...) would replace the function."""
    import raycobo

    modules = {p.stem for p in PKG.glob("*.py")} | {p.name for p in PKG.iterdir() if p.is_dir()}
    assert not set(raycobo.__all__) & modules
    import raycobo.cli  # noqa: F401 - imports the whole package tree

    assert callable(raycobo.run) and callable(raycobo.compare) and callable(raycobo.sweep)


def test_ray_internals_are_used_in_one_function_that_says_why():
    """Public Ray APIs everywhere else (#34 item 5): every `ray._private` reference of the
    package sits inside engine/ray/layout.py's `_ray_private`, whose docstring says why."""
    outside = []
    for path, _, tree in _modules():
        inside = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "_ray_private":
                assert ast.get_docstring(node) and "why" in ast.get_docstring(node)
                inside |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            mod = node.module if isinstance(node, ast.ImportFrom) else None
            attr = isinstance(node, ast.Attribute) and node.attr == "_private"
            if (attr or (mod or "").startswith("ray._private")) and id(node) not in inside:
                outside.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert not outside, outside
