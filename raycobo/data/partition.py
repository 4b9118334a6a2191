"""Partitions of a centralized dataset into clients with ground-truth clusters.

Every partition is a pure function of the labels, the config and a seed, and returns
per-client train/test index arrays, per-client labels and each client's cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from raycobo.config import ConfigError, DataConfig, choose
from raycobo.data.base import FederatedData, RawDataset


@dataclass
class Partition:
    train_idx: list[torch.Tensor]
    train_y: list[torch.Tensor]
    test_idx: list[torch.Tensor]
    test_y: list[torch.Tensor]
    clusters: list[int | None]
    num_classes: int
    test_from_train: bool = False  # test indices point into the training pool


def _distinct_permutations(k: int, c: int, g: torch.Generator) -> list[torch.Tensor]:
    perms: list[torch.Tensor] = []
    seen: set[tuple[int, ...]] = set()
    while len(perms) < k:
        p = torch.randperm(c, generator=g)
        key = tuple(p.tolist())
        if key in seen and len(seen) < _factorial_cap(c):
            continue
        seen.add(key)
        perms.append(p)
    return perms


def _factorial_cap(c: int) -> int:
    out = 1
    for i in range(2, c + 1):
        out *= i
        if out > 10**6:
            break
    return out


def label_permutation(raw: RawDataset, cfg: DataConfig, seed: int) -> Partition:
    """CoBo Section 4.1 (cross-silo): clusters differ by a random label permutation.

    Each cluster draws ``data.fraction`` of the training set at random and splits it
    evenly among its clients; the cluster's permutation relabels its clients' train and
    test data; test data is (``data.test_fraction`` of) the test split, permuted.
    """
    return _random_clusters(raw, cfg, seed, permute=True)


def clusters(raw: RawDataset, cfg: DataConfig, seed: int) -> Partition:
    """Clusters drawn as label_permutation's, with the labels left as they are: every
    client has one label distribution, and the clusters differ only where
    ``data.feature_shift`` transforms their inputs."""
    return _random_clusters(raw, cfg, seed, permute=False)


def _random_clusters(raw: RawDataset, cfg: DataConfig, seed: int, permute: bool) -> Partition:
    sizes = cfg.partition.cluster_sizes()
    g = torch.Generator().manual_seed(seed)
    n_train, n_test = len(raw.train_y), len(raw.test_y)
    per_cluster = int(round(cfg.fraction * n_train))
    if per_cluster < max(sizes):
        raise ConfigError(
            f"invalid config key 'data.fraction': {cfg.fraction} of {n_train} samples "
            f"cannot be split among {max(sizes)} clients"
        )
    test_sel = torch.randperm(n_test, generator=g)[: max(1, int(round(cfg.test_fraction * n_test)))]
    test_sel = test_sel.sort().values
    if permute:
        perms = _distinct_permutations(len(sizes), raw.num_classes, g)
    else:
        perms = [torch.arange(raw.num_classes)] * len(sizes)
    out = Partition([], [], [], [], [], raw.num_classes)
    for k, size in enumerate(sizes):
        chosen = torch.randperm(n_train, generator=g)[:per_cluster]
        for part in torch.tensor_split(chosen, size):
            part = part.sort().values
            out.train_idx.append(part)
            out.train_y.append(perms[k][raw.train_y[part]])
            out.test_idx.append(test_sel)
            out.test_y.append(perms[k][raw.test_y[test_sel]])
            out.clusters.append(k)
    return out


def _cluster_test(raw: RawDataset, classes: torch.Tensor, cfg: DataConfig, g: torch.Generator):
    """Test samples of ``classes`` (a ``test_fraction`` of them, seeded)."""
    sel = torch.nonzero(torch.isin(raw.test_y, classes)).flatten()
    keep = max(1, int(round(cfg.test_fraction * sel.numel())))
    return sel[torch.randperm(sel.numel(), generator=g)[:keep]].sort().values


def disjoint_classes(raw: RawDataset, cfg: DataConfig, seed: int) -> Partition:
    """CoBo Section 4.2 (cross-device): cluster k owns its own C/K classes (10 of CIFAR-100's
    100 for 10 clusters); its training samples (``data.fraction`` of them) are split
    uniformly at random among its clients; labels are remapped to 0..C/K-1 within the
    cluster, so every model has C/K outputs. Sizes may be uneven, e.g. the paper's
    [6, 6, 7, 7, 8, 8, 9, 9, 10, 10]."""
    sizes = cfg.partition.cluster_sizes()
    K, C = len(sizes), raw.num_classes
    if K > C:
        raise ConfigError(
            f"invalid config key 'data.partition.clients_per_cluster': {K} clusters need at "
            f"least {K} classes, the dataset has {C}"
        )
    per = C // K
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(C, generator=g)
    out = Partition([], [], [], [], [], per)
    for k, size in enumerate(sizes):
        classes = order[k * per : (k + 1) * per]
        remap = torch.full((C,), -1, dtype=torch.int64)
        remap[classes] = torch.arange(per)
        pool = torch.nonzero(torch.isin(raw.train_y, classes)).flatten()
        pool = pool[torch.randperm(pool.numel(), generator=g)]
        pool = pool[: int(round(cfg.fraction * pool.numel()))]
        if pool.numel() < size:
            raise ConfigError(
                f"invalid config key 'data.fraction': cluster {k} has {pool.numel()} samples "
                f"for {size} clients"
            )
        test = _cluster_test(raw, classes, cfg, g)
        for part in torch.tensor_split(pool, size):
            part = part.sort().values
            out.train_idx.append(part)
            out.train_y.append(remap[raw.train_y[part]])
            out.test_idx.append(test)
            out.test_y.append(remap[raw.test_y[test]])
            out.clusters.append(k)
    return out


def _own_split(samples: torch.Tensor, split: float, g: torch.Generator):
    """Split one client's samples into train/test (test share ``split``, at least one each)."""
    samples = samples[torch.randperm(samples.numel(), generator=g)]
    n_test = min(max(1, int(round(split * samples.numel()))), samples.numel() - 1)
    return samples[n_test:].sort().values, samples[:n_test].sort().values


