"""Projections onto the box and the probability simplex."""

import torch
from torch.testing import assert_close

from raycobo.algorithms.projections import project_box, project_simplex


def brute_simplex(v: torch.Tensor, steps: int = 4000) -> torch.Tensor:
    """Reference: bisection on theta with sum(max(v - theta, 0)) = 1."""
    lo, hi = float(v.min()) - 1, float(v.max())
    for _ in range(steps):
        mid = (lo + hi) / 2
        if float((v - mid).clamp_min(0).sum()) > 1:
            lo = mid
        else:
            hi = mid
    return (v - (lo + hi) / 2).clamp_min(0)


def test_simplex_matches_reference_and_is_idempotent():
    g = torch.Generator().manual_seed(0)
    V = torch.randn(20, 6, generator=g, dtype=torch.float64) * 3
    P = project_simplex(V)
    for r in range(V.shape[0]):
        assert_close(P[r], brute_simplex(V[r]), atol=1e-9, rtol=0)
    assert torch.all(P >= 0)
    assert_close(P.sum(1), torch.ones(20, dtype=torch.float64))
    assert_close(project_simplex(P), P)


def test_simplex_mask_excludes_coordinates():
    V = torch.tensor([[5.0, 0.2, 0.1], [0.3, 9.0, 0.3]])
    mask = ~torch.eye(2, 3, dtype=torch.bool)
    P = project_simplex(V, mask)
    assert P[0, 0] == 0 and P[1, 1] == 0
    assert_close(P.sum(1), torch.ones(2))
    assert_close(P[1], torch.tensor([0.5, 0.0, 0.5]))


def test_box_clips():
    assert_close(project_box(torch.tensor([-1.0, 0.3, 2.0])), torch.tensor([0.0, 0.3, 1.0]))
