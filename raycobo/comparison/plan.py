"""A comparison's plan: entries x seeds -> one job per run, each with its config and run
directory; on ``--resume``, the finished runs read back instead of run again."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from raycobo.config import Config, ConfigError, check_name, with_overrides
from raycobo.lifecycle import Result
from raycobo.lifecycle.files import fresh_dir
from raycobo.lifecycle.run_dir import read_summary


@dataclass(frozen=True)
class Job:
    entry: str
    seed: int
    cfg: Config
    run_dir: Path
    again: bool  # continue a started run from its checkpoint (resume)

    @property
    def label(self) -> str:
        return f"{self.entry} seed {self.seed}"


@dataclass
class Plan:
    root: Path
    entries: list[str]
    seeds: list[int]
    configs: dict[tuple[str, int], Config]
    jobs: list[Job] = field(default_factory=list)  # to run
    done: dict[tuple[str, int], Result] = field(default_factory=dict)  # finished before


def entry_config(cfg: Config, entry: str, seed: int | None = None) -> Config:
    """The config of one compared entry: a variant's overrides, or ``algorithm.name`` set
    with ``compare.overrides[name]`` applied; then the seed."""
    if entry in cfg.compare.variants:
        extra = dict(cfg.compare.variants[entry])
    else:
        extra = {"algorithm.name": entry, **cfg.compare.overrides.get(entry, {})}
    if seed is not None:
        extra["seed"] = seed
    return with_overrides(cfg, extra)


def check_entry(entry: str) -> None:
    """An entry becomes a folder under the comparison: a plain name only."""
    try:
        check_name(entry, "compare entry")
    except ValueError as err:
        raise ConfigError(f"invalid {err}") from None


def check_overrides(cfg: Config, entries: list[str]) -> None:
    """``compare.overrides`` are keyed by method: a key that is neither a compared entry
    nor a method (a typo such as ``cobbo``) would be silently ignored, so it is refused."""
    from raycobo.algorithms import method_names

    known = set(entries) | set(method_names())
    for key in cfg.compare.overrides:
        if key not in known:
            raise ConfigError(
                f"invalid config key 'compare.overrides.{key}': '{key}' is neither a compared "
                f"entry ({', '.join(entries)}) nor a method"
            )


def entry_folder(root: Path, entry: str) -> Path:
    """An entry's folder: its name with what a file name should not hold (a plugin's
    ``module:Class``, slashes) as '_'; a comparison written before keeps its folders."""
    import re

    if ":" in entry and (root / entry).is_dir():
        return root / entry
    return root / re.sub(r"[^A-Za-z0-9._-]", "_", entry)


def default_root(cfg: Config, root: Path = Path("runs")) -> Path:
    """A new folder ``runs/<time>-<name>-compare`` (made unique if two start at once)."""
    return fresh_dir(root / f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.name}-compare")


def check_new_root(root: Path) -> None:
    """A new comparison goes into a new or empty folder: one holding files (the user's, or
    an earlier comparison, which ``--resume`` continues) is not written over."""
    try:
        names = sorted(p.name for p in Path(root).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as err:
        raise ConfigError(f"compare: cannot read --out {root}: {err.strerror or err}") from None
    if names:
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        resume = (
            f"; continue that comparison with: raycobo compare --resume {root}"
            if "config.yaml" in names
            else ""
        )
        raise ConfigError(
            f"compare: --out {root} is not empty ({shown}); choose a new or empty folder{resume}"
        )


def make_plan(
    cfg: Config, entries: list[str], out: Path | None, seeds: list[int] | None, resume: bool
) -> Plan:
    """Validate every entry's config first (nothing runs on a bad one), then the jobs."""
    if not entries:
        raise ConfigError("no algorithms to compare: pass --algorithms or set compare.algorithms")
    for e in entries:
        check_entry(e)
    check_overrides(cfg, entries)
    seeds = seeds or cfg.compare.seeds or [cfg.seed]
    for what, items in (("algorithm", entries), ("seed", seeds)):
        twice = sorted({str(x) for x in items if list(items).count(x) > 1})
        if twice:  # two entries would write one folder: refused before anything runs
            raise ConfigError(f"compare: {what} {', '.join(twice)} given twice")
    configs = {(e, s): entry_config(cfg, e, s) for e in entries for s in seeds}
    if resume and (out is None or not (out / "config.yaml").is_file()):
        raise ConfigError(f"nothing to resume in {out}: no comparison config.yaml there")
    root = out if out is not None else default_root(cfg)
    folders = {e: entry_folder(root, e) for e in entries}
    shared = sorted({f.name for f in folders.values() if list(folders.values()).count(f) > 1})
    if shared:
        raise ConfigError(
            f"compare: entries {', '.join(entries)} would share the folder(s) "
            f"{', '.join(shared)}; rename a variant"
        )
    root.mkdir(parents=True, exist_ok=True)
    plan = Plan(root, entries, seeds, configs)
    for e in entries:
        for s in seeds:
            d = folders[e] / f"seed{s}" if len(seeds) > 1 else folders[e]
            old = read_summary(d) if resume else None
            if old is not None and old.get("status") == "completed":
                plan.done[(e, s)] = Result(d, old)
            else:
                again = resume and (d / "config.yaml").is_file()
                plan.jobs.append(Job(e, s, configs[(e, s)], d, again))
    return plan
