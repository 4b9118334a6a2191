"""Every partition's invariants on small synthetic data."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from raycobo.config import ConfigError, load_config
from raycobo.data import load_data
from raycobo.data.base import RawDataset
from raycobo.data.partition import partition


def raw(classes=10, per_class=40, test_per_class=10) -> RawDataset:
    y = torch.arange(classes).repeat_interleave(per_class)
    yt = torch.arange(classes).repeat_interleave(test_per_class)
    x = torch.randn(len(y), 1, 4, 4)
    xt = torch.randn(len(yt), 1, 4, 4)
    return RawDataset("toy", x, y, xt, yt, classes)


def cfg_with(*over):
    return load_config(None, ["data.name=digits", *over]).data


def test_disjoint_classes_uneven_sizes_and_remapped_labels():
    r = raw()
    d = partition(
        r,
        cfg_with(
            "data.partition.kind=disjoint_classes",
            "data.fraction=1",
            "data.partition.clients_per_cluster=[1,2,3,2,2]",
        ),
        seed=0,
    )
    assert d.clusters == [0, 1, 1, 2, 2, 2, 3, 3, 4, 4]
    assert d.num_classes == 2  # 10 classes / 5 clusters, remapped to 0..1
    owned = {}
    for c, k in enumerate(d.clusters):
        orig = set(r.train_y[d.train_idx[c]].tolist())
        owned.setdefault(k, set()).update(orig)
        assert set(d.train_y[c].tolist()) <= {0, 1}
        assert set(r.test_y[d.test_idx[c]].tolist()) <= orig | owned[k]
    sets = list(owned.values())
    assert all(len(s) == 2 for s in sets)
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1 :])  # disjoint
    for k in range(5):  # a cluster's data is split disjointly and completely
        members = [c for c, kk in enumerate(d.clusters) if kk == k]
        idx = torch.cat([d.train_idx[c] for c in members])
        assert idx.unique().numel() == idx.numel() == 80


def test_label_groups_disjoint_labels_and_80_20():
    r = raw()
    d = partition(
        r,
        cfg_with(
            "data.partition.kind=label_groups",
            "data.fraction=1",
            "data.partition.num_clusters=5",
            "data.partition.clients_per_cluster=2",
        ),
        0,
    )
    assert d.n_clients == 10
    for c in range(10):
        tr, te = d.train_idx[c], d.test_idx[c]
        assert not set(tr.tolist()) & set(te.tolist())
        assert abs(te.numel() / (tr.numel() + te.numel()) - 0.2) < 0.05
        assert torch.equal(d.train_y[c], r.train_y[tr]) and torch.equal(d.test_y[c], r.train_y[te])
    assert d.test_x is d.train_x
    labels = [set(d.train_y[c].tolist()) for c in range(10)]
    for i in range(10):
        for j in range(10):
            same = d.clusters[i] == d.clusters[j]
            assert (labels[i] == labels[j]) if same else not (labels[i] & labels[j])


def test_shards_give_n_distinct_classes_and_every_shard_once():
    r = raw(classes=10, per_class=40)
    d = partition(
        r,
        cfg_with(
            "data.partition.kind=shards",
            "data.fraction=1",
            "data.partition.shards_per_class=3",
            "data.partition.classes_per_client=5",
        ),
        0,
    )
    assert d.n_clients == 10 * 3 // 5
    all_idx = torch.cat([torch.cat([d.train_idx[c], d.test_idx[c]]) for c in range(d.n_clients)])
    assert all_idx.unique().numel() == all_idx.numel() == 400  # each sample in one shard
    for c in range(d.n_clients):
        own = torch.cat([d.train_idx[c], d.test_idx[c]])
        assert len(set(r.train_y[own].tolist())) == 5


def test_dirichlet_covers_the_data_and_skews_with_small_alpha():
    r = raw(per_class=100)
    skew = partition(
        r,
        cfg_with(
            "data.partition.kind=dirichlet",
            "data.partition.num_clients=5",
            "data.partition.alpha=0.05",
            "data.fraction=1",
        ),
        0,
    )
    even = partition(
        r,
        cfg_with(
            "data.partition.kind=dirichlet",
            "data.partition.num_clients=5",
            "data.partition.alpha=100",
            "data.fraction=1",
        ),
        0,
    )
    for d in (skew, even):
        assert d.clusters == [None] * 5
        total = sum(t.numel() for t in d.train_idx) + sum(t.numel() for t in d.test_idx)
        assert total == 1000

    def entropy(d):
        ent = []
        for c in range(5):
            counts = torch.bincount(d.train_y[c], minlength=10).float() + 1e-9
            p = counts / counts.sum()
            ent.append(float(-(p * p.log()).sum()))
        return np.mean(ent)

    assert entropy(skew) < entropy(even) - 0.5


@pytest.mark.parametrize(
    ("over", "key"),
    [
        (
            [
                "data.partition.kind=disjoint_classes",
                "data.partition.clients_per_cluster=[1,1,1,1,1,1,1,1,1,1,1]",
            ],
            "data.partition.clients_per_cluster",
        ),
        (
            [
                "data.partition.kind=shards",
                "data.partition.shards_per_class=3",
                "data.partition.classes_per_client=4",
            ],
            "data.partition.shards_per_class",
        ),
        (
            ["data.partition.kind=shards", "data.partition.classes_per_client=11"],
            "data.partition.classes_per_client",
        ),
        (
            ["data.partition.kind=label_groups", "data.partition.classes_per_group=6"],
            "data.partition.classes_per_group",
        ),
    ],
)
def test_impossible_partitions_name_the_key(over, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        partition(raw(), cfg_with(*over), 0)


def write_cifar(root, name: str, n_train: int = 20, n_test: int = 10):
    """Tiny files in torchvision's on-disk format (python pickles)."""
    rs = np.random.default_rng(0)
    if name == "cifar10":
        base = root / "cifar-10-batches-py"
        base.mkdir(parents=True)
        for i in range(1, 6):
            entry = {
                "data": rs.integers(0, 255, (n_train, 3072), dtype=np.uint8),
                "labels": list(rs.integers(0, 10, n_train)),
                "batch_label": f"batch {i}",
            }
            (base / f"data_batch_{i}").write_bytes(pickle.dumps(entry))
        test = {
            "data": rs.integers(0, 255, (n_test, 3072), dtype=np.uint8),
            "labels": list(rs.integers(0, 10, n_test)),
        }
        (base / "test_batch").write_bytes(pickle.dumps(test))
    else:
        base = root / "cifar-100-python"
        base.mkdir(parents=True)
        for split, n in (("train", n_train * 5), ("test", n_test)):
            entry = {
                "data": rs.integers(0, 255, (n, 3072), dtype=np.uint8),
                "fine_labels": list(rs.integers(0, 100, n)),
                "coarse_labels": list(rs.integers(0, 20, n)),
            }
            (base / split).write_bytes(pickle.dumps(entry))


