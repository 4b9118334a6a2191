"""APPLE: mu's schedules by hand, one round by hand on two clients, the clusters read off
the relationship vectors on the CoBo paper's quadratic clusters, and its communication."""

from __future__ import annotations

import math

import torch

from raycobo import rng
from raycobo.algorithms.apple import APPLEConfig, APPLEState, mu_at
from tests.helpers import build, trained_losses


def test_mu_decays_to_zero_over_its_share_of_the_rounds():
    exp = APPLEConfig(mu=0.2, mu_rounds=0.1)
    assert mu_at(exp, 200, 0) == 0.2
    assert math.isclose(mu_at(exp, 200, 10), 0.2 * 0.001**0.5)  # halfway through 20 rounds
    assert mu_at(exp, 200, 20) == 0.0 and mu_at(exp, 200, 150) == 0.0
    cos = APPLEConfig(mu=0.2, mu_rounds=0.5, mu_schedule="cosine")
    assert math.isclose(mu_at(cos, 100, 25), 0.1) and mu_at(cos, 100, 50) == 0.0
    assert mu_at(APPLEConfig(mu=0.0), 100, 0) == 0.0


def test_one_round_by_hand_on_two_clients(quad_cfg):
    """Two quadratic clients, hand-set cores and relationships: two steps each on its own
    core (along p_ii g) and on p_i (along <g, c_j> + 2 mu (p_ij - p0_j)), the other's core
    frozen, g the minibatch gradient at theta_i = sum_j p_ij c_j (stream STEP, salt s)."""
    cfg = quad_cfg(
        "algorithm.name=apple",
        "algorithm.local_steps=2",
        "algorithm.lr=0.1",
        "algorithm.p_lr=0.05",
        "algorithm.mu=0.5",
        "rounds=10",
        "data.partition.num_clusters=2",
        "data.partition.clients_per_cluster=1",
    )
    _, ops, algo = build(cfg)
    st = algo.init(ops)
    C = torch.stack([torch.linspace(-1, 1, ops.dim), torch.linspace(2, 0, ops.dim)])
    P = torch.tensor([[0.8, 0.3], [0.4, 0.5]])
    new, stats = algo.round(APPLEState(C, P, st.p0), 0, ops)
    mu = 0.5  # round 0: the schedule's start
    cores, rows = [], []
    for i in range(2):
        c, p = C.clone(), P[i].clone()
        for s in range(2):
            theta = p[0] * c[0] + p[1] * c[1]
            g = ops.grads(torch.tensor([i]), theta[None], 0, rng.STEP, s)[0][0]
            grad_p = torch.stack([g @ c[0], g @ c[1]]) + 2 * mu * (p - st.p0)
            c[i] = c[i] - 0.1 * p[i] * g
            p = p - 0.05 * grad_p
        cores.append(c[i])
        rows.append(p)
    assert torch.allclose(new.C, torch.stack(cores), atol=1e-6)
    assert torch.allclose(new.P, torch.stack(rows), atol=1e-6)
    assert torch.allclose(algo.eval_params(new), new.P @ new.C)
    assert stats["bytes_sent"] == 2 * 2 * ops.dim * 4  # both cores down, the own one up
    assert torch.allclose(st.p0, torch.full((2,), 0.5))  # equal sample shares
    assert not torch.equal(st.C[0], st.C[1])  # one network initialised per client


def test_the_relationships_tell_the_quadratic_clusters_apart(quad_cfg):
    """Example 2's clusters (2 of 4): a linear mix of cores can reach any optimum, so P
    need not put its mass in the own cluster; but clients of one cluster learn the same
    relationships: after 50 rounds every client's row of P is nearer each of its cluster's
    rows than any other cluster's, and its loss is below FedAvg's mean."""
    partition = ["data.partition.num_clusters=2", "data.partition.clients_per_cluster=4"]
    ops, state, apple = trained_losses(
        quad_cfg("algorithm.name=apple", "rounds=50", *partition), 50
    )
    cl = torch.as_tensor(ops.clusters)
    eye = torch.eye(8, dtype=torch.bool)
    same = (cl[:, None] == cl[None, :]) & ~eye
    D = torch.cdist(state.P, state.P)
    farthest_inside = D.masked_fill(~same, float("-inf")).max(1).values
    nearest_outside = D.masked_fill(same | eye, float("inf")).min(1).values
    assert bool((farthest_inside < nearest_outside).all()), D
    _, _, avg = trained_losses(quad_cfg("algorithm.name=fedavg", *partition), 50)
    assert float(apple.mean()) < float(avg.mean()), (apple, avg)
