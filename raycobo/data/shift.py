"""Feature shift: clusters that differ in their inputs, not (only) in their labels.

Every input of cluster k is transformed by the k-th transform of ``data.feature_shift``'s
kind (cluster 0's is the identity):

- ``rotate``: the k-th symmetry of the square (k = 0..7: rotations by 0, 90, 180 and 270
  degrees, then those rotations of the transposed image), as in the rotated-MNIST
  clusters of IFCA (Ghosh et al. 2020, Section 5.2) and the feature-shift studies after
  it. Square images, at most 8 clusters.
- ``permute``: the k-th fixed permutation of the input's positions (an image's pixels,
  the same on every channel; a sequence's steps), as in permuted MNIST: nothing of a
  cluster's spatial layout is left for another's, though each cluster's task is as hard
  as the plain one. The permutations are the same in every run (they depend on k alone),
  any number of clusters, any input shape.

The labels stay as the partition made them: over ``data.partition.kind: clusters`` (one
label distribution for all) the clusters differ in their features alone; over
``label_permutation`` in both.

The features are shared by all clients (``FederatedData.train_x``); a shifted data set
holds one transformed copy of the rows each cluster uses, and every client's indices
point into its cluster's copy.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from raycobo.config import ConfigError
from raycobo.data.base import FederatedData, compact_rows

SYMMETRIES = 8  # the square's: 4 rotations, each with and without a transpose
PERMUTATION_SEED = 20_100  # cluster k's permutation: drawn from seed PERMUTATION_SEED + k


def symmetry(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th symmetry of the square on images (N, C, H, W), H == W: a rotation by
    (k mod 4) x 90 degrees, of the transposed images where k >= 4."""
    if k >= 4:
        x = x.transpose(-2, -1)
    return torch.rot90(x, k % 4, dims=(-2, -1)).contiguous()


def permutation(x: torch.Tensor, k: int) -> torch.Tensor:
    """Inputs (N, C, *positions) with their positions in the k-th fixed order (the same
    on every channel; k = 0: as they are), or (N, L) with their L values in it."""
    if k == 0:
        return x
    flat = x.reshape(x.shape[0], x.shape[1], -1) if x.dim() > 2 else x.unsqueeze(1)
    order = torch.randperm(
        flat.shape[-1], generator=torch.Generator().manual_seed(PERMUTATION_SEED + k)
    )
    return flat[..., order].reshape(x.shape).contiguous()


TRANSFORMS = {"rotate": symmetry, "permute": permutation}


def _refusal(kind: str, shape: tuple[int, ...], name: str, clusters: int) -> str | None:
    """Why ``kind`` cannot transform ``clusters`` clusters of inputs shaped ``shape``
    (None: it can)."""
    if kind == "rotate":
        if len(shape) != 3 or shape[1] != shape[2]:
            return f"rotate needs square CxHxW images, {name} has {shape}"
        if clusters > SYMMETRIES:
            return (
                f"rotate has {SYMMETRIES} distinct transforms, the partition has "
                f"{clusters} clusters"
            )
    elif kind == "permute" and math.prod(shape[1:] if len(shape) > 1 else shape) < 2:
        return f"permute needs inputs of at least 2 positions, {name} has {shape}"
    return None


def shift_features(data: FederatedData, kind: str) -> FederatedData:
    """``data`` with cluster k's inputs transformed by the k-th transform of ``kind``
    (none, rotate or permute); ConfigError naming data.feature_shift where the data
    cannot take it."""
    if kind == "none":
        return data
    key = "invalid config key 'data.feature_shift'"
    if any(c is None for c in data.clusters):
        raise ConfigError(
            f"{key}: {kind} transforms each cluster's inputs, and this partition has no "
            "clusters (data.partition.kind: clusters or label_permutation has)"
        )
    clusters = sorted(set(data.clusters))
    why = _refusal(kind, tuple(data.train_x.shape[1:]), data.name, len(clusters))
    if why:
        raise ConfigError(f"{key}: {why}")
    transform = TRANSFORMS[kind]
    train_x, train_idx = _per_cluster(
        data.train_x, data.train_idx, data.clusters, clusters, transform
    )
    test_x, test_idx = _per_cluster(data.test_x, data.test_idx, data.clusters, clusters, transform)
    return replace(data, train_x=train_x, train_idx=train_idx, test_x=test_x, test_idx=test_idx)


def _per_cluster(
    pool: torch.Tensor, idx: list[torch.Tensor], of: list, clusters: list[int], transform
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One transformed copy of the rows each cluster's clients use, the k-th cluster's by
    ``transform(rows, k)``, and the clients' indices into it."""
    blocks, out, start = [], list(idx), 0
    for k, cluster in enumerate(clusters):
        members = [c for c, of_c in enumerate(of) if of_c == cluster]
        rows, within = compact_rows(pool, [idx[c] for c in members])
        blocks.append(transform(rows, k))
        for c, i in zip(members, within, strict=True):
            out[c] = start + i
        start += rows.shape[0]
    return torch.cat(blocks), out