@pytest.mark.parametrize(("name", "classes"), [("cifar10", 10), ("cifar100", 100)])
def test_cifar_loaders_read_the_real_format(tmp_path, name, classes):
    write_cifar(tmp_path, name)
    cfg = load_config(
        None,
        [
            f"data.name={name}",
            f"data.root={tmp_path}",
            "data.fraction=1",
            "data.partition.num_clusters=2",
            "data.partition.clients_per_cluster=2",
        ],
    )
    d = load_data(cfg)
    assert d.train_x.shape == (100, 3, 32, 32) and d.test_x.shape == (10, 3, 32, 32)
    assert abs(float(d.train_x.mean())) < 0.5  # normalised
    assert d.num_classes == classes and d.n_clients == 4


def test_cifar_missing_files_name_the_path(tmp_path):
    cfg = load_config(None, ["data.name=cifar10", f"data.root={tmp_path}"])
    with pytest.raises(ConfigError) as info:
        load_data(cfg)
    assert "cifar-10-batches-py" in str(info.value) and "data.root" in str(info.value)


def test_mnist1d_is_generated_locally(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["data.name=mnist1d", "data.num_samples=500"])
    d = load_data(cfg)
    assert d.input_shape == (1, 40) and d.num_classes == 10
    assert list(tmp_path.iterdir()) == []  # nothing written to the working directory


