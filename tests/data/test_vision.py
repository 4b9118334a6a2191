"""Image loaders on tiny files in the real on-disk format, and the label-permutation
partition's invariants."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from raycobo.config import ConfigError, load_config
from raycobo.data import load_data
from raycobo.data.vision import read_idx


def write_idx(path, arr: np.ndarray, gz: bool) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    payload = header + arr.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


@pytest.fixture
def tiny_fashion(tmp_path):
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "train-images-idx3-ubyte", rng.integers(0, 255, (60, 28, 28)), gz=True)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.arange(60) % 10, gz=True)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", rng.integers(0, 255, (20, 28, 28)), gz=False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.arange(20) % 10, gz=False)
    return tmp_path


def test_read_idx_roundtrip(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a", arr, gz=False)
    write_idx(tmp_path / "b", arr, gz=True)
    assert np.array_equal(read_idx(tmp_path / "a"), arr)
    assert np.array_equal(read_idx(tmp_path / "b.gz"), arr)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ConfigError, match="bad"):
        read_idx(tmp_path / "bad")


def test_damaged_fashion_mnist_files_name_the_file(tiny_fashion):
    """A damaged IDX header, a label file shorter than its images and a label of 200 each
    stop at load with one line naming the file (they were a raw ValueError, a message
    blaming data.fraction and an IndexError mid-run)."""
    cfg = load_config(None, ["data.name=fashion_mnist", f"data.root={tiny_fashion}"])
    labels = tiny_fashion / "t10k-labels-idx1-ubyte"
    good = labels.read_bytes()
    cases = [
        (bytes([0, 0, 0x08, 0xFF, 0, 0]), "damaged IDX header in .*t10k-labels"),
        (None, r"disagree .*t10k-images.* \(20, 28, 28\) images, .*t10k-labels.* \(19,\)"),
        (None, r"t10k-labels-idx1-ubyte \(data.root\): label 200, Fashion-MNIST has 0..9"),
    ]
    short = np.arange(19) % 10
    wrong = np.arange(20) % 10
    wrong[5] = 200
    for (raw, needle), arr in zip(cases, [None, short, wrong], strict=True):
        if raw is not None:
            labels.write_bytes(raw)
        else:
            write_idx(labels, arr, gz=False)
        with pytest.raises(ConfigError, match=needle):
            load_data(cfg)
    labels.write_bytes(good)
    assert load_data(cfg).n_clients > 0


def test_fashion_mnist_of_other_shapes_or_damaged_inside_the_gzip_is_named(tiny_fashion):
    """(#70 item 5) A header rewritten from 28 x 28 to 14 x 56 (the same bytes) was read as
    images of another shape than the test set's; bytes flipped inside the .gz ended with
    a raw zlib.error. Each stops at load, naming the file."""
    cfg = load_config(None, ["data.name=fashion_mnist", f"data.root={tiny_fashion}"])
    images = tiny_fashion / "train-images-idx3-ubyte.gz"
    good = images.read_bytes()
    raw = bytearray(gzip.decompress(good))
    raw[8:16] = (14).to_bytes(4, "big") + (56).to_bytes(4, "big")
    images.write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(ConfigError, match=r"28 x 28 .*train-images-idx3-ubyte.gz holds 14 x 56"):
        load_data(cfg)
    flipped = bytearray(gzip.compress(gzip.decompress(good)))  # a 10-byte gzip header
    flipped[10] ^= 0xFF  # the deflate stream's first block header: zlib.error
    images.write_bytes(bytes(flipped))
    with pytest.raises(
        ConfigError, match=r"cannot read .*train-images-idx3-ubyte.gz \(data.root\): error"
    ):
        load_data(cfg)
    images.write_bytes(good)
    assert load_data(cfg).n_clients > 0


def test_fashion_mnist_loader_and_label_permutation(tiny_fashion):
    cfg = load_config(
        None,
        [
            "data.name=fashion_mnist",
            f"data.root={tiny_fashion}",
            "data.fraction=0.5",
            "data.partition.clients_per_cluster=[2,3]",
        ],
    )
    data = load_data(cfg)
    assert data.train_x.shape == (60, 1, 28, 28)
    assert data.n_clients == 5
    assert data.clusters == [0, 0, 1, 1, 1]
    # each cluster shares fraction * N samples, split evenly and disjointly
    for members in ([0, 1], [2, 3, 4]):
        idx = torch.cat([data.train_idx[c] for c in members])
        assert idx.numel() == 30 and idx.unique().numel() == 30
    # one permutation per cluster, applied to train and test alike
    raw_train = torch.arange(60) % 10
    raw_test = torch.arange(20) % 10
    perms = []
    for c in range(5):
        perm = torch.full((10,), -1)
        perm[raw_train[data.train_idx[c]]] = data.train_y[c]
        perm_t = torch.full((10,), -1)
        perm_t[raw_test[data.test_idx[c]]] = data.test_y[c]
        seen = perm_t >= 0
        assert torch.equal(perm[seen & (perm >= 0)], perm_t[seen & (perm >= 0)])
        perms.append(perm_t)
    assert torch.equal(perms[0], perms[1]) and torch.equal(perms[2], perms[4])
    assert not torch.equal(perms[0], perms[2])


def test_missing_fashion_files_name_the_path(tmp_path):
    cfg = load_config(None, ["data.name=fashion_mnist", f"data.root={tmp_path}"])
    with pytest.raises(ConfigError) as info:
        load_data(cfg)
    assert str(tmp_path) in str(info.value) and "data.root" in str(info.value)


def test_digits_partition_and_bad_names():
    cfg = load_config(None, ["data.name=digits", "data.fraction=0.2"])
    data = load_data(cfg)
    assert data.n_clients == 8 and data.input_shape == (1, 8, 8)
    with pytest.raises(ConfigError, match="data.name"):
        load_data(load_config(None, ["data.name=imagenet"]))
    with pytest.raises(ConfigError, match="data.partition.kind"):
        load_data(load_config(None, ["data.name=digits", "data.partition.kind=zigzag"]))
    with pytest.raises(ConfigError, match="data.fraction"):
        load_data(
            load_config(
                None,
                ["data.name=digits", "data.fraction=0.001", "data.partition.clients_per_cluster=5"],
            )
        )