def _from_client_samples(
    raw: RawDataset,
    per_client: list[torch.Tensor],
    clusters: list[int | None],
    cfg: DataConfig,
    g: torch.Generator,
) -> Partition:
    """Partitions whose clients own samples of the training pool, split 80/20 (by default)
    into their train and test data; features stay in one pool (test_x is train_x). With
    ``partition.test_on: classes`` every sample trains and a client tests on the test
    split's samples of the classes it holds (L2C Section 4: "all the available test data
    belonging to the classes in its local task")."""
    on_classes = cfg.partition.test_on == "classes"
    out = Partition([], [], [], [], [], raw.num_classes, test_from_train=not on_classes)
    for c, samples in enumerate(per_client):
        if on_classes:
            tr, te = samples, _cluster_test(raw, raw.train_y[samples].unique(), cfg, g)
        elif samples.numel() < 2:
            raise ConfigError(
                f"invalid config key 'data.partition': client {c} gets {samples.numel()} "
                "samples, too few for a train/test split"
            )
        else:
            tr, te = _own_split(samples, cfg.partition.test_split, g)
        out.train_idx.append(tr)
        out.train_y.append(raw.train_y[tr])
        out.test_idx.append(te)
        out.test_y.append((raw.test_y if on_classes else raw.train_y)[te])
        out.clusters.append(clusters[c])
    return out


def label_groups(raw: RawDataset, cfg: DataConfig, seed: int) -> Partition:
    """FedeRiCo Section 3.1: the classes are split into groups with disjoint label sets
    (one group per cluster, ``classes_per_group`` each, default C/K); each client draws
    its data from its group's samples (``data.fraction`` of them, split evenly among the
    group's clients); every client's samples are split 80/20 into train/test. Labels keep
    their global ids."""
    sizes = cfg.partition.cluster_sizes()
    K, C = len(sizes), raw.num_classes
    per = cfg.partition.classes_per_group or C // K
    if K * per > C or per < 1:
        raise ConfigError(
            f"invalid config key 'data.partition.classes_per_group': {K} groups of {per} "
            f"classes need {K * per} classes, the dataset has {C}"
        )
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(C, generator=g)
    per_client, clusters = [], []
    for k, size in enumerate(sizes):
        classes = order[k * per : (k + 1) * per]
        pool = torch.nonzero(torch.isin(raw.train_y, classes)).flatten()
        pool = pool[torch.randperm(pool.numel(), generator=g)]
        pool = pool[: int(round(cfg.fraction * pool.numel()))]
        for part in torch.tensor_split(pool, size):
            per_client.append(part)
            clusters.append(k)
    return _from_client_samples(raw, per_client, clusters, cfg, g)


