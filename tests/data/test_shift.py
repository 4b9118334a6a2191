"""Feature shift: each cluster's inputs turned by its own symmetry of the square, or its
pixels in their own fixed order, the labels as the partition made them; refused where it
would do nothing or cannot act."""

from __future__ import annotations

import pytest
import torch

from raycobo.config import ConfigError, load_config
from raycobo.data import load_data
from raycobo.data.partition import partition
from raycobo.data.shift import permutation, shift_features, symmetry
from tests.data.test_partitions import cfg_with, raw


def test_the_eight_symmetries_by_hand():
    """On a 2x2 image [[a, b], [c, d]]: turned 90 degrees counter-clockwise (torch.rot90)
    it is [[b, d], [a, c]]; the eight are distinct, and the k >= 4 ones are transposes."""
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2)
    assert symmetry(x, 0).flatten().tolist() == [1, 2, 3, 4]
    assert symmetry(x, 1).flatten().tolist() == [2, 4, 1, 3]
    assert symmetry(x, 2).flatten().tolist() == [4, 3, 2, 1]
    assert symmetry(x, 4).flatten().tolist() == [1, 3, 2, 4]  # the transpose
    images = {tuple(symmetry(x, k).flatten().tolist()) for k in range(8)}
    assert len(images) == 8


def test_clusters_keep_the_labels_and_rotate_sees_each_sample_turned():
    """The clusters partition draws label_permutation's clusters without relabelling; with
    rotate, client c of cluster k sees its own samples turned by symmetry k, train and
    test, with the same labels."""
    r = raw()
    cfg = cfg_with(
        "data.partition.kind=clusters",
        "data.partition.num_clusters=3",
        "data.partition.clients_per_cluster=2",
        "data.fraction=0.5",
    )
    plain = partition(r, cfg, seed=0)
    assert plain.clusters == [0, 0, 1, 1, 2, 2]
    for i, y in zip(plain.train_idx, plain.train_y, strict=True):
        assert torch.equal(y, r.train_y[i])  # no label shift
    shifted = shift_features(plain, "rotate")
    for c, k in enumerate(plain.clusters):
        want = symmetry(r.train_x[plain.train_idx[c]], k)
        assert torch.equal(shifted.train_x[shifted.train_idx[c]], want)
        assert torch.equal(shifted.train_y[c], plain.train_y[c])
        want_test = symmetry(r.test_x[plain.test_idx[c]], k)
        assert torch.equal(shifted.test_x[shifted.test_idx[c]], want_test)
    # one copy of the rows each cluster uses: the clients of a cluster share its test rows
    assert shifted.test_x.shape[0] == 3 * plain.test_idx[0].numel()


DIGITS4 = [
    "data.name=digits",
    "data.fraction=0.2",
    "data.partition.num_clusters=2",
    "data.partition.clients_per_cluster=2",
    "data.validation_fraction=0.2",
]


@pytest.mark.parametrize(("kind", "transform"), [("rotate", symmetry), ("permute", permutation)])
def test_a_mixture_of_label_and_feature_shift_and_the_loaded_digits(kind, transform):
    """label_permutation with a feature shift: both shifts; through load_data (digits, a
    holdout): the same clients, labels and validation parts as without it, each
    cluster's images transformed by its own transform (train and test)."""
    data = load_data(load_config(None, [*DIGITS4, f"data.feature_shift={kind}"]))
    plain = load_data(load_config(None, DIGITS4))
    for c in range(4):
        k = data.clusters[c]
        assert torch.equal(data.train_y[c], plain.train_y[c])
        assert torch.equal(
            data.train_x[data.train_idx[c]], transform(plain.train_x[plain.train_idx[c]], k)
        )
        assert torch.equal(
            data.test_x[data.test_idx[c]], transform(plain.test_x[plain.test_idx[c]], k)
        )
    assert data.val_sizes == plain.val_sizes


QUADRATIC = ["data.name=quadratic"]
DIRICHLET = ["data.partition.kind=dirichlet", "data.partition.num_clients=4"]


@pytest.mark.parametrize(
    ("kind", "over", "message"),
    [
        ("rotate", QUADRATIC, "quadratic has no images or features"),
        ("permute", QUADRATIC, "quadratic has no images or features"),
        ("rotate", DIRICHLET, "no clusters"),
        ("permute", DIRICHLET, "no clusters"),
        ("rotate", ["data.name=mnist1d", "data.num_samples=400"], "square CxHxW images"),
        (
            "rotate",
            ["data.partition.num_clusters=9", "data.partition.clients_per_cluster=1"],
            "9 clusters",
        ),
    ],
)
def test_a_feature_shift_is_refused_where_it_cannot_act(kind, over, message):
    cfg = load_config(None, ["data.name=digits", f"data.feature_shift={kind}", *over])
    with pytest.raises(ConfigError, match=rf"'data.feature_shift'.*{message}"):
        load_data(cfg)


def test_the_fraction_note_knows_clusters_draws_per_cluster():
    """data.fraction is each cluster's share under clusters, as under label_permutation:
    the run's data note says so only for the partitions that divide one share."""
    from raycobo.data.report import warnings

    def notes(kind: str) -> list[str]:
        cfg = load_config(None, ["data.name=digits", f"data.partition.kind={kind}"])
        return [w for w in warnings({"train": {}}, cfg) if w.startswith("note")]

    assert notes("clusters") == [] and notes("label_permutation") == []
    assert "each cluster's share" in notes("dirichlet")[0]


def test_permute_moves_each_clusters_pixels_in_its_own_fixed_order():
    """On two 2-channel 3x3 images: cluster 0 sees its inputs as they are; any other
    cluster a permutation of their positions, the same on every channel, the same in
    every call, and another for each cluster; a sequence (N, C, L) or (N, L) too."""
    x = torch.arange(2 * 2 * 3 * 3, dtype=torch.float32).reshape(2, 2, 3, 3)
    assert torch.equal(permutation(x, 0), x)
    orders = []
    for k in (1, 2, 3):
        y = permutation(x, k)
        assert torch.equal(y, permutation(x, k))  # fixed: k alone decides it
        flat_x, flat_y = x.reshape(2, 2, 9), y.reshape(2, 2, 9)
        # a permutation of the positions: each output position holds an input's value
        order = [flat_x[0, 0].tolist().index(v) for v in flat_y[0, 0].tolist()]
        assert sorted(order) == list(range(9)) and order != list(range(9))
        assert torch.equal(flat_y, flat_x[..., order])  # every sample, every channel
        orders.append(tuple(order))
    assert len(set(orders)) == 3
    seq = torch.randn(5, 1, 40)
    assert torch.equal(permutation(seq, 2).squeeze(1), permutation(seq.squeeze(1), 2))


def test_permute_takes_mnist1d_sequences_where_rotate_refuses_them():
    """mnist1d's (N, 1, 40) sequences through load_data: each cluster's steps in its own
    order."""
    seq = ["data.name=mnist1d", "data.num_samples=400"]
    shifted = load_data(load_config(None, [*seq, "data.feature_shift=permute"]))
    base = load_data(load_config(None, seq))
    c = shifted.clusters.index(1)
    assert torch.equal(
        shifted.train_x[shifted.train_idx[c]], permutation(base.train_x[base.train_idx[c]], 1)
    )
