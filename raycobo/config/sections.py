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
        description="label_permutation, clusters (no label shift: with data.feature_shift), "
        "disjoint_classes, label_groups, shards, dirichlet or pathological",
    )
    clients_per_cluster: int | list[int] = Field(
        default=2, description="clients of every cluster (a list: uneven cluster sizes)"
    )
    num_clusters: int = Field(default=4, ge=1, description="clusters (with an int above)")
    alpha: float = Field(default=0.5, gt=0, description="dirichlet: the concentration")
    min_samples: int | None = Field(
        default=None,
        ge=1,
        description="dirichlet: redraw until every client holds this many, no client past "
        "N/n (Yurochkin et al. 2019, as PFLlib splits); null: one plain draw",
    )
    classes_per_group: int | None = Field(
        default=None, ge=1, description="label_groups: classes of a cluster (null: C / K)"
    )
    shards_per_class: int = Field(default=2, ge=1, description="shards: shards of a class")
    classes_per_client: int = Field(
        default=2, ge=1, description="shards, pathological: classes a client holds"
    )
    num_clients: int | None = Field(
        default=None,
        ge=1,
        description="dirichlet, pathological: clients (null: the clusters' sizes' sum)",
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
        description="label_permutation, clusters: each cluster's share of the training set; "
        "other partitions: the share of it the clients divide",
    )
    test_fraction: float = Field(
        default=1.0, gt=0, le=1, description="share of the test split evaluated on"
    )
    augment: bool = Field(default=False, description="images: random crops and flips")
    feature_shift: Literal["none", "rotate", "permute"] = Field(
        default="none",
        description="clusters that differ in their inputs: cluster k's transformed by the "
        "k-th transform (cluster 0's: none). rotate: the square's 8 symmetries (0-270 "
        "degrees, then transposed); permute: the k-th fixed permutation of the pixels "
        "(permuted MNIST)",
    )
    num_samples: int | None = Field(default=None, ge=10, description="mnist1d size")
    partition: PartitionConfig = Field(
        default_factory=PartitionConfig, description="how the data is split among clients"
    )
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
    name: str = Field(
        default="mlp",
        description="a built-in model (mlp, cnn, resnet9, ...; causal LMs for "
        "multilingual_text: smollm2, tiny_gpt2, hf), or a plugin: package.module:Net (an "
        "nn.Module) or an entry point",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of a plugin model's constructor"
    )
    hidden: list[int] = Field(default_factory=lambda: [64], description="mlp: hidden widths")
    norm: Literal["group", "batch", "none"] = Field(
        default="group", description="resnet9: the normalization layers"
    )
    path: str | None = Field(
        default=None,
        description="hf: a Hugging Face hub name or a local directory of a causal LM",
    )
    cache_dir: str = Field(
        default="~/.cache/raycobo/models", description="where language models are looked for"
    )
    lora_rank: int = Field(default=4, ge=1, description="language models: LoRA rank")
    lora_alpha: float = Field(default=8.0, gt=0, description="language models: LoRA alpha")
    lora_dropout: float = Field(
        default=0.0, ge=0, lt=1, description="language models: LoRA dropout"
    )
    lora_targets: list[str] | None = Field(default=None, description="null: attention+MLP")


