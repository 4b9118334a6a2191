"""Your own data from files: plain arrays (``data.name: arrays``) and image folders
(``data.name: image_folder``).

``arrays`` reads ``data.path``:

- one ``.npz`` or ``.pt`` file with ``x_train``, ``y_train``, ``x_test``, ``y_test`` (or
  just ``x`` and ``y``, split into train and test by ``data.partition.test_split``): a
  centralized data set, partitioned among clients by ``data.partition`` like the built-in
  ones;
- a folder of such files, one per client (sorted by name), each with ``x`` and ``y``
  (and ``x_test``/``y_test``, else split by ``data.partition.test_split``) and optionally
  ``cluster`` (an integer: the client's ground-truth group): the clients as given.

Features are float arrays of any shape (N, ...) used as they are (normalize them
beforehand); labels are integers 0..C-1. ``.pt`` files are read with
``torch.load(weights_only=True)`` and ``.npz`` files without pickles: no code runs from a
data file.

``image_folder`` reads torchvision's ``ImageFolder`` layout under ``data.root``: one folder
per class, either under ``train/`` and ``test/`` or directly under the root (then split
by ``data.partition.test_split``); classes are the sorted folder names. Images are
resized to ``data.image_size`` when it is set (else they must all have one size) and
normalized per channel with the training images' mean and std.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from raycobo.config import ConfigError, DataConfig
from raycobo.data.base import FederatedData, RawDataset

ARRAY_SUFFIXES = (".npz", ".pt")


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: np.asarray(z[k]) for k in z.files}
        tree = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - damaged, truncated or foreign: one line
        raise ConfigError(
            f"cannot read {path} (data.path): {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'unreadable'}"
        ) from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} (data.path) holds a {type(tree).__name__}, not a mapping")
    return {k: v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in tree.items()}


def _xy(arrays: dict[str, np.ndarray], x: str, y: str, path: Path):
    if x not in arrays or y not in arrays:
        have = ", ".join(arrays) or "none"
        raise ConfigError(f"{path} (data.path) needs arrays '{x}' and '{y}' (it has {have})")
    xs, ys = arrays[x], arrays[y]
    if xs.ndim == 0 or xs.shape[0] == 0:
        raise ConfigError(f"{path} (data.path): '{x}' holds no rows")
    if not (np.issubdtype(xs.dtype, np.number) or xs.dtype == np.bool_):
        raise ConfigError(f"{path} (data.path): features '{x}' are {xs.dtype}, not numbers")
    if not np.isfinite(xs).all():
        raise ConfigError(f"{path} (data.path): features '{x}' hold NaN or infinite values")
    if xs.shape[0] != ys.shape[0] or ys.ndim != 1:
        raise ConfigError(
            f"{path} (data.path): '{x}' has {xs.shape[0]} rows but '{y}' has shape {ys.shape}"
        )
    if not np.issubdtype(ys.dtype, np.integer) or (ys.size and ys.min() < 0):
        raise ConfigError(f"{path} (data.path): labels '{y}' must be integers 0..C-1")
    return torch.from_numpy(xs.astype(np.float32)), torch.from_numpy(ys.astype(np.int64))


def _same_shape(path: Path, x: torch.Tensor, xt: torch.Tensor, a: str, b: str) -> None:
    if x.shape[1:] != xt.shape[1:]:
        raise ConfigError(
            f"{path} (data.path): '{a}' rows are {tuple(x.shape[1:])}, '{b}' rows "
            f"{tuple(xt.shape[1:])}"
        )


def _split(x: torch.Tensor, y: torch.Tensor, share: float, seed: int):
    """(train x, train y, test x, test y): a seeded ``share`` of the rows for testing."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    n_test = min(max(1, int(round(share * len(y)))), len(y) - 1)
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


# without data.num_classes, the class count is the largest label + 1, up to this: a label
# of 10^9 would otherwise make the output layer 10^9 wide (gigabytes) before anything ran
MAX_INFERRED_CLASSES = 10_000


def _classes(where: Path, declared: int | None, *labels: torch.Tensor) -> int:
    """C: ``declared`` (data.num_classes), checked against the labels, or the largest
    label + 1 within MAX_INFERRED_CLASSES."""
    top = max((int(y.max()) for y in labels if y.numel()), default=0)
    if declared is not None:
        if top >= declared:
            raise ConfigError(
                f"{where} (data.path): label {top} is out of range for data.num_classes = "
                f"{declared} (labels 0..{declared - 1})"
            )
        return declared
    if top + 1 > MAX_INFERRED_CLASSES:
        raise ConfigError(
            f"{where} (data.path): the largest label is {top}, so {top + 1:,} classes: "
            f"relabel to 0..C-1, or declare data.num_classes (above {MAX_INFERRED_CLASSES:,})"
        )
    return top + 1


def load_arrays(cfg: DataConfig, seed: int) -> RawDataset | FederatedData:
    if cfg.path is None:
        raise ConfigError("invalid config key 'data.path': data.name=arrays reads a file or folder")
    path = Path(cfg.path).expanduser()
    if path.is_dir():
        return _client_files(path, cfg, seed)
    if not path.is_file() or path.suffix not in ARRAY_SUFFIXES:
        raise ConfigError(
            f"invalid config key 'data.path': {path} is not a .npz or .pt file, nor a folder"
        )
    arrays = _read_arrays(path)
    if "x_train" in arrays:
        x, y = _xy(arrays, "x_train", "y_train", path)
        xt, yt = _xy(arrays, "x_test", "y_test", path)
        _same_shape(path, x, xt, "x_train", "x_test")
    else:
        x, y, xt, yt = _split(*_xy(arrays, "x", "y", path), cfg.partition.test_split, seed)
    return RawDataset(path.stem, x, y, xt, yt, _classes(path, cfg.num_classes, y, yt))


