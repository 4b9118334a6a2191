"""Typed, validated experiment configuration.

One pydantic section per concern. Configs come from YAML files and are overridden by
dotted ``key.path=value`` arguments; unknown keys, wrong types and out-of-range values
raise :class:`ConfigError` with a one-line message naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from raycobo.algorithms import check_method_keys, method
from raycobo.algorithms.cobo import CoBoConfig
from raycobo.algorithms.settings import MethodConfig
from raycobo.registry import ENGINES, add_search_paths, engine
from raycobo.settings import ConfigError, choose, did_you_mean  # noqa: F401 - re-exported
from raycobo.settings import Section as _Section
from raycobo.version import __version__

DEFAULT_FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"


class PartitionConfig(_Section):
    kind: str = Field(
        default="label_permutation",
        description="label_permutation, disjoint_classes, label_groups, shards or dirichlet",
    )
    clients_per_cluster: int | list[int] = Field(
        default=2, description="clients of every cluster (a list: uneven cluster sizes)"
    )
    num_clusters: int = Field(default=4, ge=1, description="clusters (with an int above)")
    alpha: float = Field(default=0.5, gt=0, description="dirichlet: the concentration")
    classes_per_group: int | None = Field(
        default=None, ge=1, description="label_groups: classes of a cluster (null: C / K)"
    )
    shards_per_class: int = Field(default=2, ge=1, description="shards: shards of a class")
    classes_per_client: int = Field(default=2, ge=1, description="shards: classes a client")
    num_clients: int | None = Field(
        default=None, ge=1, description="dirichlet: clients (null: the clusters' sizes' sum)"
    )
    test_split: float = Field(
        default=0.2,
        gt=0,
        lt=1,
        description="partitions of each client's own samples: its share tested on",
    )
    test_on: Literal["own", "classes"] = Field(
        default="own",
        description="disjoint_classes, label_groups, shards: own (a test_split of the "
        "client's samples) or classes (the test split's samples of its classes, "
        "data.test_fraction of them; L2C's protocol)",
    )

    @model_validator(mode="after")
    def _sizes(self) -> PartitionConfig:
        sizes = self.clients_per_cluster
        if isinstance(sizes, int):
            if sizes < 1:
                raise ValueError("clients_per_cluster: must be >= 1")
        else:
            if not sizes or any(s < 1 for s in sizes):
                raise ValueError("clients_per_cluster: every cluster needs >= 1 client")
        return self

    def cluster_sizes(self) -> list[int]:
        if isinstance(self.clients_per_cluster, list):
            return list(self.clients_per_cluster)
        return [self.clients_per_cluster] * self.num_clusters


class DataConfig(_Section):
    name: str = Field(
        default="quadratic",
        description="a built-in data set, or a plugin (package.module:load, an entry point)",
    )
    root: str | None = Field(default=None, description="where the data set's files are")
    path: str | None = Field(default=None, description="arrays: a .npz/.pt file or a folder")
    image_size: int | None = Field(default=None, ge=1, description="image_folder: resize to")
    num_classes: int | None = Field(
        default=None,
        ge=2,
        description="arrays: the class count C (labels 0..C-1); null: the largest label + 1, "
        "at most 10,000",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="a plugin data set's settings, as they are"
    )
    download: bool = Field(default=False, description="fetch missing files (never in tests)")
    fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="label_permutation: each cluster's share of the training set; other "
        "partitions: the share of it the clients divide",
    )
    test_fraction: float = Field(
        default=1.0, gt=0, le=1, description="share of the test split evaluated on"
    )
    augment: bool = Field(default=False, description="images: random crops and flips")
    num_samples: int | None = Field(default=None, ge=10, description="mnist1d size")
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    dim: int = Field(default=10, ge=1, description="quadratic (CoBo Example 2): dimension")
    noise: float = Field(default=0.1, ge=0, description="quadratic: gradient noise")
    curvature: tuple[float, float] = Field(
        default=(0.5, 2.0), description="quadratic: the curvatures' range"
    )
    center_scale: float = Field(default=1.0, ge=0, description="quadratic: optima's spread")
    init_scale: float = Field(default=0.0, ge=0, description="quadratic: initial models' spread")
    validation_fraction: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="share of each client's training data held out (null: 0.2 for the "
        "methods that learn from a validation loss, L2C and meta-L2C, else 0)",
    )
    evaluate_on: Literal["test", "validation"] = Field(
        default="test",
        description="what evaluations score: the test split, or each client's held-out "
        "validation part (tuning without looking at the test data)",
    )
    languages: list[str] = Field(
        default_factory=lambda: ["ca", "es", "de", "nl"],
        description="multilingual_text: one client per language",
    )
    text_source: Literal["libreoffice_help", "text_files", "huggingface"] = Field(
        default="libreoffice_help", description="multilingual_text: where the prose is"
    )
    text_files: list[str] = Field(
        default_factory=list, description="text_files: one client per file"
    )
    hf_dataset: str | None = Field(default=None, description="huggingface: the data set")
    hf_configs: list[str] | None = Field(
        default=None, description="huggingface: one client per config"
    )
    hf_split: str = Field(default="train", description="huggingface: the split")
    hf_text_field: str = Field(default="text", description="huggingface: the text column")
    block_size: int = Field(default=128, ge=2, description="tokens per training block")
    tokens_per_client: int = Field(default=200_000, ge=4, description="text: tokens a client")

    @model_validator(mode="after")
    def _curv(self) -> DataConfig:
        lo, hi = self.curvature
        if not (0 < lo <= hi):
            raise ValueError("curvature: need 0 < low <= high")
        return self

    @field_validator("num_classes")
    @classmethod
    def _only_arrays(cls, value: int | None, info: ValidationInfo) -> int | None:
        name = info.data.get("name")
        if value is not None and name != "arrays":
            raise ValueError(f"applies to data.name=arrays, not {name}")
        return value


class ModelConfig(_Section):
    # a built-in model, or a plugin: package.module:Net (an nn.Module) or an entry point
    name: str = "mlp"
    # keyword arguments of a plugin model's constructor
    options: dict[str, Any] = Field(default_factory=dict)
    hidden: list[int] = Field(default_factory=lambda: [64])
    norm: Literal["group", "batch", "none"] = "group"  # resnet9
    # causal LMs (multilingual_text): smollm2 (offline GGUF), tiny_gpt2 (random, tests),
    # hf (any Hugging Face causal LM: model.path is a hub name or a local directory)
    path: str | None = None
    cache_dir: str = "~/.cache/raycobo/models"
    lora_rank: int = Field(default=4, ge=1)
    lora_alpha: float = Field(default=8.0, gt=0)
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    lora_targets: list[str] | None = Field(default=None, description="null: attention+MLP")


class EngineConfig(_Section):
    # unknown keys are refused by _own_settings unless the engine's spec declares them
    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)

    kind: str = Field(
        default="local",
        description="the engine (raycobo.registry.ENGINES: local, loop, ray; a plugin "
        "engine as module:Object or an entry point of raycobo.engines)",
    )
    device: str = "cpu"
    chunk_size: int = Field(default=4096, ge=1, description="max clients per batched call")
    # how client batches execute (local engine and Ray hosts): auto (loop for conv nets on
    # a CPU, else memory-bounded chunks), vmap (all rows at once), chunked, loop
    strategy: Literal["auto", "vmap", "chunked", "loop"] = "auto"
    # memory the batched calls may take (GiB); null: half of what is available
    memory_gb: float | None = Field(default=None, gt=0)
    # arithmetic of the clients' passes: fp32 (exact, the default), tf32 (CUDA matmuls and
    # convolutions in TF32), bf16 (autocast; fp32 master weights, gradients and losses)
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    # conv nets on the per-client loop (engine.strategy loop): NHWC tensors for cuDNN
    channels_last: bool = False
    gpus_per_client: float = Field(default=0.0, ge=0)
    # auto: sized to the Ray instance (about one host per CPU, its CPUs shared out)
    clients_per_actor: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    cpus_per_actor: Annotated[float, Field(ge=0)] | Literal["auto"] = "auto"
    address: str | None = None
    # how long joining engine.address may take (the address must answer within it)
    connect_timeout_s: float = Field(default=30.0, gt=0)
    threads: int | None = Field(default=None, ge=1)
    # ray: local instance (when no address), fault tolerance, straggler injection
    num_cpus: int | None = Field(default=None, ge=1)
    num_gpus: float | None = Field(default=None, ge=0, description="declare (fake) GPUs")
    dashboard: bool = False
    timeout_s: float = Field(default=600.0, gt=0)
    max_restarts: int = Field(default=3, ge=0)
    # a dead host: restart it (Ray's max_restarts, same data, the round retried) or go on
    # without its clients (they leave the run; algorithms with elastic clients)
    on_failure: Literal["restart", "drop"] = "restart"
    slow_hosts: list[int] = Field(default_factory=list, description="hosts to slow down")
    slow_seconds: float = Field(default=0.0, ge=0, description="extra seconds per gradient")
    # how the Ray engine schedules a round (resolved once, raycobo.engine.ray.policies):
    # sync (each round waits for its answers), stale (results a method may apply late --
    # CoBo's alignment -- arrive up to engine.staleness rounds late), resident (the hosts
    # keep their clients' models and W rows; only W rows, indices and scores cross the
    # coordinator, models go host to host through the object store)
    rounds: Literal["sync", "stale", "resident"] = "sync"
    staleness: int | None = Field(
        default=None,
        ge=0,
        description="rounds: stale: rounds a late result may lag (0: each waits, as sync; null: 1)",
    )

    @model_validator(mode="before")
    @classmethod
    def _own_settings(cls, data: Any) -> Any:
        """Keys beyond these fields are the engine's own (its spec's ``settings``):
        validated by that section, its defaults filled in; any other is unknown (the
        renamed ``resident`` named with its replacement)."""
        if not isinstance(data, dict):
            return data
        if "resident" in data:
            raise ValueError(
                "resident: replaced by engine.rounds (set engine.rounds=resident, or sync)"
            )
        kind = data.get("kind", "local")
        try:
            spec = engine(kind) if isinstance(kind, str) else None
        except ConfigError as err:  # one line, naming engine.kind
            raise ValueError("kind:" + str(err).partition("':")[2]) from None
        section = spec.settings if spec is not None else None
        known = section.model_fields if section is not None else {}
        extra = {k: v for k, v in data.items() if k not in cls.model_fields}
        for key in extra:
            if key not in known:
                owners = [n for n, s in ENGINES.builtin.items() if key in s.own_keys()]
                if owners:
                    raise ValueError(
                        f"{key}: a setting of engine.kind={owners[0]}; with engine.kind="
                        f"{kind} it would do nothing (drop it, or set engine.kind={owners[0]})"
                    )
                raise ValueError(
                    f"unknown config key 'engine.{key}'"
                    + did_you_mean(f"engine.{key}", [*cls.model_fields, *known])
                )
        if section is None:
            return data
        try:
            own = section.model_validate(extra).model_dump()
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{field}: {first['msg']}") from None
        return {**data, **own}

    @model_validator(mode="after")
    def _staleness_when_stale(self) -> EngineConfig:
        if self.staleness is not None and self.rounds != "stale":
            raise ValueError(
                f"staleness: applies to engine.rounds=stale, not {self.rounds} (it would do "
                "nothing): drop it, or set engine.rounds=stale"
            )
        return self

    @model_validator(mode="after")
    def _engine_reads_it(self) -> EngineConfig:
        """A key of another engine (its registry entry's ``keys``) set away from its
        default would do nothing: refused, naming it and the engine that reads it."""
        for key in unread_engine_keys(self):
            owner = next(k for k, s in ENGINES.builtin.items() if key in s.keys)
            raise ValueError(
                f"{key}: a setting of engine.kind={owner}; with engine.kind={self.kind} it "
                f"would do nothing (drop it, or set engine.kind={owner})"
            )
        return self

    def late_rounds(self) -> int:
        """The rounds a late result may lag under ``rounds: stale``."""
        return 1 if self.staleness is None else self.staleness


# Each engine's own keys are declared by its registry entry (raycobo.registry.ENGINES:
# EngineSpec.keys, fields of EngineConfig, and EngineSpec.settings, further keys; the
# dotted names stay flat: they are contracts). The fields no spec claims are shared:
# kind, device, threads, precision, strategy, memory_gb, chunk_size, channels_last (every
# engine that computes client batches, the Ray hosts included) and the Ray *instance*'s
# address, connect_timeout_s, num_cpus, num_gpus, dashboard and timeout_s (read wherever
# Ray runs: the Ray engine, a parallel compare's tasks, a sweep's trials).
def engine_keys(kind: str) -> tuple[str, ...]:
    """The ``engine.*`` keys that are the engine ``kind``'s own (() for an unknown kind)."""
    try:
        return engine(kind).own_keys()
    except ConfigError:
        return ()


def unread_engine_keys(e: EngineConfig) -> list[str]:
    """The fields of other engines' own keys that ``e`` sets away from their defaults."""
    fields = type(e).model_fields
    return [
        key
        for kind, spec in ENGINES.builtin.items()
        if kind != e.kind
        for key in spec.keys
        if key not in engine_keys(e.kind)
        and getattr(e, key) != fields[key].get_default(call_default_factory=True)
    ]


class TrackingConfig(_Section):
    enabled: bool = True
    uri: str = "sqlite:///mlruns.db"
    experiment: str = "raycobo"
    artifact_root: str = "mlartifacts"
    heatmap_rounds: list[int] | None = None
    client_series: bool = Field(
        default=False,
        description="log every client's accuracy and loss as MLflow series too (by "
        "default a run's clients are one table, clients.json, at its end)",
    )


class CompareConfig(_Section):
    # entries: algorithm names, or labels of ``variants``
    algorithms: list[str] = Field(default_factory=list)
    # per-algorithm dotted overrides, e.g. {ditto: {algorithm.lr: 0.1}}
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # named variants: label -> dotted overrides (e.g. CoBo with each sampling strategy)
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seeds: list[int] | None = None
    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    heatmap_rounds: list[int] | None = None


class CheckpointConfig(_Section):
    # rounds between checkpoints; null: at every evaluation (eval_every); 0: none. The
    # last round is always checkpointed (unless 0), so a finished run can be extended.
    every: int | None = Field(default=None, ge=0)
    keep: int = Field(default=2, ge=1, description="newest checkpoints kept")


def check_name(value: str, key: str) -> str:
    """A name that becomes a folder under an output root: no separators, no '..'."""
    if not value or "/" in value or "\\" in value or value.startswith(".") or "\0" in value:
        raise ValueError(
            f"{key}: {value!r} must be a plain folder name (no '/', '\\', or leading '.')"
        )
    return value


class ScheduleEvent(_Section):
    """Clients joining or leaving after ``round`` completed rounds."""

    round: int = Field(ge=0)
    join: list[int] = Field(default_factory=list)
    leave: list[int] = Field(default_factory=list)


@dataclass(frozen=True)
class EveryKth:
    """The rounds r in 1..last (and 0 when ``first``) with r % every == 0, and ``last``
    itself: a membership test, never a set as long as the run (``rounds`` may be
    large); ``every`` 0: none."""

    every: int
    last: int
    first: bool = True

    def __contains__(self, r: object) -> bool:
        if not isinstance(r, int) or self.every <= 0:
            return False
        if r == 0:
            return self.first
        return 0 < r <= self.last and (r == self.last or r % self.every == 0)


class Config(_Section):
    name: str = "experiment"
    seed: int = 0
    rounds: int = Field(default=100, ge=1)
    batch_size: int = Field(default=32, ge=1)
    eval_every: int = Field(default=10, ge=1)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    # one method's settings class, chosen by algorithm.name (built-in or plugin)
    algorithm: SerializeAsAny[MethodConfig] = Field(default_factory=CoBoConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    compare: CompareConfig = Field(default_factory=CompareConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    # elastic clients: a client whose first event is a join starts outside the system
    schedule: list[ScheduleEvent] = Field(default_factory=list)

    # folders searched for plugin modules (besides the Python path and the current
    # directory); relative paths are resolved against the YAML file that names them
    plugin_paths: list[str] = Field(default_factory=list)

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


def load_stored_config(path: str | Path) -> Config:
    """A config that raycobo wrote (a run's, comparison's or sweep's ``config.yaml``),
    refused in one line where a version whose settings this one cannot read wrote it
    (``check_written_by``)."""
    path = Path(path)
    check_written_by(path)
    return validate(read_yaml(path))


# stored configs start with this line (``Config.to_yaml``); this version reads those that
# versions from READS_FROM on wrote (0.3.0: CoBo's presets, the keys they left out gone)
WRITTEN_BY = "# written by raycobo "
READS_FROM = "0.3.0"


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
    import json

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
