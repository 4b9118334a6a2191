"""What every configuration section shares, below both ``raycobo.config`` and the
algorithms (which define their own settings classes): the user-facing error, the strict
section base and the registry lookup."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A user-facing configuration problem; the message is one line naming the key/file."""


class Section(BaseModel):
    """A config section: unknown keys are errors, assignments are validated, and numbers
    must be finite (``inf`` and ``nan`` are bad input everywhere)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def did_you_mean(key: str, known: list[str]) -> str:
    """'; did you mean 'a.b'?' for a misspelled last part of a dotted key (or '')."""
    import difflib

    head, _, last = key.rpartition(".")
    close = difflib.get_close_matches(last, known, n=1, cutoff=0.7)
    return f"; did you mean '{head + '.' if head else ''}{close[0]}'?" if close else ""


def choose(
    registry: dict[str, Any], name: str, key: str, what: str, known: list[str] | None = None
):
    """``registry[name]``, or a ConfigError naming ``key`` and the known names."""
    try:
        return registry[name]
    except KeyError:
        names = ", ".join(known if known is not None else sorted(registry))
        raise ConfigError(
            f"invalid config key '{key}': unknown {what} '{name}' (choose from {names})"
        ) from None
