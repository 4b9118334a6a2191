"""CoBo's box-domain W at large n: a constant plus the entries that differ from it.

With the box domain W starts at a constant off the diagonal (W^0: 1 in Algorithm 1, 0
where the pull has a threshold, as in preset raycobo) and 1 on it, and Eq. (1) only changes the
sampled entries, so W = base (1 1^T - I) + diag I + D with D nonzero only on edges
sampled so far. Storing D as sorted (i < j) keys costs O(stored entries) memory instead
of O(n^2), and the model step's W X = base (1^T X) + (diag - base) X + D X costs
O(n d + nnz d) instead of O(n^2 d). With constant sampling (p = c / n, about c n / 2
edges a round) a run of T rounds stores at most c n T / 2 entries; an entry that
returns to the base is dropped (with W^0 = 0, the pairs measured misaligned), and the
product skips entries a threshold zeroed, so with rule raycobo's defaults both follow
the pairs that pull (about a cluster's size per client) rather than every pair sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raycobo.algorithms.base import mass_inside


def fade_below(v: torch.Tensor, cut: float, amount: float) -> torch.Tensor:
    """``v`` with its entries in (0, ``cut``) lowered by ``amount``, at least 0 (CoBo's
    ``fade``; dense W rows and a sparse W's stored values alike)."""
    low = v.gt(0) & v.lt(cut)
    return torch.where(low, (v - amount).clamp_min(0.0), v)


@dataclass
class SparseBoxWeights:
    n: int
    keys: torch.Tensor  # (nnz,) sorted int64 keys i * n + j, i < j
    vals: torch.Tensor  # (nnz,) the stored w_ij (= w_ji)
    base: float = 1.0  # every off-diagonal entry not stored
    # w_ii (None: the base, as checkpoints written before W^0 could differ from 1 hold)
    diag: float | None = None

    @classmethod
    def ones(cls, n: int, device: torch.device | None = None) -> SparseBoxWeights:
        return cls.initial(n, 1.0, device)

    @classmethod
    def initial(cls, n: int, base: float, device: torch.device | None = None) -> SparseBoxWeights:
        """W^0: ``base`` off the diagonal, 1 on it, nothing stored."""
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return cls(n, empty, torch.empty(0, device=device), float(base), 1.0)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.n)

    @property
    def nnz(self) -> int:
        return int(self.keys.numel())

    @property
    def w_ii(self) -> float:
        return self.base if self.diag is None else self.diag

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
        keep = torch.ones_like(keys, dtype=torch.bool)
        keep[:-1] = keys[1:] != keys[:-1]
        # an entry back at W^0 is the same as none stored: dropped, so that what is kept
        # (and every product's gather) grows with the entries that differ from W^0, not
        # with every pair ever sampled
        keep &= vals != self.base
        return SparseBoxWeights(self.n, keys[keep], vals[keep], self.base, self.diag)

    def thresholded(self, threshold: float) -> SparseBoxWeights:
        """A copy with the entries below ``threshold`` set to 0 (stored ones and the
        base; the diagonal stays: the box domain's threshold is at most 1)."""
        vals = torch.where(self.vals >= threshold, self.vals, torch.zeros_like(self.vals))
        base = self.base if self.base >= threshold else 0.0
        return SparseBoxWeights(self.n, self.keys, vals, base, self.w_ii)

    def faded(self, cut: float, amount: float) -> SparseBoxWeights:
        """A copy with every entry in (0, ``cut``) lowered by ``amount``, at least 0
        (stored ones and the base; the diagonal stays); entries that reach the new base
        are dropped."""
        vals = fade_below(self.vals, cut, amount)
        base = float(fade_below(torch.tensor(self.base, dtype=self.vals.dtype), cut, amount))
        keep = vals != base
        return SparseBoxWeights(self.n, self.keys[keep], vals[keep], base, self.w_ii)

    def read_per_row(self, cut: float | None) -> torch.Tensor:
        """(n,) int64: each row's off-diagonal entries that are not 0 and at least
        ``cut`` (None: every nonzero one) -- the collaborators a pull reads."""

        def passes(v: torch.Tensor) -> torch.Tensor:
            return v.ne(0) & v.ge(cut) if cut is not None else v.ne(0)

        i, j = self._pairs()
        dev = self.vals.device
        stored = torch.zeros(self.n, dtype=torch.int64, device=dev)
        stored.index_add_(0, i, torch.ones_like(i)).index_add_(0, j, torch.ones_like(j))
        ok = passes(self.vals).to(torch.int64)
        out = torch.zeros(self.n, dtype=torch.int64, device=dev)
        out.index_add_(0, i, ok).index_add_(0, j, ok)
        if bool(passes(torch.tensor(self.base))):
            out += self.n - 1 - stored  # the entries at the base
        return out

    def nonzero_pairs(self) -> torch.Tensor:
        """The stored pairs (P, 2), i < j, sorted, whose w_ij is not 0 (with a base of 0:
        every nonzero off-diagonal entry)."""
        keys = self.keys[self.vals != 0]
        return torch.stack([keys // self.n, keys % self.n], dim=1)

    def degree(self) -> torch.Tensor:
        """W 1 (n,), the diagonal included, as in the dense matrix."""
        i, j = self._pairs()
        delta = self.vals - self.base
        row = (self.n - 1) * self.base + self.w_ii
        deg = torch.full((self.n,), row, dtype=self.vals.dtype, device=self.vals.device)
        return deg.index_add_(0, i, delta).index_add_(0, j, delta)

    def matmul(self, X: torch.Tensor) -> torch.Tensor:
        """W X (n, d) without forming W: O(n d + m d), m the stored entries that differ
        from the base (a threshold's zeros do not count)."""
        i, j = self._pairs()
        delta = self.vals - self.base
        live = delta != 0
        if not bool(live.all()):
            i, j, delta = i[live], j[live], delta[live]
        delta = delta.to(X.dtype)[:, None]
        if self.base == 0:  # W^0 = 0 (or a threshold above it): the stored entries only
            out = torch.zeros_like(X)
        else:
            out = (self.base * X.sum(dim=0, keepdim=True)).expand(self.n, -1).clone()
        if self.w_ii != self.base:
            out.add_(X, alpha=self.w_ii - self.base)
        out.index_add_(0, i, delta * X[j])
        out.index_add_(0, j, delta * X[i])
        return out

    def to_dense(self) -> torch.Tensor:
        W = torch.full((self.n, self.n), self.base, dtype=self.vals.dtype, device=self.vals.device)
        W.fill_diagonal_(self.w_ii)
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
        return {
            "n": self.n,
            "base": self.base,
            "diag": self.w_ii,
            "i": i.cpu(),
            "j": j.cpu(),
            "w": self.vals.cpu(),
        }