def _deal_distinct(M: int, P: int, N: int, K: int, g: torch.Generator) -> torch.Tensor:
    """Deal each of M classes' P shards to K tasks of N cards so that no task gets a
    class twice: random deals, then (where none worked, as for 100 tasks) swaps that
    remove the last deal's repeats. -> (K, N) class ids"""
    for _ in range(1000):  # a plain random deal first (what earlier versions drew)
        tasks = torch.arange(M).repeat_interleave(P)[torch.randperm(M * P, generator=g)]
        tasks = tasks.view(K, N)
        if all(t.unique().numel() == N for t in tasks):
            return tasks
    for _ in range(100 * K * N):
        bad = [k for k in range(K) if tasks[k].unique().numel() < N]
        if not bad:
            return tasks
        k = bad[int(torch.randint(len(bad), (1,), generator=g))]
        row = tasks[k].tolist()
        a = next(i for i, c in enumerate(row) if row.count(c) > 1)  # a repeated card
        o, b = int(torch.randint(K, (1,), generator=g)), int(torch.randint(N, (1,), generator=g))
        mine, theirs = int(tasks[k, a]), int(tasks[o, b])
        ok_here = theirs not in row
        ok_there = o != k and (mine not in tasks[o].tolist() or mine == theirs)
        if ok_here and ok_there:
            tasks[k, a], tasks[o, b] = theirs, mine
    raise ConfigError("invalid config key 'data.partition': could not deal distinct shards")


def shards(raw: RawDataset, cfg: DataConfig, seed: int) -> Partition:
    """L2C Figure 2: M classes with P shards each (``shards_per_class``); K = M*P/N tasks
    of N random distinct classes (``classes_per_client``) with one shard per class. A
    task's cluster is its class set when tasks share identical sets, else null."""
    M, P, N = raw.num_classes, cfg.partition.shards_per_class, cfg.partition.classes_per_client
    if N > M:
        raise ConfigError(
            f"invalid config key 'data.partition.classes_per_client': {N} > {M} classes"
        )
    if (M * P) % N:
        raise ConfigError(
            f"invalid config key 'data.partition.shards_per_class': {M} classes x {P} shards "
            f"do not divide into tasks of {N} classes"
        )
    K = M * P // N
    g = torch.Generator().manual_seed(seed)
    shard_of: dict[int, list[torch.Tensor]] = {}
    for c in range(M):
        idx = torch.nonzero(raw.train_y == c).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=g)]
        idx = idx[: int(round(cfg.fraction * idx.numel()))]
        shard_of[c] = list(torch.tensor_split(idx, P))
    tasks = _deal_distinct(M, P, N, K, g)
    used = dict.fromkeys(range(M), 0)
    per_client, sets = [], []
    for t in tasks.tolist():
        parts = []
        for c in t:
            parts.append(shard_of[c][used[c]])
            used[c] += 1
        per_client.append(torch.cat(parts))
        sets.append(tuple(sorted(t)))
    ids = {s: i for i, s in enumerate(dict.fromkeys(sets))}
    clusters = [ids[s] if sets.count(s) > 1 else None for s in sets]
    if any(c is None for c in clusters):
        clusters = [None] * K
    return _from_client_samples(raw, per_client, clusters, cfg, g)


def dirichlet(raw: RawDataset, cfg: DataConfig, seed: int) -> Partition:
    """Label skew: each class's samples are split among ``num_clients`` clients with
    proportions ~ Dirichlet(alpha) (smaller alpha, more skew). No ground-truth clusters.
    With ``min_samples`` the split of Yurochkin et al. (2019) that PFLlib uses: a class's
    share for a client that already holds N/n samples is set to zero, and the whole draw
    is repeated until every client holds at least ``min_samples``."""
    import numpy as np

    n = cfg.partition.num_clients or sum(cfg.partition.cluster_sizes())
    least = cfg.partition.min_samples
    g = torch.Generator().manual_seed(seed)
    rs = np.random.default_rng(seed)
    pools = []
    for c in range(raw.num_classes):
        idx = torch.nonzero(raw.train_y == c).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=g)]
        pools.append(idx[: int(round(cfg.fraction * idx.numel()))])
    cap = sum(p.numel() for p in pools) / n
    for _ in range(1000 if least else 1):
        buckets: list[list[torch.Tensor]] = [[] for _ in range(n)]
        held = np.zeros(n)
        for idx in pools:
            props = rs.dirichlet([cfg.partition.alpha] * n)
            if least:
                props = props * (held < cap)
                props = props / props.sum()
            cuts = (torch.cumsum(torch.from_numpy(props), 0) * idx.numel()).round().long()[:-1]
            for k, part in enumerate(torch.tensor_split(idx, cuts)):
                buckets[k].append(part)
                held[k] += part.numel()
        if not least or held.min() >= least:
            break
    else:
        raise ConfigError(
            f"invalid config key 'data.partition.min_samples': 1,000 draws left a client "
            f"with fewer than {least} samples; raise data.fraction or alpha"
        )
    per_client = [torch.cat(b) for b in buckets]
    return _from_client_samples(raw, per_client, [None] * n, cfg, g)


