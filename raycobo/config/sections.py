"""The config's sections, one pydantic class per concern (the data and its partition,
the model, the engine, tracking, comparisons, checkpoints, membership changes); the root
``Config`` and loading are in ``raycobo.config``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from raycobo.registry import ENGINES, engine
from raycobo.settings import ConfigError, did_you_mean
from raycobo.settings import Section as _Section

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