def test_augmentation_is_deterministic_and_preserves_shape():
    from raycobo.data.augment import crop_flip

    x = torch.randn(2, 3, 3, 8, 8)
    keys = (0, 1, 2, torch.arange(2).view(2, 1), 0, torch.arange(3).view(1, 3))
    a, b = crop_flip(x, keys, pad=2), crop_flip(x, keys, pad=2)
    assert a.shape == x.shape and torch.equal(a, b)
    assert not torch.equal(a, x)


class _Planted:
    """A pickle that runs code when loaded by a plain pickle.load."""

    def __reduce__(self):
        import os

        return (os.system, ("echo planted > planted.txt",))


def test_cifar_reader_refuses_a_pickle_that_runs_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_cifar(tmp_path, "cifar10")
    bad = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    bad.write_bytes(pickle.dumps({"data": _Planted(), "labels": [0]}))
    cfg = load_config(None, ["data.name=cifar10", f"data.root={tmp_path}"])
    with pytest.raises(ConfigError, match=r"data_batch_3 is not a CIFAR batch.*posix\.system"):
        load_data(cfg)
    assert not (tmp_path / "planted.txt").exists()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shards_at_l2c_scale_deal_distinct_classes(seed):
    """L2C's 100 nodes: 30 shards per class, 3 distinct classes each. A plain shuffle
    nearly always deals some node a repeated class; the deal must repair that."""
    r = raw(classes=10, per_class=60)
    over = [
        "data.partition.kind=shards",
        "data.fraction=1",
        "data.partition.shards_per_class=30",
        "data.partition.classes_per_client=3",
    ]
    d = partition(r, cfg_with(*over), seed)
    assert d.n_clients == 100
    for c in range(d.n_clients):
        own = torch.cat([d.train_idx[c], d.test_idx[c]])
        assert len(set(r.train_y[own].tolist())) == 3
    again = partition(r, cfg_with(*over), seed)
    assert all(torch.equal(a, b) for a, b in zip(d.train_idx, again.train_idx, strict=True))


def test_evaluate_on_validation_scores_the_held_out_part_only():
    cfg = load_config(None, ["data.name=digits", "data.validation_fraction=0.25"])
    held = load_data(cfg)
    scored = load_data(
        load_config(
            None,
            ["data.name=digits", "data.validation_fraction=0.25", "data.evaluate_on=validation"],
        )
    )
    sizes = held.validation_sizes()
    for c in range(held.n_clients):
        tail = held.train_idx[c][len(held.train_idx[c]) - sizes[c] :]
        assert torch.equal(scored.test_idx[c], tail)
        assert torch.equal(scored.test_y[c], held.train_y[c][-sizes[c] :])
        assert not set(scored.test_idx[c].tolist()) & set(
            held.train_idx[c][: -sizes[c]].tolist()
        )  # never a sample the client trains on
    with pytest.raises(ConfigError, match="data.evaluate_on"):
        load_data(load_config(None, ["data.name=digits", "data.evaluate_on=validation"]))


