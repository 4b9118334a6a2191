"""Feature shift: clusters that differ in their inputs, not (only) in their labels.

``data.feature_shift: rotate`` transforms every input of cluster k by the k-th symmetry
of the square (k = 0..7: rotations by 0, 90, 180 and 270 degrees, then those rotations
of the transposed image), as in the rotated-MNIST clusters of IFCA (Ghosh et al. 2020,
Section 5.2) and the feature-shift studies after it. The labels stay as the partition
made them: over ``data.partition.kind: clusters`` (one label distribution for all) the
clusters differ in their features alone; over ``label_permutation`` in both.

The features are shared by all clients (``FederatedData.train_x``); a shifted data set
holds one transformed copy of the rows each cluster uses, and every client's indices
point into its cluster's copy.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from raycobo.config import ConfigError
from raycobo.data.base import FederatedData, compact_rows

SYMMETRIES = 8  # the square's: 4 rotations, each with and without a transpose


def symmetry(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th symmetry of the square on images (N, C, H, W), H == W: a rotation by
    (k mod 4) x 90 degrees, of the transposed images where k >= 4."""
    if k >= 4:
        x = x.transpose(-2, -1)
    return torch.rot90(x, k % 4, dims=(-2, -1)).contiguous()


def shift_features(data: FederatedData, kind: str) -> FederatedData:
    """``data`` with cluster k's inputs transformed by its symmetry (``kind``: none or
    rotate); ConfigError naming data.feature_shift where the data cannot take it."""
    if kind == "none":
        return data
    key = "invalid config key 'data.feature_shift'"
    shape = tuple(data.train_x.shape[1:])
    if len(shape) != 3 or shape[1] != shape[2]:
        raise ConfigError(f"{key}: rotate needs square CxHxW images, {data.name} has {shape}")
    if any(c is None for c in data.clusters):
        raise ConfigError(
            f"{key}: rotate transforms each cluster's inputs, and this partition has no "
            "clusters (data.partition.kind: clusters or label_permutation has)"
        )
    clusters = sorted(set(data.clusters))
    if len(clusters) > SYMMETRIES:
        raise ConfigError(
            f"{key}: rotate has {SYMMETRIES} distinct transforms, the partition has "
            f"{len(clusters)} clusters"
        )
    train_x, train_idx = _per_cluster(data.train_x, data.train_idx, data.clusters, clusters)
    test_x, test_idx = _per_cluster(data.test_x, data.test_idx, data.clusters, clusters)
    return replace(data, train_x=train_x, train_idx=train_idx, test_x=test_x, test_idx=test_idx)


def _per_cluster(
    pool: torch.Tensor, idx: list[torch.Tensor], of: list, clusters: list[int]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One transformed copy of the rows each cluster's clients use, the k-th cluster's by
    symmetry k, and the clients' indices into it."""
    blocks, out, start = [], list(idx), 0
    for k, cluster in enumerate(clusters):
        members = [c for c, of_c in enumerate(of) if of_c == cluster]
        rows, within = compact_rows(pool, [idx[c] for c in members])
        blocks.append(symmetry(rows, k))
        for c, i in zip(members, within, strict=True):
            out[c] = start + i
        start += rows.shape[0]
    return torch.cat(blocks), out
