"""FedAMP: the attention rows by hand, one round's cloud models and proximal steps by
hand, the clusters recovered on the CoBo paper's quadratic clusters, the rules' keys
refused where they would do nothing, and its communication."""

from __future__ import annotations

import math

import pytest
import torch

from raycobo import rng
from raycobo.algorithms.fedamp import FedAMPConfig, FedAMPState, attention, prox
from raycobo.settings import ConfigError
from tests.helpers import build, trained_losses


def test_the_attention_rows_by_hand():
    x0 = torch.zeros(2, dtype=torch.float64)
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    paper = FedAMPConfig(attention="distance", alpha_k=0.5, sigma=2.0)
    xi = attention(X, x0, torch.tensor([0, 1]), paper)
    off = 0.5 * math.exp(-1.0 / 2.0) / 2.0  # alpha exp(-||w_0 - w_1||^2 / sigma) / sigma
    assert torch.allclose(xi, torch.tensor([[1 - off, off], [off, 1 - off]], dtype=torch.float64))
    # the cosine rule reads the changes from x0: client 0 and 1 point the same way
    x0 = torch.tensor([1.0, 1.0], dtype=torch.float64)
    X = x0 + torch.tensor([[1.0, 0.0], [2.0, 0.2], [0.0, 1.0]], dtype=torch.float64)
    ports = FedAMPConfig(attention="cosine", sigma=3.0, self_weight=0.6)
    xi = attention(X, x0, torch.tensor([0]), ports)
    c01, c02 = 2.0 / math.hypot(2.0, 0.2), 0.0
    e1, e2 = math.exp(3 * c01), math.exp(3 * c02)
    want = [0.6, 0.4 * e1 / (e1 + e2), 0.4 * e2 / (e1 + e2)]
    assert torch.allclose(xi, torch.tensor([want], dtype=torch.float64))


def test_one_round_by_hand_on_two_clients(quad_cfg):
    """Two clients of the quadratic task: the cloud models u = xi X from hand-set models,
    then two proximal SGD steps from u on the minibatch coordinates (STEP, salt s)."""
    cfg = quad_cfg(
        "algorithm.name=fedamp",
        "algorithm.attention=distance",
        "algorithm.sigma=4.0",
        "algorithm.alpha_k=2.0",
        "algorithm.lam=0.5",
        "algorithm.local_steps=2",
        "algorithm.lr=0.1",
        "data.partition.num_clusters=2",
        "data.partition.clients_per_cluster=1",
    )
    _, ops, algo = build(cfg)
    st = algo.init(ops)
    X = st.X + torch.stack([torch.linspace(-1, 1, ops.dim), torch.linspace(2, 0, ops.dim)])
    state = FedAMPState(X.to(st.X.dtype), st.x0, st.Xi)
    new, stats = algo.round(state, 3, ops)
    D = float((X[0] - X[1]).square().sum())
    off = 2.0 * math.exp(-D / 4.0) / 4.0
    xi = torch.tensor([[1 - off, off], [off, 1 - off]], dtype=X.dtype)
    U = xi @ X
    clients, prox, y = torch.arange(2), 0.5 / 2.0, U
    for s in range(2):
        g = ops.grads(clients, y, 3, rng.STEP, s)[0]
        y = y - 0.1 * (g + prox * (y - U))
    assert torch.allclose(new.X, y, atol=1e-6) and torch.allclose(new.Xi, xi)
    assert stats["bytes_sent"] == 2 * 2 * ops.dim * 4  # each cloud model down, model up


def test_the_default_rule_recovers_the_quadratic_clusters(quad_cfg):
    """Example 2's clusters (2 clusters of 4): after 40 rounds with the defaults, each
    client's attention on others lies inside its own cluster, and its loss is below what
    Local reaches in the same rounds."""
    cfg = quad_cfg(
        "algorithm.name=fedamp",
        "data.partition.num_clusters=2",
        "data.partition.clients_per_cluster=4",
    )
    ops, state, amp = trained_losses(cfg, 40)
    cl = torch.as_tensor(ops.clusters)
    same = (cl[:, None] == cl[None, :]) & ~torch.eye(8, dtype=torch.bool)
    others = state.Xi.masked_fill(torch.eye(8, dtype=torch.bool), 0.0)
    inside = (others * same).sum(1) / others.sum(1)
    assert bool((inside > 0.95).all()), inside
    _, _, alone = trained_losses(quad_cfg("algorithm.name=local", *cfg_partition()), 40)
    amp_loss, local_loss = float(amp.mean()), float(alone.mean())
    assert amp_loss < local_loss, (amp_loss, local_loss)


def cfg_partition() -> list[str]:
    return ["data.partition.num_clusters=2", "data.partition.clients_per_cluster=4"]


def test_a_rules_keys_are_refused_under_the_other_rule(quad_cfg):
    with pytest.raises(
        ConfigError, match="'algorithm.alpha_k': applies to attention: distance, not cosine"
    ):
        quad_cfg("algorithm.name=fedamp", "algorithm.alpha_k=2")
    with pytest.raises(ConfigError, match="'algorithm.self_weight': applies to attention: cosine"):
        quad_cfg(
            "algorithm.name=fedamp", "algorithm.attention=distance", "algorithm.self_weight=0.5"
        )
    cfg = quad_cfg("algorithm.name=fedamp")
    assert cfg.algorithm.effective()["sigma"] == 30.0
    assert cfg.algorithm.effective()["self_weight"] == 0.7
    assert cfg.algorithm.effective()["alpha_k"] is None  # the cosine rule has none
    pinned = cfg.pinned().algorithm
    assert pinned.sigma == 30.0 and pinned.self_weight == 0.7 and prox(pinned) == 1.0
