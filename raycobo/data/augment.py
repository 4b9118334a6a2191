"""Per-sample image augmentation drawn from hashed coordinates (engine-independent)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raycobo import rng


def crop_flip(x: torch.Tensor, keys: tuple, pad: int = 4) -> torch.Tensor:
    """Random crop (zero padding ``pad``) and horizontal flip of images x (..., C, H, W).

    ``keys`` are broadcastable hash coordinates with the batch shape of x[..., 0, 0, 0]."""
    lead = x.shape[:-3]
    C, H, W = x.shape[-3:]
    flat = x.reshape(-1, C, H, W)
    n = flat.shape[0]
    oy = rng.randint(2 * pad + 1, *keys, 11).reshape(n).to(x.device)
    ox = rng.randint(2 * pad + 1, *keys, 12).reshape(n).to(x.device)
    flip = (rng.randint(2, *keys, 13).reshape(n) == 1).to(x.device)
    padded = F.pad(flat, (pad, pad, pad, pad))  # (n, C, H+2p, W+2p)
    rows = oy[:, None] + torch.arange(H, device=x.device)  # (n, H)
    cols = ox[:, None] + torch.arange(W, device=x.device)  # (n, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    b = torch.arange(n, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]  # (n, H, W, C)
    return out.permute(0, 3, 1, 2).reshape(*lead, C, H, W)
