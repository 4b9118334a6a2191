"""FedFomo: the epsilon-greedy picks, the weights and the move by hand, one round by hand
on three clients, the clusters recovered on the CoBo paper's quadratic clusters, and its
settings refused where they would do nothing."""

from __future__ import annotations

import pytest
import torch

from raycobo import rng
from raycobo.algorithms.base import cluster_agreement
from raycobo.algorithms.fedfomo import (
    EPS_NORM,
    FedFomoState,
    fomo_start,
    fomo_weights,
    pick_peers,
)
from raycobo.settings import ConfigError
from tests.helpers import build, trained_losses


def test_greedy_picks_follow_the_affinity_and_exploring_picks_are_distinct():
    P = torch.tensor(
        [
            [9.0, 1.0, 5.0, 3.0, -2.0],
            [0.0, 9.0, 0.0, 7.0, 4.0],
            [1.0, 1.0, 9.0, 1.0, 2.0],
            [0.0, 0.0, 0.0, 9.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 9.0],
        ]
    )
    rows = torch.tensor([0, 1, 2])
    greedy = pick_peers(P, rows, 3, 0.0, seed=0, t=0)
    assert greedy[0].tolist() == [2, 3, 1]  # highest affinity first, never itself
    assert greedy[1].tolist()[:2] == [3, 4]  # then a tie (0 and 2) broken at random
    assert set(greedy[1].tolist()) < {0, 2, 3, 4} and greedy[2, 0] == 4
    explored = pick_peers(P, rows, 4, 1.0, seed=0, t=0)  # every pick a uniform draw
    for i, row in enumerate(explored.tolist()):
        assert sorted(row) == sorted(set(range(5)) - {i})  # distinct, all the others
    assert pick_peers(P, rows, 9, 0.0, seed=0, t=0).shape == (3, 4)  # at most n - 1
    # exploration draws differ between rounds and seeds, and repeat for the same ones
    draws = {
        tuple(pick_peers(P, rows, 2, 1.0, s, t).flatten().tolist()) for s in (0, 1) for t in (0, 1)
    }
    assert len(draws) > 1
    assert torch.equal(pick_peers(P, rows, 2, 1.0, 3, 4), pick_peers(P, rows, 2, 1.0, 3, 4))


def test_the_weights_and_the_move_by_hand():
    own = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    peers = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, -2.0]]], dtype=torch.float64)
    dist = torch.linalg.vector_norm(peers - own[:, None], dim=2)  # 5, 1, 2
    w = fomo_weights(torch.tensor([2.0]), torch.tensor([[1.0, 1.5, 3.0]]), dist)
    want = [1.0 / (5 + EPS_NORM), 0.5 / (1 + EPS_NORM), -1.0 / (2 + EPS_NORM)]
    assert torch.allclose(w, torch.tensor([want], dtype=w.dtype))
    a, b = want[0], want[1]  # the helpful two, normalised; the third left out
    moved = fomo_start(own, peers, w)
    assert torch.allclose(moved, (a * peers[0, 0] + b * peers[0, 1])[None] / (a + b))
    # no helpful peer: the client keeps its model
    assert torch.equal(fomo_start(own, peers, -w.abs()), own)


