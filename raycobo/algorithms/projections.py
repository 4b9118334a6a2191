"""Euclidean projections onto the domains of collaboration weights (CoBo's W,
pFedGraph's graph rows)."""

from __future__ import annotations

import torch


def project_box(w: torch.Tensor, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """Proj onto [low, high] (elementwise clip): the vision domain W in [0, 1]^{n x n}."""
    return w.clamp(low, high)


def project_simplex(v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Row-wise Euclidean projection onto the probability simplex.

    ``v`` is (r, k). ``mask`` (r, k) bool marks the coordinates that belong to each
    row's simplex (others are set to 0), e.g. to leave out the diagonal w_ii. Uses the
    sort-based algorithm (Held et al. 1974; Duchi et al. 2008).
    """
    if mask is None:
        mask = torch.ones_like(v, dtype=torch.bool)
    big = torch.finfo(v.dtype).max / 4
    x = torch.where(mask, v, torch.full_like(v, -big))
    u, _ = torch.sort(x, dim=1, descending=True)
    css = torch.cumsum(torch.where(u > -big / 2, u, torch.zeros_like(u)), dim=1)
    k = torch.arange(1, v.shape[1] + 1, device=v.device, dtype=v.dtype)
    valid = (u > -big / 2) & (u - (css - 1) / k > 0)
    rho = valid.to(torch.int64).cumsum(1).argmax(1, keepdim=True)  # last valid index
    theta = (css.gather(1, rho) - 1) / (rho + 1).to(v.dtype)
    return torch.where(mask, (v - theta).clamp_min(0), torch.zeros_like(v))
