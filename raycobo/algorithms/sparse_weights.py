"""CoBo's box-domain W at large n: a constant plus the entries that were ever updated.

With the box domain W starts at the all-ones matrix and Eq. (1) only changes the sampled
entries, so W = base * 1 1^T + D with D nonzero only on edges sampled so far. Storing D
as sorted (i < j) keys costs O(edges sampled) memory instead of O(n^2), and the model
step's W X = base * (1^T X) + D X costs O(n d + nnz d) instead of O(n^2 d). With
constant sampling (p = c / n, about c n / 2 edges a round) a run of T rounds stores at
most c n T / 2 entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raycobo.algorithms.base import mass_inside


@dataclass
class SparseBoxWeights:
    n: int
    keys: torch.Tensor  # (nnz,) sorted int64 keys i * n + j, i < j
    vals: torch.Tensor  # (nnz,) the stored w_ij (= w_ji)
    base: float = 1.0  # every entry not stored, the diagonal included

    @classmethod
    def ones(cls, n: int, device: torch.device | None = None) -> SparseBoxWeights:
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return cls(n, empty, torch.empty(0, device=device))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.n)

    @property
    def nnz(self) -> int:
        return int(self.keys.numel())

    def _pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys // self.n, self.keys % self.n

    def get(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """w_ij for pairs with i < j. -> (E,)"""
        k = i * self.n + j
        pos = torch.searchsorted(self.keys, k).clamp(max=max(self.nnz - 1, 0))
        found = (self.keys[pos] == k) if self.nnz else torch.zeros_like(k, dtype=torch.bool)
        out = torch.full(k.shape, self.base, dtype=self.vals.dtype, device=k.device)
        if self.nnz:
            out[found] = self.vals[pos[found]]
        return out

    def update(self, i: torch.Tensor, j: torch.Tensor, w: torch.Tensor) -> SparseBoxWeights:
        """A copy with w_ij = w_ji = w for the (distinct) pairs i < j."""
        keys = torch.cat([self.keys, i * self.n + j])
        vals = torch.cat([self.vals, w.to(self.vals.dtype)])
        # keep the last value of every key: sort stably by key, take each run's end
        order = torch.sort(keys, stable=True).indices
        keys, vals = keys[order], vals[order]
        last = torch.ones_like(keys, dtype=torch.bool)
        last[:-1] = keys[1:] != keys[:-1]
        return SparseBoxWeights(self.n, keys[last], vals[last], self.base)

    def thresholded(self, threshold: float) -> SparseBoxWeights:
        """A copy with the stored entries below ``threshold`` set to 0 (the base, 1, and
        the diagonal stay: the box domain's threshold is at most 1)."""
        vals = torch.where(self.vals >= threshold, self.vals, torch.zeros_like(self.vals))
        return SparseBoxWeights(self.n, self.keys, vals, self.base)

    def degree(self) -> torch.Tensor:
        """W 1 (n,), the diagonal's base included, as in the dense matrix."""
        i, j = self._pairs()
        delta = self.vals - self.base
        deg = torch.full(
            (self.n,), self.n * self.base, dtype=self.vals.dtype, device=self.vals.device
        )
        return deg.index_add_(0, i, delta).index_add_(0, j, delta)

    def matmul(self, X: torch.Tensor) -> torch.Tensor:
        """W X (n, d) without forming W."""
        i, j = self._pairs()
        delta = (self.vals - self.base).to(X.dtype)[:, None]
        out = (self.base * X.sum(dim=0, keepdim=True)).expand(self.n, -1).clone()
        out.index_add_(0, i, delta * X[j])
        out.index_add_(0, j, delta * X[i])
        return out

    def to_dense(self) -> torch.Tensor:
        W = torch.full((self.n, self.n), self.base, dtype=self.vals.dtype, device=self.vals.device)
        i, j = self._pairs()
        W[i, j] = self.vals
        W[j, i] = self.vals
        return W

    def cluster_agreement(self, clusters: list[int | None]) -> dict[str, float]:
        """Mean off-diagonal w inside and across clusters, without forming W."""
        if any(c is None for c in clusters) or self.n < 2:
            return {}
        cl = torch.tensor(clusters, device=self.keys.device)
        counts = torch.bincount(cl).to(torch.float64)
        pairs_within = float((counts * (counts - 1) / 2).sum())
        pairs_all = self.n * (self.n - 1) / 2
        i, j = self._pairs()
        same = cl[i] == cl[j]
        delta = (self.vals - self.base).double()
        out = {}
        if pairs_within > 0:
            out["w_within"] = self.base + float(delta[same].sum()) / pairs_within
        if pairs_all - pairs_within > 0:
            out["w_across"] = self.base + float(delta[~same].sum()) / (pairs_all - pairs_within)
        # each row's off-diagonal mass, and its part inside the row's cluster
        total = torch.full(
            (self.n,), self.base * (self.n - 1), dtype=torch.float64, device=delta.device
        )
        total.index_add_(0, i, delta).index_add_(0, j, delta)
        inside = (self.base * (counts[cl] - 1)).to(delta.device)
        inside.index_add_(0, i[same], delta[same]).index_add_(0, j[same], delta[same])
        out.update(mass_inside(total, inside))
        return out

    def export(self) -> dict[str, torch.Tensor | int | float]:
        i, j = self._pairs()
        return {"n": self.n, "base": self.base, "i": i.cpu(), "j": j.cpu(), "w": self.vals.cpu()}
