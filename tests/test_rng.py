"""Counter-based randomness: the hash is murmur3's finaliser, int keys and tensor keys
hash alike, draws depend on their coordinates only."""

from __future__ import annotations

import torch

from raycobo import rng


def _murmur_fmix32(x: int) -> int:
    """The reference finaliser (Appleby's MurmurHash3), in plain Python."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_fmix32_is_murmur3s_finaliser_on_every_32_bit_range():
    xs = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF, 12345678]
    got = rng.fmix32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [_murmur_fmix32(x) for x in xs]
    assert _murmur_fmix32(0) == 0 and _murmur_fmix32(1) == 0x514E28B7  # known values


def test_int_and_tensor_keys_hash_alike_and_broadcast():
    """A draw is the same whether its coordinates come as ints or tensors, alone or in a
    broadcast batch: engines that batch differently draw the same numbers."""
    batch = rng.hash_ints(7, 3, torch.arange(4).reshape(-1, 1), torch.arange(5))  # (4, 5)
    assert batch.shape == (4, 5)
    for c in range(4):
        for k in range(5):
            assert int(batch[c, k]) == int(rng.hash_ints(7, 3, c, k))
            assert int(batch[c, k]) == int(rng.hash_ints(7, 3, torch.tensor(c), torch.tensor(k)))
    assert int(rng.hash_ints(7, 3, 0, 0)) != int(rng.hash_ints(7, 3, 0, 1))
    assert int(rng.hash_ints(1, 2)) != int(rng.hash_ints(2, 1))  # positions matter


def test_draws_are_in_range_and_roughly_uniform():
    keys = (0, 1, torch.arange(20_000))
    r = rng.randint(10, *keys)
    assert int(r.min()) == 0 and int(r.max()) == 9
    counts = torch.bincount(r, minlength=10).double()
    assert float((counts / 20_000 - 0.1).abs().max()) < 0.01
    u = rng.uniform(*keys)
    assert float(u.min()) > 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01
    z = rng.normal(*keys)
    assert abs(float(z.mean())) < 0.03 and abs(float(z.std()) - 1) < 0.03


def test_per_row_column_and_generator():
    assert rng.per_row(3, 4).tolist() == [3, 3, 3, 3]
    assert rng.per_row(torch.tensor([1, 2]), 2).tolist() == [1, 2]
    assert rng.column(5) == 5 and rng.column(torch.tensor([1, 2])).shape == (2, 1)
    a = torch.rand(3, generator=rng.generator(0, rng.SAMPLER, 7))
    b = torch.rand(3, generator=rng.generator(0, rng.SAMPLER, 7))
    c = torch.rand(3, generator=rng.generator(0, rng.SAMPLER, 8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def _reference_hash(*keys: int) -> int:
    """hash_ints on plain ints, key by key, with the Python finaliser above."""
    h = None
    for i, k in enumerate(keys):
        mixed = _murmur_fmix32((k & 0xFFFFFFFF) + 0x9E3779B9 * (i + 1))
        h = mixed if h is None else _murmur_fmix32(h ^ mixed)
    return h


def test_tensor_keys_of_any_size_and_sign_hash_as_their_low_32_bits():
    """The CPU path (numpy uint32, wrapping products) and the device path (torch int64)
    give the reference's integers for keys past 2**32 and below 0, with a tensor key
    first, later int keys and 0-d tensors broadcast."""
    g = torch.Generator().manual_seed(0)
    big = torch.randint(-(2**40), 2**40, (6, 1), generator=g)
    keys = (torch.tensor(-3), 2**33 + 5, big, torch.arange(3).reshape(1, -1), 9)
    got = rng.hash_ints(*keys)
    assert got.shape == (6, 3) and got.dtype == torch.int64
    want = [[_reference_hash(-3, 2**33 + 5, int(b), k, 9) for k in range(3)] for b in big[:, 0]]
    assert got.tolist() == want
    assert rng._hash_torch(None, keys, 0).tolist() == want
    assert rng.hash_ints(7, torch.tensor(5)).shape == ()
