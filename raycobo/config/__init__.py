"""Typed, validated experiment configuration.

One pydantic section per concern (``raycobo.config.sections``). Configs come from YAML
files (``raycobo.config.files``: bounded, parsed, version-stamped) and are overridden by
dotted ``key.path=value`` arguments; unknown keys, wrong types and out-of-range values
raise :class:`ConfigError` with a one-line message naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from raycobo.algorithms import check_method_keys, method
from raycobo.algorithms.cobo import CoBoConfig
from raycobo.algorithms.settings import MethodConfig
from raycobo.config.files import (  # noqa: F401 - re-exported
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_VALUES,
    MAX_VALUE_CHARS,
    READS_FROM,
    WRITTEN_BY,
    check_expansion,
    check_written_by,
    flat_tree,
    parse_value,
    read_yaml,
    set_dotted,
    written_by,
)
from raycobo.config.sections import (  # noqa: F401 - re-exported
    DEFAULT_FASHION_MNIST_ROOT,
    CheckpointConfig,
    CompareConfig,
    DataConfig,
    EngineConfig,
    EveryKth,
    ModelConfig,
    PartitionConfig,
    ScheduleEvent,
    TrackingConfig,
    check_name,
    engine_keys,
    unread_engine_keys,
)
from raycobo.registry import add_search_paths
from raycobo.settings import ConfigError, choose, did_you_mean  # noqa: F401 - re-exported
from raycobo.settings import Section as _Section
from raycobo.version import __version__


class Config(_Section):
    name: str = Field(default="experiment", description="the run's name (its folder's)")
    seed: int = Field(default=0, description="every random draw follows from it")
    rounds: int = Field(default=100, ge=1, description="communication rounds")
    batch_size: int = Field(default=32, ge=1, description="minibatch size of each client")
    eval_every: int = Field(default=10, ge=1, description="rounds between evaluations")
    data: DataConfig = Field(default_factory=DataConfig, description="the data section")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the model section")
    algorithm: SerializeAsAny[MethodConfig] = Field(
        default_factory=CoBoConfig,
        description="one method's settings, chosen by algorithm.name (built-in or plugin)",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig, description="the engine")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow")
    compare: CompareConfig = Field(
        default_factory=CompareConfig, description="what raycobo compare runs"
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="checkpoints (resume)"
    )
    schedule: list[ScheduleEvent] = Field(
        default_factory=list,
        description="elastic clients: joins and leaves; a client whose first event is a "
        "join starts outside the system",
    )
    plugin_paths: list[str] = Field(
        default_factory=list,
        description="folders searched for plugin modules (besides the Python path and the "
        "current directory); relative to the YAML file that names them",
    )

    @field_validator("algorithm", mode="before")
    @classmethod
    def _method_settings(cls, value: Any) -> Any:
        """A mapping becomes its method's settings class (``validate`` checks the keys
        first, with one-line errors)."""
        if isinstance(value, dict):
            return method(value.get("name", "cobo")).settings.model_validate(value)
        return value

    @model_validator(mode="after")
    def _names(self) -> Config:
        check_name(self.name, "name")
        for label in self.compare.variants:
            check_name(label, "compare.variants")
        return self

    def checkpoint_rounds(self) -> EveryKth:
        """Completed-round counts after which a checkpoint is written (every k-th and
        the last; none when checkpoint.every is 0)."""
        every = self.checkpoint.every if self.checkpoint.every is not None else self.eval_every
        return EveryKth(every, self.rounds, first=False)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def initially_absent(self) -> list[int]:
        first: dict[int, str] = {}
        for ev in sorted(self.schedule, key=lambda e: e.round):
            for kind in ("leave", "join"):
                for c in getattr(ev, kind):
                    first.setdefault(c, kind)
        return sorted(c for c, kind in first.items() if kind == "join")

    def validation_fraction(self) -> float:
        """The held-out share of each client's training data (see DataConfig)."""
        if self.data.validation_fraction is not None:
            return self.data.validation_fraction
        return 0.2 if self.algorithm.uses_validation else 0.0

    def to_yaml(self) -> str:
        """The config as a stored ``config.yaml``: its first line names the version."""
        return f"{WRITTEN_BY}{__version__}\n" + yaml.safe_dump(self.to_dict(), sort_keys=False)

    def pinned(self) -> Config:
        """This config with the values its method chooses written out (a run's record:
        a later release's defaults cannot change a run on resume)."""
        return self.model_copy(update={"algorithm": self.algorithm.pinned()})


# ---------------------------------------------------------------------------------------
# loading and overrides


def _section_keys(path: list) -> list[str]:
    """The keys of the config section at ``path`` (names only; [] where a path element
    is not a section, e.g. the algorithm union, checked by the method's own settings)."""
    cls: Any = Config
    for part in path:
        field = cls.model_fields.get(str(part)) if isinstance(cls, type) else None
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        cls = ann
    return list(cls.model_fields)