def pathological(raw: RawDataset, cfg: DataConfig, seed: int) -> Partition:
    """PFLlib's pathological label skew ("pat", unbalanced; its benchmark table's first
    setting): every client holds ``classes_per_client`` classes. Class c in turn goes to
    the first ceil(n * classes_per_client / C) clients that still lack classes, in client
    order; the first of them draw uniform sizes in [s/10, s) (s: the class's samples over
    its clients) and the last takes the rest. Clients holding the same class set form a
    cluster (with 20 clients and 2 of 10 classes: 5 clusters of 4)."""
    import numpy as np

    n = cfg.partition.num_clients or sum(cfg.partition.cluster_sizes())
    C, per = raw.num_classes, cfg.partition.classes_per_client
    if per > C or n * per < C:
        raise ConfigError(
            f"invalid config key 'data.partition.classes_per_client': {n} clients of {per} "
            f"classes cannot hold {C} classes"
        )
    g = torch.Generator().manual_seed(seed)
    rs = np.random.default_rng(seed)
    left = [per] * n
    parts: list[list[torch.Tensor]] = [[] for _ in range(n)]
    held: list[list[int]] = [[] for _ in range(n)]
    for c in range(C):
        idx = torch.nonzero(raw.train_y == c).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=g)]
        idx = idx[: int(round(cfg.fraction * idx.numel()))]
        takers = [k for k in range(n) if left[k] > 0][: math.ceil(n * per / C)]
        if not takers:
            break  # every client has its classes: the rest stay unused (as in PFLlib)
        share = idx.numel() / len(takers)
        if share < 2:
            raise ConfigError(
                f"invalid config key 'data.fraction': class {c} has {idx.numel()} samples "
                f"for {len(takers)} clients; raise data.fraction"
            )
        sizes = [int(v) for v in rs.integers(int(max(share / 10, 1)), int(share), len(takers) - 1)]
        sizes.append(idx.numel() - sum(sizes))
        for k, part in zip(takers, torch.split(idx, sizes), strict=True):
            parts[k].append(part)
            held[k].append(c)
            left[k] -= 1
    if any(not p for p in parts):
        raise ConfigError(
            f"invalid config key 'data.partition.classes_per_client': with {per} of {C} "
            f"classes some of the {n} clients get none"
        )
    sets = [tuple(h) for h in held]
    ids = {s: i for i, s in enumerate(dict.fromkeys(sets))}
    clusters: list[int | None] = [ids[s] for s in sets]
    if len(ids) == n:  # no two clients alike: no ground-truth clusters
        clusters = [None] * n
    return _from_client_samples(raw, [torch.cat(p) for p in parts], clusters, cfg, g)


# the partitions that deal the clients samples of the training pool (_from_client_samples)
OWN_SAMPLES = ("disjoint_classes", "label_groups", "shards", "pathological")

PARTITIONS: dict[str, Callable[[RawDataset, DataConfig, int], Partition]] = {
    "label_permutation": label_permutation,
    "clusters": clusters,
    "disjoint_classes": disjoint_classes,
    "label_groups": label_groups,
    "shards": shards,
    "dirichlet": dirichlet,
    "pathological": pathological,
}


def partition(raw: RawDataset, cfg: DataConfig, seed: int) -> FederatedData:
    fn = choose(PARTITIONS, cfg.partition.kind, "data.partition.kind", "partition")
    if cfg.partition.test_on != "own" and cfg.partition.kind not in OWN_SAMPLES:
        raise ConfigError(
            f"invalid config key 'data.partition.test_on': {cfg.partition.kind} tests on "
            f"the test split already (test_on is for {', '.join(OWN_SAMPLES)})"
        )
    p = fn(raw, cfg, seed)
    return FederatedData(
        name=raw.name,
        train_x=raw.train_x,
        test_x=raw.train_x if p.test_from_train else raw.test_x,
        train_idx=p.train_idx,
        train_y=p.train_y,
        test_idx=p.test_idx,
        test_y=p.test_y,
        clusters=p.clusters,
        num_classes=p.num_classes,
    )