def test_one_round_by_hand_on_three_clients(quad_cfg):
    """Three noise-free quadratic clients, hand-set models, two greedy peers each: the
    validation losses, the weights added to P, the move, and two SGD steps from it."""
    cfg = quad_cfg(
        "algorithm.name=fedfomo",
        "algorithm.peers=2",
        "algorithm.epsilon=0",
        "algorithm.local_steps=2",
        "algorithm.lr=0.1",
        "data.noise=0",
        "data.partition.num_clusters=3",
        "data.partition.clients_per_cluster=1",
    )
    data, ops, algo = build(cfg)
    st = algo.init(ops)
    X = st.X + torch.stack([torch.linspace(-1, 1, ops.dim) * s for s in (1.0, 2.0, -0.5)])
    state = FedFomoState(X, st.P)
    new, stats = algo.round(state, 3, ops)
    mu = data.optima()
    f = [[float(0.5 * data.a[i] * ((X[j] - mu[i]) ** 2).sum()) for j in range(3)] for i in range(3)]
    P = torch.eye(3, dtype=X.dtype)
    starts = []
    for i in range(3):
        others = [j for j in range(3) if j != i]
        w = torch.tensor(
            [(f[i][i] - f[i][j]) / (float((X[j] - X[i]).norm()) + EPS_NORM) for j in others],
            dtype=X.dtype,
        )
        P[i, others] += w
        pos = w.clamp(min=0)
        if pos.sum() > 0:
            pulls = [p * (X[j] - X[i]) for p, j in zip(pos, others, strict=True)]
            starts.append(X[i] + sum(pulls) / pos.sum())
        else:
            starts.append(X[i])
    y = torch.stack(starts)
    for s in range(2):
        y = y - 0.1 * ops.grads(torch.arange(3), y, 3, rng.STEP, s)[0]
    assert torch.allclose(new.P, P, atol=1e-6), (new.P, P)
    assert torch.allclose(new.X, y, atol=1e-6)
    assert stats["bytes_sent"] == 3 * 3 * ops.dim * 4  # two peer models down, one up


def test_the_affinity_recovers_the_quadratic_clusters(quad_cfg):
    """Example 2's clusters (2 of 4) with the defaults: after 30 rounds every client's
    affinity is higher for each of its cluster's peers than for any other client's, and
    its loss is below what Local reaches in the same rounds."""
    partition = ["data.partition.num_clusters=2", "data.partition.clients_per_cluster=4"]
    ops, state, fomo = trained_losses(quad_cfg("algorithm.name=fedfomo", *partition), 30)
    cl = torch.as_tensor(ops.clusters)
    eye = torch.eye(8, dtype=torch.bool)
    same = (cl[:, None] == cl[None, :]) & ~eye
    P = state.P
    lowest_inside = P.masked_fill(~same, float("inf")).min(1).values
    highest_outside = P.masked_fill(same | eye, float("-inf")).max(1).values
    assert bool((lowest_inside > highest_outside).all()), P
    _, _, alone = trained_losses(quad_cfg("algorithm.name=local", *partition), 30)
    fomo_loss, local_loss = float(fomo.mean()), float(alone.mean())
    assert fomo_loss < local_loss, (fomo_loss, local_loss)


def test_a_decay_without_exploration_is_refused(quad_cfg):
    with pytest.raises(ConfigError, match="'algorithm.epsilon_decay': with epsilon 0"):
        quad_cfg("algorithm.name=fedfomo", "algorithm.epsilon=0", "algorithm.epsilon_decay=0.1")
    greedy = quad_cfg("algorithm.name=fedfomo", "algorithm.epsilon=0")
    assert greedy.pinned().algorithm.epsilon_decay is None  # and a run records it so
    assert quad_cfg("algorithm.name=fedfomo").pinned().algorithm.epsilon_decay == 0.05


def test_a_signed_collaboration_matrix_is_read_by_its_weights_size():
    """FedFomo's affinity (and APPLE's relationships) hold negative weights: the share of a
    row's mass inside its cluster is of |w|, so it stays a share in [0, 1]. Row 0: |0.5| +
    |-1.0| inside of 3.0 off the diagonal; row 3, alone in its cluster: 0 of 0.5; rows 1
    and 2 have no mass (signed, row 0 would give -0.5 / -2.0 and row 3 nothing)."""
    P = torch.tensor(
        [
            [1.0, 0.5, -1.0, -1.5],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 1.0, 0.0],
            [-0.5, 0.0, 0.0, 1.0],
        ]
    )
    got = cluster_agreement(P, [0, 0, 0, 1])
    assert got["mass_inside"] == pytest.approx((1.5 / 3.0 + 0.0 / 0.5) / 2)
    assert got["w_within"] == pytest.approx((0.5 - 1.0) / 6)
