"""Counter-based randomness: every random number is a hash of explicit coordinates.

A batch index or a noise value is a pure function of ``(seed, round, client, stream,
salt, k)``, so results do not depend on which process computes them or in which order
(the local and the Ray engine draw the same batches). The hash is murmur3's 32-bit
finaliser, evaluated in int64 arithmetic that never overflows, vectorised over tensors.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_M32 = 0xFFFFFFFF
_C1, _C2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)
_U13, _U16 = np.uint32(13), np.uint32(16)

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
ADAPT = 13  # FedALA's learning of its aggregation weights


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
    coordinates (seed, round, stream) first. CPU tensor keys are hashed in numpy's uint32
    arithmetic (wrapping multiplication: a third of the operations of ``fmix32``'s
    overflow-free int64 form, the same integers: tested); keys on another device in
    torch."""
    h: int | None = None
    for i, k in enumerate(keys):
        if not isinstance(k, int):
            if all(not isinstance(x, torch.Tensor) or x.device.type == "cpu" for x in keys):
                return _hash_numpy(h, keys, i)
            return _hash_torch(h, keys, i)
        mixed_i = _fmix32_int((k & _M32) + 0x9E3779B9 * (i + 1))
        h = mixed_i if h is None else _fmix32_int(h ^ mixed_i)
    assert h is not None
    return torch.as_tensor(h, dtype=torch.int64)


def _hash_torch(h: int | None, keys: tuple, first: int) -> torch.Tensor:
    """``hash_ints`` from key ``first`` on, ``h`` the leading ints' hash, in torch."""
    out: torch.Tensor | int | None = h
    for i in range(first, len(keys)):
        kt = torch.as_tensor(keys[i], dtype=torch.int64)
        mixed = fmix32((kt & _M32) + 0x9E3779B9 * (i + 1))
        out = mixed if out is None else fmix32(out ^ mixed)
    return torch.as_tensor(out, dtype=torch.int64)


def _fmix32_np(x: np.ndarray) -> np.ndarray:
    """murmur3's finaliser on a uint32 array of at least one dimension, in place."""
    x ^= x >> _U16
    x *= _C1
    x ^= x >> _U13
    x *= _C2
    x ^= x >> _U16
    return x


def _hash_numpy(h: int | None, keys: tuple, first: int) -> torch.Tensor:
    """``hash_ints`` from key ``first`` on in numpy uint32: the same integers as
    ``_hash_torch`` (uint32 products wrap modulo 2**32, which ``_mul32`` computes)."""
    arrays = [torch.as_tensor(k, dtype=torch.int64).numpy() for k in keys[first:]]
    dims = max(a.ndim for a in arrays)
    # 0-d keys as (1, ..., 1): broadcasting is unchanged and no step works on numpy
    # scalars (whose wrapping products warn); the answer is 0-d where every key was
    ones = (1,) * max(dims, 1)
    out = None if h is None else np.full(ones, h, dtype=np.uint32)
    for i, k in enumerate(arrays, start=first):
        low = ((k.reshape(ones) if k.ndim == 0 else k) & _M32).astype(np.uint32)
        mixed = _fmix32_np(low + np.uint32((0x9E3779B9 * (i + 1)) & _M32))
        out = mixed if out is None else _fmix32_np(out ^ mixed)
    assert out is not None
    got = torch.from_numpy(out.astype(np.int64))
    return got if dims else got.reshape(())


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
