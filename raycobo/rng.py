"""Counter-based randomness: every random number is a hash of explicit coordinates.

A batch index or a noise value is a pure function of ``(seed, round, client, stream,
salt, k)``, so results do not depend on which process computes them or in which order
(the local and the Ray engine draw the same batches). The hash is murmur3's 32-bit
finaliser, evaluated in int64 arithmetic that never overflows, vectorised over tensors.
"""

from __future__ import annotations

import math

import torch

_M32 = 0xFFFFFFFF

# streams: what a draw is for (part of the hash key)
STEP = 1  # the model step's minibatch
ALIGN = 2  # CoBo's alignment gradients at the midpoint
LOSS = 3  # loss evaluations (IFCA's cluster choice)
CROSS = 4  # cross-client gradients (Federated Clustering)
GLOBAL = 5  # a global/auxiliary model's minibatch (Ditto, FedAvg)
NOISE = 6  # gradient noise of synthetic tasks
SAMPLER = 7  # edge / client sampling
INIT = 8
FT = 9
VAL = 10  # draws from the held-out validation part of a client's data
RECHECK = 11  # CoBo's re-sampling of the pairs its pull reads
CLOSURE = 12  # CoBo's proposals of a collaborator's collaborator


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32 without leaving int64's positive range."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _fmix32_int(x: int) -> int:
    x &= _M32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def hash_ints(*keys: torch.Tensor | int) -> torch.Tensor:
    """Hash broadcastable integer coordinates to uniform integers in [0, 2**32).

    Leading plain-int keys are mixed in Python (no tensor ops), so put scalar
    coordinates (seed, round, stream) first."""
    h: torch.Tensor | int | None = None
    for i, k in enumerate(keys):
        if isinstance(k, int) and not isinstance(h, torch.Tensor):
            mixed_i = _fmix32_int((k & _M32) + 0x9E3779B9 * (i + 1))
            h = mixed_i if h is None else _fmix32_int(h ^ mixed_i)
            continue
        kt = torch.as_tensor(k, dtype=torch.int64)
        mixed = fmix32((kt & _M32) + 0x9E3779B9 * (i + 1))
        h = mixed if h is None else fmix32(h ^ mixed)
    assert h is not None
    return torch.as_tensor(h, dtype=torch.int64)


def randint(n: torch.Tensor | int, *keys: torch.Tensor | int) -> torch.Tensor:
    """Uniform integers in [0, n) (n broadcastable), one per broadcast key coordinate."""
    return hash_ints(*keys) % torch.as_tensor(n, dtype=torch.int64)


def per_row(value: torch.Tensor | int, m: int) -> torch.Tensor:
    """A per-request coordinate (stream, salt) as an (m,) int64 tensor: a scalar is
    broadcast to every row."""
    v = torch.as_tensor(value, dtype=torch.int64).reshape(-1)
    return v.expand(m) if v.numel() == 1 else v


def column(value: torch.Tensor | int) -> torch.Tensor | int:
    """A coordinate as a hash key for (m, ...) draws: a plain int stays an int (hashed in
    Python), anything else becomes an (m, 1) CPU column."""
    if isinstance(value, int):
        return value
    return torch.as_tensor(value, dtype=torch.int64).cpu().reshape(-1, 1)


def uniform(*keys: torch.Tensor | int) -> torch.Tensor:
    """Uniform floats in (0, 1) in float64."""
    return (hash_ints(*keys).to(torch.float64) + 0.5) / 4294967296.0


def normal(*keys: torch.Tensor | int) -> torch.Tensor:
    """Standard normal floats (Box-Muller on two hashed uniforms), float64."""
    u1 = uniform(*keys, 1)
    u2 = uniform(*keys, 2)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


def generator(*keys: int) -> torch.Generator:
    """A torch.Generator seeded from hashed coordinates (for draws of variable size)."""
    g = torch.Generator()
    hi = int(hash_ints(*keys, 0xA5A5))
    lo = int(hash_ints(*keys, 0x5A5A))
    g.manual_seed((hi << 32) | lo)
    return g
