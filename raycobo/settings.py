"""What every configuration section shares, below both ``raycobo.config`` and the
algorithms (which define their own settings classes): the user-facing error, the strict
section base and the registry lookup."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class ConfigError(ValueError):
    """A user-facing configuration problem; the message is one line naming the key/file."""


def _takes_bool(annotation: Any) -> bool:
    """Whether a field of this type has a use for true/false (a number does not)."""
    if annotation is bool or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return any(isinstance(a, bool) for a in get_args(annotation))
    if origin in (Union, UnionType, Annotated):
        return any(_takes_bool(a) for a in get_args(annotation))
    return origin is not None  # containers: their items are checked where they are typed


class Section(BaseModel):
    """A config section: unknown keys are errors, assignments are validated, numbers
    must be finite (``inf`` and ``nan`` are bad input everywhere) and are never true or
    false (``rounds: true`` would otherwise run one round)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not _takes_bool(field.annotation):
                raise ValueError(f"expected a number, not {str(value).lower()}")
        return value


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
