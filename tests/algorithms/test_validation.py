"""Validation-based trust (CoBo Table 2's LLM baseline) on the quadratic clusters."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from tests.helpers import build, run_rounds


def test_trust_concentrates_on_the_own_cluster(quad_cfg):
    cfg = quad_cfg(
        "algorithm.name=validation_based",
        "data.partition.clients_per_cluster=[3,3]",
        "data.center_scale=3",
        "algorithm.trust_every=5",
        "algorithm.trust_temperature=1",
    )
    _, ops, algo = build(cfg)
    s0 = algo.init(ops)
    assert torch.equal(s0.W, torch.eye(6))  # local training until the first measurement
    state = run_rounds(algo, ops, 20, s0)
    cl = torch.tensor(ops.clusters)
    same = cl[:, None] == cl[None, :]
    assert float(state.W[same].sum()) / 6 > 0.95
    assert_close(state.W.sum(dim=1), torch.ones(6))


def test_trust_is_softmax_of_validation_losses_by_hand(quad_cfg):
    """Noise-free quadratic losses: w_ij = softmax_j(-f_i(x_j) / tau)."""
    cfg = quad_cfg(
        "algorithm.name=validation_based",
        "data.noise=0",
        "algorithm.trust_every=1",
        "algorithm.trust_temperature=0.5",
    )
    data, ops, algo = build(cfg)
    state = run_rounds(algo, ops, 1)
    W = algo.trust(state.X, ops, 1)
    mu = data.optima()
    n = mu.shape[0]
    L = torch.stack(
        [
            torch.stack([0.5 * data.a[i] * ((state.X[j] - mu[i]) ** 2).sum() for j in range(n)])
            for i in range(n)
        ]
    )
    assert_close(W, torch.softmax(-L / 0.5, dim=1))
