"""The settings a run reads, as its MLflow params.

A resolved config holds every key of every section, most of them read by another data
set, partition, model or engine than the run's (the quadratic task's ``dim`` on an image
run, ``partition.alpha`` on a label permutation, LoRA keys on an MLP, Ray keys on a
local run). The params are the keys this run reads; the whole resolved config stays the
run's ``config.yaml`` artifact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raycobo.config import Config, EngineConfig, engine_keys, flat_tree
from raycobo.registry import ENGINES

QUADRATIC = ("dim", "noise", "curvature", "center_scale", "init_scale")
TEXT = ("languages", "text_source", "block_size", "tokens_per_client", "root", "download")
TEXT_SOURCE = {
    "text_files": ("text_files",),
    "huggingface": ("hf_dataset", "hf_configs", "hf_split", "hf_text_field"),
}
# what a loader reads besides the shared keys (fraction, validation, evaluate_on)
LOADER = {
    "fashion_mnist": ("root", "download", "augment"),
    "cifar10": ("root", "download", "augment"),
    "cifar100": ("root", "download", "augment"),
    "mnist1d": ("num_samples",),
    "digits": (),
    "arrays": ("path", "num_classes"),
    "image_folder": ("root", "image_size", "augment"),
}
SIZES = ("clients_per_cluster", "num_clusters")
OWN_TEST = ("test_split", "test_on")  # partitions that split each client's own samples
PARTITION = {
    "label_permutation": SIZES,
    "disjoint_classes": (*SIZES, *OWN_TEST),
    "label_groups": (*SIZES, "classes_per_group", *OWN_TEST),
    "shards": ("shards_per_class", "classes_per_client", *OWN_TEST),
    "dirichlet": ("num_clients", "alpha", "min_samples", *OWN_TEST),
    "pathological": ("num_clients", "classes_per_client", *OWN_TEST),
}
MODEL = {"mlp": ("hidden",), "cnn": (), "fedavg_cnn": (), "cnn1d": (), "resnet9": ("norm",)}
LLM = ("path", "cache_dir", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets")
RAY_SESSION = ("address", "connect_timeout_s", "num_cpus", "num_gpus", "dashboard", "timeout_s")


def read_keys(cfg: Config) -> set[str]:
    """The dotted keys of ``cfg`` (its algorithm section left to the method) that the
    run reads."""
    keys = {"name", "seed", "rounds", "batch_size", "eval_every", "schedule"}
    keys |= {"plugin_paths"} if cfg.plugin_paths else set()
    keys |= {f"data.{k}" for k in _data_keys(cfg)}
    keys |= {f"model.{k}" for k in _model_keys(cfg)}
    keys |= {f"engine.{k}" for k in _engine_keys(cfg.engine.kind)}
    keys |= {f"tracking.{k}" for k in type(cfg.tracking).model_fields}
    keys |= {f"checkpoint.{k}" for k in type(cfg.checkpoint).model_fields}
    return keys


def _data_keys(cfg: Config) -> list[str]:
    data = cfg.data
    if data.name == "quadratic":  # made from its own keys; the clusters' sizes
        return ["name", *QUADRATIC, *(f"partition.{k}" for k in SIZES)]
    if data.name == "multilingual_text":
        return ["name", *TEXT, *TEXT_SOURCE.get(data.text_source, ()), "partition.test_split"]
    shared = ["name", "fraction", "validation_fraction", "evaluate_on"]
    own = LOADER.get(data.name)
    if own is None:  # a plugin data set reads its options (and may partition)
        return [*shared, "options", "root", *_partition_keys(cfg)]
    if data.name == "arrays" and data.path and Path(data.path).is_dir():
        return [*shared, *own, "partition.test_split"]  # one file per client: no partition
    return [*shared, *own, *_partition_keys(cfg)]


def _partition_keys(cfg: Config) -> list[str]:
    part = cfg.data.partition
    own = list(PARTITION.get(part.kind, type(part).model_fields))
    if part.kind in ("dirichlet", "pathological") and part.num_clients is None:
        own += SIZES  # as many clients as the clusters' sizes add up to
    tests_on_split = part.kind == "label_permutation" or (
        "test_on" in own and part.test_on == "classes"
    )
    return ["partition.kind", *(f"partition.{k}" for k in own)] + (
        ["test_fraction"] if tests_on_split else []
    )


def _model_keys(cfg: Config) -> list[str]:
    name = cfg.model.name
    if cfg.data.name == "quadratic":  # its own closed-form losses: no model
        return []
    if cfg.data.name == "multilingual_text":
        return ["name", *LLM]
    return ["name", *MODEL.get(name, ("options",))]


def _engine_keys(kind: str) -> list[str]:
    others = {k for e in ENGINES.builtin if e != kind for k in engine_keys(e)}
    own = set(engine_keys(kind))
    shared = set(EngineConfig.model_fields) - others - set(RAY_SESSION)
    return sorted(shared | own | (set(RAY_SESSION) if kind == "ray" else set()))


def read_params(cfg: Config, tree: dict[str, Any], also: tuple[str, ...] = ()) -> dict[str, Any]:
    """``tree`` (a config tree, its algorithm section as the method runs it) as flat
    keys, only those the run reads (a key under one it reads too: ``data.options.*``),
    every ``algorithm.*`` key and the sections named in ``also`` (a comparison's)."""
    keys = read_keys(cfg)
    kept = ("algorithm", *also)

    def read(key: str) -> bool:
        parts = key.split(".")
        prefixes = {".".join(parts[: i + 1]) for i in range(len(parts))}
        return bool(prefixes & keys) or parts[0] in kept

    return {k: v for k, v in flat_tree(tree).items() if read(k)}
