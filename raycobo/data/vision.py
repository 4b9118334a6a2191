"""Image-classification datasets read from local files (never downloaded unless asked)."""

from __future__ import annotations

import gzip
import zlib
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
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise ConfigError(
            f"cannot read {path} (data.root): {type(err).__name__}: {err} -- the file is "
            "damaged or truncated; install it again"
        ) from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ConfigError(f"not an IDX file: {path}")
    dtype_code, ndim = data[2], data[3]
    if dtype_code != 0x08:
        raise ConfigError(f"unsupported IDX element type 0x{dtype_code:02x} in {path}")
    if not 1 <= ndim <= 4 or len(data) < 4 + 4 * ndim:
        raise ConfigError(f"damaged IDX header in {path}: {ndim} dimensions (data.root)")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ConfigError(
            f"truncated IDX file: {path} holds {arr.size:,} values, its header says "
            f"{' x '.join(map(str, dims))} (data.root)"
        )
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
        arrays[key] = (path, read_idx(path))
    for split in ("train", "test"):  # images and labels agree, labels are 0..9
        (px, x), (py, y) = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ConfigError(
                f"Fashion-MNIST files disagree (data.root): {px} holds {x.shape} images, "
                f"{py} {y.shape} labels"
            )
        if y.size and int(y.max()) > 9:
            raise ConfigError(f"{py} (data.root): label {int(y.max())}, Fashion-MNIST has 0..9")
    wrong = [(p, a.shape[1:]) for p, a in (arrays["train_x"], arrays["test_x"])]
    wrong = [f"{p} holds {' x '.join(map(str, s))}" for p, s in wrong if s != (28, 28)]
    if wrong:  # a header of other dimensions with the same byte count reads as other images
        raise ConfigError(f"Fashion-MNIST images are 28 x 28 (data.root): {'; '.join(wrong)}")
    arrays = {k: a for k, (_, a) in arrays.items()}

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


CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
CIFAR_LAYOUT = {
    # dataset: (folder, train files, test file, label key, classes)
    "cifar10": (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        "test_batch",
        "labels",
        10,
    ),
    "cifar100": ("cifar-100-python", ["train"], "test", "fine_labels", 100),
}


# What torchvision's CIFAR pickles contain: dicts, lists, strings, ints, and numpy arrays
# (rebuilt by numpy's _reconstruct from an ndarray type and a dtype). Nothing else is
# admitted, so a file planted under data.root cannot run code when it is read.
_CIFAR_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # bytes in protocol-2 pickles written by Python 3
}


def _read_cifar_pickle(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    import pickle

    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if (module, name) not in _CIFAR_GLOBALS:
                raise pickle.UnpicklingError(f"{module}.{name} is not part of a CIFAR file")
            return super().find_class(module, name)

    try:
        with path.open("rb") as f:
            entry = Restricted(f, encoding="latin1").load()
        data = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(entry[label_key], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(
            f"{path} is not a CIFAR batch in torchvision's format (data.root): {err}"
        ) from None
    return data, labels


def load_cifar(cfg: DataConfig, name: str) -> RawDataset:
    """CIFAR-10/100 from torchvision's on-disk layout (the python pickles) under
    ``data.root``; ``data.download: true`` fetches them with torchvision first."""
    folder, train_files, test_file, label_key, classes = CIFAR_LAYOUT[name]
    root = Path(cfg.root or "data")
    base = root / folder
    if not base.is_dir() and cfg.download:
        import torchvision

        ds = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
        ds(str(root), train=True, download=True)
    missing = [f for f in [*train_files, test_file] if not (base / f).is_file()]
    if missing:
        raise ConfigError(
            f"{name} files {', '.join(missing)} not found under {base} (data.root): "
            "put torchvision's python-version archive there, or set data.download=true"
        )
    parts = [_read_cifar_pickle(base / f, label_key) for f in train_files]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = _read_cifar_pickle(base / test_file, label_key)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in CIFAR_STATS[name])

    def images(a: np.ndarray) -> torch.Tensor:
        return (torch.from_numpy(a).float() / 255.0 - mean) / std

    return RawDataset(
        name,
        images(train_x),
        torch.from_numpy(train_y),
        images(test_x),
        torch.from_numpy(test_y),
        classes,
    )


def load_mnist1d(cfg: DataConfig, seed: int) -> RawDataset:
    """mnist1d generated locally with the package's ``make_dataset`` (never its download
    path, which also writes into the working directory)."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = cfg.num_samples or 5000
    args.seed = seed
    d = make_dataset(args)
    x = torch.from_numpy(np.asarray(d["x"], dtype=np.float32)).unsqueeze(1)  # (N, 1, 40)
    xt = torch.from_numpy(np.asarray(d["x_test"], dtype=np.float32)).unsqueeze(1)
    y = torch.from_numpy(np.asarray(d["y"], dtype=np.int64))
    yt = torch.from_numpy(np.asarray(d["y_test"], dtype=np.int64))
    return RawDataset("mnist1d", x, y, xt, yt, 10)