class EngineConfig(_Section):
    # unknown keys are refused by _own_settings unless the engine's spec declares them
    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)

    kind: str = Field(
        default="local",
        description="the engine (raycobo.registry.ENGINES: local, loop, ray; a plugin "
        "engine as module:Object or an entry point of raycobo.engines)",
    )
    device: str = Field(default="cpu", description="cpu, cuda or cuda:N")
    chunk_size: int = Field(default=4096, ge=1, description="max clients per batched call")
    strategy: Literal["auto", "vmap", "chunked", "loop"] = Field(
        default="auto",
        description="how client batches execute (local engine and Ray hosts): auto (loop "
        "for conv nets on a CPU, else memory-bounded chunks), vmap (all rows at once), "
        "chunked, loop",
    )
    memory_gb: float | None = Field(
        default=None,
        gt=0,
        description="GiB the batched calls may take; null: half of what is available",
    )
    precision: Literal["fp32", "tf32", "bf16"] = Field(
        default="fp32",
        description="arithmetic of the clients' passes: fp32 (exact), tf32 (CUDA matmuls "
        "and convolutions in TF32), bf16 (autocast; fp32 master weights, gradients, losses)",
    )
    channels_last: bool = Field(
        default=False, description="conv nets on the per-client loop: NHWC tensors for cuDNN"
    )
    gpus_per_client: float = Field(
        default=0.0, ge=0, description="ray: the GPU share each client's host reserves"
    )
    clients_per_actor: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        default="auto",
        description="ray: clients per host actor; auto: sized to the Ray instance (about "
        "one host per CPU)",
    )
    cpus_per_actor: Annotated[float, Field(ge=0)] | Literal["auto"] = Field(
        default="auto", description="ray: CPUs each host actor reserves; auto: shared out"
    )
    address: str | None = Field(
        default=None,
        description="a Ray cluster to join (auto, or host:port, or ray://...); null: a "
        "local instance",
    )
    connect_timeout_s: float = Field(
        default=30.0, gt=0, description="seconds joining engine.address may take"
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        description="torch threads of the local engine and of each Ray host; null: torch's "
        "choice locally, a Ray host its CPUs",
    )
    num_cpus: int | None = Field(
        default=None, ge=1, description="CPUs of a local Ray instance; null: the machine's"
    )
    num_gpus: float | None = Field(default=None, ge=0, description="declare (fake) GPUs")
    dashboard: bool = Field(default=False, description="start Ray's dashboard (local instance)")
    timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="seconds a wait on the Ray hosts may take before the run stops with "
        "a line naming what it waited for",
    )
    max_restarts: int = Field(default=3, ge=0, description="restarts of a dead host actor")
    on_failure: Literal["restart", "drop"] = Field(
        default="restart",
        description="a dead host: restart it (the same data, the round retried) or go on "
        "without its clients (they leave the run; methods with elastic clients)",
    )
    slow_hosts: list[int] = Field(default_factory=list, description="hosts to slow down")
    slow_seconds: float = Field(default=0.0, ge=0, description="extra seconds per gradient")
    rounds: Literal["sync", "stale", "resident"] = Field(
        default="sync",
        description="how the Ray engine schedules a round: sync (each round waits for its "
        "answers), stale (results a method may apply late, CoBo's alignment, arrive up to "
        "engine.staleness rounds late), resident (the hosts keep their clients' models and "
        "W rows; models go host to host through the object store)",
    )
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
    enabled: bool = Field(default=True, description="log the run to MLflow")
    uri: str = Field(
        default="sqlite:///mlruns.db",
        description="MLflow tracking URI (a sqlite file, or a server's http address)",
    )
    experiment: str = Field(default="raycobo", description="MLflow experiment name")
    artifact_root: str = Field(
        default="mlartifacts", description="where a new experiment's artifacts go"
    )
    heatmap_rounds: list[int] | None = Field(
        default=None,
        description="rounds whose W heatmap is logged; null: 1 %, 10 %, 50 % and 100 % of the run",
    )
    client_series: bool = Field(
        default=False,
        description="log every client's accuracy and loss as MLflow series too (by "
        "default a run's clients are one table, clients.json, at its end)",
    )


class CompareConfig(_Section):
    algorithms: list[str] = Field(
        default_factory=list, description="entries: method names, or labels of variants"
    )
    overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per-entry dotted overrides, e.g. {ditto: {algorithm.lr: 0.1}}",
    )
    variants: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="named variants: label -> dotted overrides (e.g. CoBo with each "
        "sampling strategy)",
    )
    seeds: list[int] | None = Field(
        default=None, description="every entry on each seed; null: the config's seed"
    )
    target_accuracy: float | None = Field(
        default=None, gt=0, le=1, description="report the round each entry first reaches it"
    )
    heatmap_rounds: list[int] | None = Field(
        default=None, description="rounds of the W heatmaps in the report"
    )


class CheckpointConfig(_Section):
    every: int | None = Field(
        default=None,
        ge=0,
        description="rounds between checkpoints; null: at every evaluation (eval_every); "
        "0: none. The last round is always checkpointed (unless 0)",
    )
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

    round: int = Field(ge=0, description="after this many completed rounds")
    join: list[int] = Field(default_factory=list, description="clients that join then")
    leave: list[int] = Field(default_factory=list, description="clients that leave then")


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
