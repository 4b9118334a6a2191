"""APPLE: mu's schedules by hand, one round by hand on two clients, the clusters read off
the relationship vectors on the CoBo paper's quadratic clusters, and its communication."""

from __future__ import annotations

import math

import pytest
import torch

from raycobo import rng
from raycobo.algorithms.apple import APPLEConfig, APPLEState, mu_at, pick_downloads
from raycobo.config import ConfigError, load_config
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


@pytest.mark.parametrize("mode", [[], ["algorithm.downloads=2"]])  # all cores, or 2 of 7
def test_the_relationships_tell_the_quadratic_clusters_apart(quad_cfg, mode):
    """Example 2's clusters (2 of 4): a linear mix of cores can reach any optimum, so P
    need not put its mass in the own cluster; but clients of one cluster learn the same
    relationships: after 50 rounds every client's row of P is nearer each of its cluster's
    rows than any other cluster's, and its loss is below FedAvg's mean."""
    partition = ["data.partition.num_clusters=2", "data.partition.clients_per_cluster=4"]
    ops, state, apple = trained_losses(
        quad_cfg("algorithm.name=apple", "rounds=50", *partition, *mode), 50
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


def test_downloads_take_the_never_downloaded_cores_first():
    """From a client's first draw on, the cores it never downloaded come first (a random
    choice of them), its own core never; once it has every core, the draw goes on."""
    n, P = 6, torch.full((6, 6), 1 / 6)
    seen = torch.eye(n, dtype=torch.bool)
    clients = torch.arange(n)
    for t in range(1, 3):  # 5 others, 2 a round: rounds 1 and 2 take 4 never seen
        fresh = pick_downloads(P, seen, clients, 2, 1.5, 0, t)
        assert (fresh.sum(1) == 2).all() and not (fresh & seen).any()
        seen |= fresh
    fresh = pick_downloads(P, seen, clients, 2, 1.5, 0, 3)  # the last one, and one more
    assert (fresh.sum(1) == 2).all() and (fresh & ~seen).sum(1).eq(1).all()
    assert not fresh.diagonal().any()


def test_downloads_are_drawn_in_proportion_to_base_to_the_weights():
    """Every core seen: one download a round among two others with |p| 0 and 1 and base 4
    takes the second with probability 4 / 5 (Efraimidis-Spirakis keys)."""
    P = torch.tensor([[0.5, 0.0, -1.0], [0.3, 0.3, 0.3], [0.3, 0.3, 0.3]])
    seen = torch.ones(3, 3, dtype=torch.bool)
    picks = torch.stack(
        [pick_downloads(P, seen, torch.tensor([0]), 1, 4.0, 7, t)[0] for t in range(4000)]
    )
    assert not picks[:, 0].any() and picks.sum(1).eq(1).all()
    assert abs(picks[:, 2].double().mean().item() - 0.8) < 0.025


def test_a_limited_round_by_hand(quad_cfg):
    """Three clients, one download each a round: a client mixes the copies it holds (its
    own core current), steps as in the full round on them, and keeps the new copy; the
    other copies stay as last downloaded. Round 0 downloads nothing (the initial cores)."""
    cfg = quad_cfg(
        "algorithm.name=apple",
        "algorithm.downloads=1",
        "algorithm.local_steps=1",
        "algorithm.mu=0",
        "rounds=10",
        "data.partition.num_clusters=3",
        "data.partition.clients_per_cluster=1",
    )
    _, ops, algo = build(cfg)
    st = algo.init(ops)
    assert torch.equal(st.held, st.C.expand(3, -1, -1)) and torch.equal(st.seen, torch.eye(3) > 0)
    after0, stats0 = algo.round(st, 0, ops)
    assert torch.equal(after0.seen, st.seen) and stats0["bytes_sent"] == 3 * 1 * ops.dim * 4
    held = after0.held.clone()
    held[0, 1:] += 1.0  # client 0's copies of cores 1 and 2 are stale; it refreshes one
    state = APPLEState(after0.C, after0.P, after0.p0, held, after0.seen)
    fresh = pick_downloads(state.P, state.seen, torch.arange(3), 1, algo.base(1, 3), cfg.seed, 1)
    new, stats = algo.round(state, 1, ops)
    assert fresh[0, 1:].sum() == 1
    for i in range(3):
        copies = held[i].clone()
        copies[fresh[i]] = state.C[fresh[i]]
        p = state.P[i]
        theta = p @ copies
        g = ops.grads(torch.tensor([i]), theta[None], 1, rng.STEP, 0)[0][0]
        assert torch.allclose(new.P[i], p - cfg.algorithm.p_lr * (copies @ g), atol=1e-6)
        core = state.C[i] - cfg.algorithm.lr * p[i] * g
        copies[i] = core
        assert torch.allclose(new.C[i], core, atol=1e-6)
        assert torch.allclose(new.held[i], copies, atol=1e-6)
    assert torch.equal(new.seen, state.seen | fresh)
    assert torch.allclose(algo.eval_params(new), torch.einsum("ij,ijd->id", new.P, new.held))
    assert stats["bytes_sent"] == 3 * 2 * ops.dim * 4  # one core down, the own one up


def test_the_download_draws_keys_are_refused_without_downloads():
    with pytest.raises(ConfigError, match=r"'algorithm.download_base'.*downloads"):
        load_config(None, ["algorithm.name=apple", "algorithm.download_base=2"])
    cfg = load_config(None, ["algorithm.name=apple", "algorithm.downloads=3"])
    assert cfg.algorithm.effective()["download_base"] == 1.5