def _format_error(err: ValidationError, prefix: list[str] | None = None) -> str:
    first = err.errors()[0]
    path = [*(prefix or []), *first["loc"]]
    # union members add tags such as 'constrained-int' or "literal['auto']" to the path
    loc = ".".join(str(p) for p in path if not any(c in str(p) for c in "-['("))
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        return f"unknown config key '{loc}'" + did_you_mean(loc, _section_keys(path[:-1]))
    if msg.startswith("Value error, unknown config key "):  # a section's extra keys
        return msg[len("Value error, ") :]
    if msg.startswith("Value error, "):
        # section validators start their message with the field they reject
        field, _, rest = msg[len("Value error, ") :].partition(":")
        if rest and " " not in field:
            return f"invalid config key '{loc + '.' if loc else ''}{field}':{rest}"
        msg = msg[len("Value error, ") :]
    got = first.get("input")
    got_s = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"invalid config key '{loc}': {msg}{got_s}"


def apply_overrides(tree: dict[str, Any], overrides: list[str] | dict[str, Any]) -> dict[str, Any]:
    """Dotted overrides, as ``key=value`` strings or a mapping of dotted keys, into a tree."""
    if isinstance(overrides, dict):
        return _set_all(tree, list(overrides.items()))
    pairs = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override '{item}' is not of the form key.path=value")
        pairs.append((key.strip(), parse_value(raw.strip(), key.strip())))
    return _set_all(tree, pairs)


def _set_all(tree: dict[str, Any], pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Set dotted keys. An ``algorithm.name`` that switches the method first drops the
    settings of the old method that the new one does not have (unless set here too, when
    validation refuses them): ``compare`` entries, sweeps over methods and
    ``algorithm.name=ditto`` on a CoBo config keep only what the methods share. An
    ``engine.kind`` that switches the engine drops the old engine's own keys the same
    way (``engine_keys``: ``engine.kind=local`` on a Ray config)."""
    given = {k for k, _ in pairs}
    new = next((v for k, v in reversed(pairs) if k == "algorithm.name"), None)
    # a plugin named here is looked up now: the config's plugin_paths (or one set in
    # these overrides) must be searched already
    paths = next((v for k, v in reversed(pairs) if k == "plugin_paths"), None)
    _search(tree.get("plugin_paths") if paths is None else paths)
    section = tree.get("algorithm")
    switch = isinstance(section, dict) and section.get("name", "cobo") != new
    if isinstance(new, str) and switch:
        keep = method(new).settings.model_fields
        for key in [k for k in section if k not in keep and f"algorithm.{k}" not in given]:
            del section[key]
    engine = tree.get("engine")
    kind = next((v for k, v in reversed(pairs) if k == "engine.kind"), None)
    if isinstance(engine, dict) and kind is not None and engine.get("kind", "local") != kind:
        for key in engine_keys(engine.get("kind", "local")):  # the old engine's own
            if f"engine.{key}" not in given:
                engine.pop(key, None)
    for key, value in pairs:
        set_dotted(tree, key, value)
    return tree


def _search(plugin_paths: Any) -> None:
    """A config's plugin_paths on the Python path (a value that is no list is left to
    validation to refuse)."""
    if isinstance(plugin_paths, list):
        add_search_paths([str(p) for p in plugin_paths])


def validate(tree: dict[str, Any]) -> Config:
    check_expansion(tree, "the config")  # a mapping from the API is bounded like a file
    _search(tree.get("plugin_paths"))
    section = tree.get("algorithm")
    if isinstance(section, dict):
        section.setdefault("name", "cobo")  # the default method chooses the settings
        settings = check_method_keys(section)
        try:
            tree = {**tree, "algorithm": settings.model_validate(section)}
        except ValidationError as err:
            raise ConfigError(_format_error(err, ["algorithm"])) from None
    try:
        return Config.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None


def load_stored_config(path: str | Path) -> Config:
    """A config that raycobo wrote (a run's, comparison's or sweep's ``config.yaml``),
    refused in one line where a version whose settings this one cannot read wrote it
    (``check_written_by``)."""
    path = Path(path)
    check_written_by(path)
    return validate(read_yaml(path))


def read_config_tree(path: str | Path) -> dict[str, Any]:
    """An experiment YAML as a tree, its ``plugin_paths`` made absolute from its folder."""
    tree = read_yaml(path)
    paths = tree.get("plugin_paths")
    if isinstance(paths, list):
        base = Path(path).resolve().parent
        tree["plugin_paths"] = [str((base / str(p)).resolve()) for p in paths]
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load YAML (or defaults when ``path`` is None), apply dotted overrides, validate."""
    tree = read_config_tree(path) if path is not None else {}
    apply_overrides(tree, list(overrides or []))
    return validate(tree)


def with_overrides(cfg: Config, overrides: dict[str, Any] | list[str]) -> Config:
    """A copy of ``cfg`` with dotted overrides applied (dict of key->value or key=value list)."""
    return validate(apply_overrides(cfg.to_dict(), overrides))
