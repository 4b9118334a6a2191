"""Tuning a compared method the way the papers tune their baselines: a sweep over its
main knob scored on *validation* data (each client's held-out part; the test split is
never looked at), whose best finished trial's values the comparison then runs with
(``raycobo compare CONFIG --tune ditto=tune_spaces/tune_ditto.yaml``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raycobo.config import Config, ConfigError
from raycobo.tune.space import check_space, read_spec, tuning_base

__all__ = ["check_entry", "tune_entry", "tuning_base"]


def check_entry(cfg: Config, space: Path) -> None:
    """The space's keys, values and metric against the entry's config (nothing runs)."""
    check_space(read_spec(Path(space)), tuning_base(cfg), Path(space))


def tune_entry(cfg: Config, space: Path, out: Path) -> dict[str, Any]:
    """Sweep ``space`` (its ``base`` is ignored: the entry's config is the base) on
    validation data into ``out``. -> the best finished trial's sampled values"""
    from raycobo.tune.sweep import run_sweep

    spec = read_spec(Path(space))
    base = tuning_base(cfg)
    check_space(spec, base, Path(space))
    summary = run_sweep(spec, base, out, final=False)  # the comparison runs the pick
    if summary["best"] is None:
        raise ConfigError(
            f"tuning with {space} found no finished trial with {spec.metric}; see "
            f"{out / 'sweep_summary.json'}"
        )
    return dict(summary["best"]["config"])
