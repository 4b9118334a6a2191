"""Config files and values: bounds checked before anything is parsed, the YAML reader,
dotted keys, and the version line of the configs raycobo writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from raycobo.settings import ConfigError
from raycobo.version import __version__

# values a config may expand to: YAML aliases are shared when loaded, but copied when the
# config is validated and written (a 'billion laughs' of aliases in data.options grew
# past 3 GB inside Config.to_yaml); real configs hold a few hundred
MAX_CONFIG_VALUES = 100_000
# bounds checked before anything is parsed or copied: a config file (a run's, a
# comparison's or a sweep's, written by hand: a few KB), one value (a path, a list of
# seeds) and the nesting (a few levels): far above any real config, far below what takes
# minutes to parse or overflows the parser's stack
MAX_CONFIG_BYTES = 1 << 20
MAX_VALUE_CHARS = 1 << 16
MAX_CONFIG_DEPTH = 64


def check_expansion(tree: Any, where: str) -> None:
    """Refuse a parsed tree that expands (aliases counted at every use, cycles included)
    to more than MAX_CONFIG_VALUES values, nests deeper than MAX_CONFIG_DEPTH or holds a
    string (a value or a key) over MAX_VALUE_CHARS, in O(MAX_CONFIG_VALUES) steps."""
    stack, seen = [(tree, "", 0)], 0
    while stack:
        node, key, depth = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"{where}: the YAML expands to more than {MAX_CONFIG_VALUES:,} values "
                "(aliases repeated or nested?); refusing it"
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(
                f"{where}: nested deeper than {MAX_CONFIG_DEPTH} levels (under '{key[:80]}'); "
                "refusing it"
            )
        if isinstance(node, dict):
            for k, v in node.items():
                child = f"{key}.{k}" if key else str(k)
                _check_length(k, child, where)
                stack.append((v, child, depth + 1))
        elif isinstance(node, list):
            stack.extend((v, f"{key}[{i}]", depth + 1) for i, v in enumerate(node))
        else:
            _check_length(node, key, where)


def _check_length(value: Any, key: str, where: str) -> None:
    if isinstance(value, str | bytes) and len(value) > MAX_VALUE_CHARS:
        raise ConfigError(
            f"invalid config key '{key[:120] or '(top level)'}' in {where}: a value of "
            f"{len(value):,} characters (at most {MAX_VALUE_CHARS:,}); refusing it"
        )


def parse_value(text: str, key: str = "") -> Any:
    """Parse an override's value with YAML rules (``0.1`` -> float, ``[1,2]`` -> list)."""
    where = f"override {key or 'value'}"
    _check_length(text, key, "an override")
    try:
        value = yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text
    except RecursionError:
        raise ConfigError(f"{where}: nested deeper than YAML can be read; refusing it") from None
    check_expansion(value, f"override value '{text[:40]}'")
    if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string; users mean a number
        try:
            return float(value)
        except ValueError:
            return value
    return value


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"bad override key '{dotted}'")
    node = tree
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        elif not isinstance(nxt, dict):
            raise ConfigError(f"cannot override '{dotted}': '{p}' is not a section")
        node = nxt
    node[parts[-1]] = value


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file as a tree: a regular file of at most MAX_CONFIG_BYTES, checked
    before it is read, and a tree within the bounds of :func:`check_expansion`."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"cannot read {p}: {err.strerror or err}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{p} is {p.stat().st_size / 2**20:,.1f} MiB; a config file is at most "
            f"{MAX_CONFIG_BYTES >> 20} MiB (refused before parsing)"
        )
    try:
        tree = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"cannot parse {p}: not UTF-8 text (byte {err.start})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"cannot parse YAML in {p}{where}") from None
    except RecursionError:
        raise ConfigError(
            f"cannot parse YAML in {p}: nested deeper than YAML can be read"
        ) from None
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{p}: top level must be a mapping of config keys")
    check_expansion(tree, str(p))
    return tree


# stored configs start with this line (``Config.to_yaml``); this version reads those that
# versions from READS_FROM on wrote (0.8.0: CoBo's fade, recheck and closure are gone,
# folded into pull_threshold)
WRITTEN_BY = "# written by raycobo "
READS_FROM = "0.8.0"


def _release(version: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in version.split("+")[0].split(".")[:3])
    except ValueError:
        return None


def written_by(path: Path) -> str | None:
    """The version a stored config names on its first line (None: none, as before 0.3.0)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline(200)
    return first[len(WRITTEN_BY) :].strip() or None if first.startswith(WRITTEN_BY) else None


def check_written_by(path: Path) -> None:
    """Refuse a stored config written by a version before ``READS_FROM`` (or after this
    one): one line naming both versions and what to do."""
    wrote = written_by(path)
    if wrote is None:  # the run's own summary may say which one it was
        wrote = _summary_version(path.parent) or "before 0.3.0"
    have = _release(wrote)
    if have is not None and _release(READS_FROM) <= have <= _release(__version__):
        return
    reads = READS_FROM if __version__ == READS_FROM else f"{READS_FROM} to {__version__}"
    raise ConfigError(
        f"{path}: written by raycobo {wrote}, and this is raycobo {__version__}, which reads "
        f"the configs of raycobo {reads}: finish it with the version that wrote it, or start "
        "it anew"
    )


def _summary_version(directory: Path) -> str | None:

    try:
        summary = json.loads((directory / "summary.json").read_text())
        return str(summary["provenance"]["raycobo_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def flat_tree(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config tree as dotted keys -> values (an empty mapping is a value)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_tree(value, f"{name}."))
        else:
            out[name] = value
    return out