def _client_files(folder: Path, cfg: DataConfig, seed: int) -> FederatedData:
    """One client per file: its own train and test data, its cluster if the file says."""
    from raycobo.config import PartitionConfig

    files = sorted(p for p in folder.iterdir() if p.suffix in ARRAY_SUFFIXES)
    if not files:
        raise ConfigError(f"invalid config key 'data.path': {folder} holds no .npz or .pt file")
    defaults = PartitionConfig(test_split=cfg.partition.test_split)
    if cfg.partition != defaults:
        raise ConfigError(
            "invalid config key 'data.partition': with one file per client (data.path is "
            "a folder) the files are the partition; only partition.test_split is used"
        )
    parts, clusters = [], []
    for c, f in enumerate(files):
        arrays = _read_arrays(f)
        x, y = _xy(arrays, "x", "y", f)
        if "x_test" in arrays:
            parts.append((x, y, *_xy(arrays, "x_test", "y_test", f)))
            _same_shape(f, x, parts[-1][2], "x", "x_test")
        else:
            if len(x) < 2:
                raise ConfigError(f"{f} (data.path): one row cannot be split into train and test")
            parts.append(_split(x, y, cfg.partition.test_split, seed * 100_003 + c))
        cluster = arrays.get("cluster")
        if cluster is not None and (
            cluster.ndim != 0 or not np.issubdtype(cluster.dtype, np.integer)
        ):
            raise ConfigError(
                f"{f} (data.path): 'cluster' must be one integer, got {cluster.dtype} of shape "
                f"{cluster.shape}"
            )
        clusters.append(int(cluster) if cluster is not None else None)
    if len({p[0].shape[1:] for p in parts}) > 1:
        raise ConfigError(f"invalid config key 'data.path': the files in {folder} differ in shape")
    return _pooled(folder, parts, clusters, cfg.num_classes)


def _pooled(
    folder: Path, parts: list, clusters: list[int | None], num_classes: int | None
) -> FederatedData:
    """Per-client (x, y, x_test, y_test) in one feature pool with index views."""
    train_idx, test_idx, a, b = [], [], 0, 0
    for x, _, xt, _ in parts:
        train_idx.append(torch.arange(a, a + len(x)))
        test_idx.append(torch.arange(b, b + len(xt)))
        a, b = a + len(x), b + len(xt)
    if any(c is None for c in clusters):
        clusters = [None] * len(parts)
    return FederatedData(
        folder.name,
        torch.cat([p[0] for p in parts]),
        torch.cat([p[2] for p in parts]),
        train_idx,
        [p[1] for p in parts],
        test_idx,
        [p[3] for p in parts],
        clusters,
        _classes(folder, num_classes, *[p[1] for p in parts], *[p[3] for p in parts]),
    )


def load_image_folder(cfg: DataConfig, seed: int) -> RawDataset:
    from torchvision.datasets import ImageFolder

    if cfg.root is None:
        raise ConfigError(
            "invalid config key 'data.root': data.name=image_folder reads class folders there"
        )
    root = Path(cfg.root).expanduser()
    split = (root / "train").is_dir() and (root / "test").is_dir()
    try:
        sets = (
            [ImageFolder(str(root / s)) for s in ("train", "test")]
            if split
            else [ImageFolder(str(root))]
        )
    except (FileNotFoundError, OSError) as err:
        raise ConfigError(f"invalid config key 'data.root': {root}: {err}") from None
    if split and sets[0].classes != sets[1].classes:
        raise ConfigError(
            f"invalid config key 'data.root': {root}/train and test have other classes"
        )
    tensors = [_images(s, cfg.image_size) for s in sets]
    if split:
        (x, y), (xt, yt) = tensors
    else:
        x, y, xt, yt = _split(*tensors[0], cfg.partition.test_split, seed)
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    std = x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return RawDataset(root.name, (x - mean) / std, y, (xt - mean) / std, yt, len(sets[0].classes))


def _images(dataset, size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every image of an ImageFolder as (N, C, H, W) floats in [0, 1], with its labels."""
    from torchvision.transforms.functional import pil_to_tensor, resize

    xs, ys, shape = [], [], None
    for path, label in dataset.samples:
        try:
            img = dataset.loader(path)
        except Exception as err:  # noqa: BLE001 - a damaged image: name it
            raise ConfigError(f"cannot read image {path} (data.root): {err}") from None
        x = pil_to_tensor(img.convert("RGB") if img.mode not in ("L", "RGB") else img)
        if size is not None:
            x = resize(x, [size, size], antialias=True)
        if shape is None:
            shape = x.shape
        elif x.shape != shape:
            raise ConfigError(
                f"image {path} is {tuple(x.shape)}, others {tuple(shape)}: set data.image_size "
                "to resize them all"
            )
        xs.append(x)
        ys.append(label)
    if not xs:
        raise ConfigError(f"invalid config key 'data.root': no images under {dataset.root}")
    return torch.stack(xs).float() / 255.0, torch.tensor(ys, dtype=torch.int64)
