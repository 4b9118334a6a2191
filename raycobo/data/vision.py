"""Image-classification datasets read from local files (never downloaded unless asked)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from raycobo.config import DEFAULT_FASHION_MNIST_ROOT, ConfigError, DataConfig
from raycobo.data.base import RawDataset

FASHION_MNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ConfigError(f"not an IDX file: {path}")
    dtype_code, ndim = data[2], data[3]
    if dtype_code != 0x08:
        raise ConfigError(f"unsupported IDX element type 0x{dtype_code:02x} in {path}")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ConfigError(f"truncated IDX file: {path}")
    return arr.reshape(dims)


def _find(root: Path, stem: str) -> Path | None:
    for cand in (root / f"{stem}.gz", root / stem, root / "FashionMNIST" / "raw" / stem):
        if cand.is_file():
            return cand
    return None


def fashion_mnist_available(root: str | None = None) -> bool:
    r = Path(root or DEFAULT_FASHION_MNIST_ROOT)
    return all(_find(r, s) is not None for s in FASHION_MNIST_FILES.values())


def load_fashion_mnist(cfg: DataConfig) -> RawDataset:
    root = Path(cfg.root or DEFAULT_FASHION_MNIST_ROOT)
    if not fashion_mnist_available(str(root)) and cfg.download:
        import torchvision

        torchvision.datasets.FashionMNIST(str(root), train=True, download=True)
        torchvision.datasets.FashionMNIST(str(root), train=False, download=True)
    arrays = {}
    for key, stem in FASHION_MNIST_FILES.items():
        path = _find(root, stem)
        if path is None:
            raise ConfigError(
                f"Fashion-MNIST file {stem}[.gz] not found under {root} (data.root): "
                "install Debian's dataset-fashion-mnist, or set data.download=true"
            )
        arrays[key] = read_idx(path)

    def images(a: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1)  # (N, 1, 28, 28)
        return (x - FASHION_MNIST_MEAN) / FASHION_MNIST_STD

    return RawDataset(
        "fashion_mnist",
        images(arrays["train_x"]),
        torch.from_numpy(arrays["train_y"].astype(np.int64)),
        images(arrays["test_x"]),
        torch.from_numpy(arrays["test_y"].astype(np.int64)),
        10,
    )


def load_digits(cfg: DataConfig, seed: int) -> RawDataset:
    """sklearn's 8x8 digits (ships with scikit-learn), split 80/20 with ``seed``."""
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = torch.from_numpy((d.images / 16.0).astype(np.float32)).unsqueeze(1)  # (1797, 1, 8, 8)
    x = (x - x.mean()) / x.std()
    y = torch.from_numpy(d.target.astype(np.int64))
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    n_test = len(y) // 5
    te, tr = perm[:n_test], perm[n_test:]
    return RawDataset("digits", x[tr], y[tr], x[te], y[te], 10)