def test_test_on_classes_tests_each_client_on_the_test_split_of_its_classes():
    """L2C's protocol: every own sample trains; the test data are the test split's
    samples of the client's classes (data.test_fraction of them)."""
    r = raw(classes=10, per_class=60, test_per_class=10)
    over = [
        "data.partition.kind=shards",
        "data.fraction=1",
        "data.partition.shards_per_class=6",
        "data.partition.classes_per_client=3",
        "data.partition.test_on=classes",
        "data.test_fraction=0.5",
    ]
    d = partition(r, cfg_with(*over), 0)
    own = partition(r, cfg_with(*over[:-2]), 0)
    assert d.test_x is r.test_x
    for c in range(d.n_clients):
        # the same samples as the own split's train + test, all of them training
        mine = torch.cat([own.train_idx[c], own.test_idx[c]]).sort().values
        assert torch.equal(d.train_idx[c].sort().values, mine)
        classes = set(r.train_y[d.train_idx[c]].tolist())
        assert set(d.test_y[c].tolist()) == classes
        assert torch.equal(d.test_y[c], r.test_y[d.test_idx[c]])
        assert len(d.test_idx[c]) == 3 * 10 // 2  # half of 10 test samples per class
    with pytest.raises(ConfigError, match="data.partition.test_on"):
        partition(r, cfg_with("data.partition.test_on=classes"), 0)  # label_permutation


def test_pathological_deals_pfllibs_class_pairs_unbalanced():
    """PFLlib's "pat" split of 10 classes over 20 clients with 2 classes each: clients
    4k..4k+3 hold classes {2k, 2k+1}, so five clusters of four; every sample is dealt
    once; the sizes are unbalanced; each client's samples split 75/25."""
    r = raw(per_class=200)
    d = partition(
        r,
        cfg_with(
            "data.partition.kind=pathological",
            "data.partition.num_clients=20",
            "data.partition.test_split=0.25",
            "data.fraction=1",
        ),
        0,
    )
    assert d.clusters == [k // 4 for k in range(20)]
    for k in range(20):
        classes = torch.cat([d.train_y[k], d.test_y[k]]).unique().tolist()
        assert classes == [2 * (k // 4), 2 * (k // 4) + 1]
        n = d.train_idx[k].numel() + d.test_idx[k].numel()
        assert d.test_idx[k].numel() == round(0.25 * n)
    every = torch.cat([*d.train_idx, *d.test_idx])
    assert every.numel() == 2000 and every.unique().numel() == 2000
    sizes = [d.train_idx[k].numel() + d.test_idx[k].numel() for k in range(20)]
    assert max(sizes) > 2 * min(sizes)  # not PFLlib's balanced variant


def test_pathological_without_two_alike_has_no_clusters_and_refuses_too_few():
    d = partition(
        raw(classes=4, per_class=60),
        cfg_with(
            "data.partition.kind=pathological",
            "data.partition.num_clients=2",
            "data.partition.classes_per_client=2",
            "data.fraction=1",
        ),
        0,
    )
    assert d.clusters == [None, None]  # {0, 1} and {2, 3}
    with pytest.raises(ConfigError, match="classes_per_client"):
        partition(
            raw(),
            cfg_with(
                "data.partition.kind=pathological",
                "data.partition.num_clients=3",
                "data.partition.classes_per_client=2",
            ),
            0,
        )


def test_dirichlet_min_samples_redraws_until_every_client_has_enough():
    over = [
        "data.partition.kind=dirichlet",
        "data.partition.num_clients=10",
        "data.partition.alpha=0.05",
        "data.fraction=0.2",
    ]
    with pytest.raises(ConfigError, match="0 samples"):  # one plain draw leaves one empty
        partition(raw(per_class=100), cfg_with(*over), 3)
    kept = partition(raw(per_class=100), cfg_with(*over, "data.partition.min_samples=10"), 3)
    sizes = [a.numel() + b.numel() for a, b in zip(kept.train_idx, kept.test_idx, strict=True)]
    assert min(sizes) >= 10 and sum(sizes) == 200
    with pytest.raises(ConfigError, match="min_samples"):
        partition(raw(per_class=100), cfg_with(*over, "data.partition.min_samples=25"), 3)
