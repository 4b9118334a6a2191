"""What data the clients got: counts per client, classes per client, cluster sizes, and
the warnings a reader of the results needs (test sets too small to give a steady
accuracy, a key that means something else for the chosen partition)."""

from __future__ import annotations

from collections import Counter
from statistics import median
from typing import Any

import torch

from raycobo.config import Config
from raycobo.data.base import FederatedData
from raycobo.data.quadratic import QuadraticProblem

SMALL_TEST = 20  # below this many test samples a client's accuracy moves in coarse steps
LABEL_MIX_MAX = 20_000  # clients x classes kept for the label-mix plot


def _spread(values: list[int]) -> dict[str, float]:
    return {"min": min(values), "median": median(values), "max": max(values)}


def data_report(data: Any) -> dict[str, Any]:
    """The data report of a run's clients (classification data: counts and classes per
    client; other tasks: the clients and their clusters)."""
    if isinstance(data, QuadraticProblem):
        clusters: list[int | None] = [int(c) for c in data.cluster.tolist()]
    else:
        clusters = list(getattr(data, "clusters", []) or [])
    n = int(getattr(data, "n_clients", len(clusters)))
    sizes = Counter(c for c in clusters if c is not None)
    out: dict[str, Any] = {"clients": n, "cluster_sizes": [sizes[k] for k in sorted(sizes)]}
    if not isinstance(data, FederatedData) or n == 0:
        return out
    val = data.validation_sizes()
    train = [t - v for t, v in zip(data.train_sizes(), val, strict=True)]
    test = [int(t.numel()) for t in data.test_idx]
    counts = [torch.bincount(y, minlength=data.num_classes).tolist() for y in data.train_y]
    classes = [sum(1 for c in row if c) for row in counts]
    out.update(
        train=_spread(train),
        validation=_spread(val) if any(val) else None,
        test=_spread(test),
        classes_per_client=_spread(classes),
        num_classes=int(data.num_classes),
        smallest_test_client=int(min(range(n), key=lambda c: test[c])),
    )
    if n * data.num_classes <= LABEL_MIX_MAX:
        out["label_mix"] = counts  # per client, its training samples of each class
    return out


def describe(report: dict[str, Any]) -> str:
    """One line: ``data: 8 clients in 4 clusters (2 each); per client train 60/61/63 ...``."""
    sizes = report["cluster_sizes"]
    line = f"data: {report['clients']} clients"
    if sizes:
        same = len(set(sizes)) == 1
        each = f"{sizes[0]} each" if same else "sizes " + ", ".join(map(str, sizes))
        line += f" in {len(sizes)} clusters ({each})"
    if "train" not in report:
        return line
    parts = [f"{k} {_mmm(report[k])}" for k in ("train", "validation", "test") if report.get(k)]
    line += "; per client (min/median/max) " + ", ".join(parts)
    line += f", classes {_mmm(report['classes_per_client'])} of {report['num_classes']}"
    return line


def _mmm(s: dict[str, float]) -> str:
    return f"{s['min']:g}/{s['median']:g}/{s['max']:g}"


# the partitions whose data.fraction is each cluster's share of the training set
PER_CLUSTER = ("label_permutation", "clusters")


def warnings(report: dict[str, Any], cfg: Config) -> list[str]:
    """What a reader of this run's figures should know about its data."""
    out = []
    test = report.get("test")
    if test is not None and test["min"] < SMALL_TEST:
        step = 100 / max(1, test["min"])
        out.append(
            f"warning: client {report['smallest_test_client']} has {test['min']:g} test "
            f"samples (its accuracy moves in steps of {step:.0f} %); more data per client "
            "(data.fraction, data.test_fraction) gives steadier figures"
        )
    kind = cfg.data.partition.kind
    if "train" in report and cfg.data.fraction < 1 and kind not in PER_CLUSTER:
        out.append(
            f"note: under partition {kind}, data.fraction = {cfg.data.fraction:g} is the "
            "share of the whole training set the clients divide (under label_permutation "
            "and clusters it is each cluster's share)"
        )
    return out
