"""Each baseline on a case with a known answer (quadratic clients, closed forms)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from raycobo.algorithms import evaluate
from tests.helpers import build, run_rounds


def setup(quad_cfg, *over):
    cfg = quad_cfg(*over)
    data, ops, algo = build(cfg)
    return cfg, data, ops, algo


def test_fedavg_step_is_the_average_of_client_steps(quad_cfg):
    """Identical-optimum clients, noise 0: one FedAvg round is x - eta * mean_i a_i (x - mu)."""
    cfg, data, ops, algo = setup(
        quad_cfg,
        "algorithm.name=fedavg",
        "data.noise=0",
        "data.init_scale=1",
        "data.partition.num_clusters=1",
        "data.partition.clients_per_cluster=5",
        "algorithm.lr=0.1",
    )
    state = algo.init(ops)
    x = state.x.clone()
    new, _ = algo.round(state, 0, ops)
    mu = data.centers[0]
    expected = x - 0.1 * data.a.mean() * (x - mu)
    assert_close(new.x, expected)
    assert algo.collaboration(new) is None


def test_fedavg_converges_to_minimiser_of_the_average(quad_cfg):
    cfg, data, ops, algo = setup(
        quad_cfg,
        "algorithm.name=fedavg",
        "data.noise=0",
        "algorithm.lr=0.2",
        "data.partition.clients_per_cluster=[2,3]",
    )
    state = run_rounds(algo, ops, 300)
    a = data.a[:, None]
    x_star = (a * data.optima()).sum(0) / a.sum()  # argmin sum_i a_i/2 ||x - mu_i||^2
    assert_close(state.x, x_star, atol=1e-4, rtol=0)


def test_oracle_reaches_each_cluster_centre_with_indicator_w(quad_cfg):
    cfg, data, ops, algo = setup(
        quad_cfg,
        "algorithm.name=oracle",
        "data.noise=0",
        "algorithm.lr=0.2",
        "data.partition.clients_per_cluster=[2,3,1]",
    )
    state = run_rounds(algo, ops, 200)
    assert_close(algo.eval_params(state), data.optima(), atol=1e-4, rtol=0)
    cl = data.cluster
    assert torch.equal(algo.collaboration(state), (cl[:, None] == cl[None, :]).float())


def test_ditto_with_lambda_zero_is_local_training(quad_cfg):
    _, _, ops, ditto = setup(quad_cfg, "algorithm.name=ditto", "algorithm.lam=0", "data.noise=0.3")
    _, _, _, local = setup(quad_cfg, "algorithm.name=local", "data.noise=0.3")
    s_d, s_l = run_rounds(ditto, ops, 15), run_rounds(local, ops, 15)
    assert_close(ditto.eval_params(s_d), local.eval_params(s_l))


def test_ditto_personal_step_by_hand(quad_cfg):
    cfg, data, ops, algo = setup(
        quad_cfg,
        "algorithm.name=ditto",
        "algorithm.lam=2",
        "data.noise=0",
        "algorithm.lr=0.1",
        "data.init_scale=1",
    )
    state = algo.init(ops)
    state.V = state.V + torch.randn_like(state.V)
    new, _ = algo.round(state, 0, ops)
    grad = data.a[:, None] * (state.V - data.optima())
    expected = state.V - 0.1 * (grad + 2.0 * (state.V - state.w))
    assert_close(new.V, expected)


def test_fedavg_ft_is_fedavg_then_local(quad_cfg):
    over = ("data.noise=0.2", "rounds=12", "algorithm.lr=0.1")
    _, _, ops, ft = setup(quad_cfg, "algorithm.name=fedavg_ft", "algorithm.ft_steps=4", *over)
    _, _, _, fa = setup(quad_cfg, "algorithm.name=fedavg", *over)
    s_ft = run_rounds(ft, ops, 8)
    s_fa = run_rounds(fa, ops, 8)
    assert_close(s_ft.x, s_fa.x)
    s_ft = run_rounds(ft, ops, 4, s_ft, start=8)
    assert s_ft.X is not None
    assert not torch.allclose(s_ft.X[0], s_ft.X[1])  # personalised after fine-tuning
    assert_close(s_ft.x, s_fa.x)  # the global model is frozen during fine-tuning


def test_fedavg_ft_rejects_too_many_ft_steps(quad_cfg):
    from raycobo.config import ConfigError

    with pytest.raises(ConfigError, match="algorithm.ft_steps"):
        setup(quad_cfg, "algorithm.name=fedavg_ft", "rounds=10", "algorithm.ft_steps=10")


def _same_partition(assign: torch.Tensor, truth: torch.Tensor) -> bool:
    a, b = assign.tolist(), truth.tolist()
    return all((a[i] == a[j]) == (b[i] == b[j]) for i in range(len(a)) for j in range(len(a)))


def test_ifca_recovers_well_separated_clusters(quad_cfg):
    cfg, data, ops, algo = setup(
        quad_cfg,
        "algorithm.name=ifca",
        "data.noise=0.01",
        "data.center_scale=5",
        "data.partition.clients_per_cluster=[3,2,3]",
        "algorithm.lr=0.2",
        "seed=1",
    )
    state = run_rounds(algo, ops, 100)
    assert _same_partition(state.assign, data.cluster)
    assert_close(algo.eval_params(state), data.optima(), atol=0.05, rtol=0)
    assert float(evaluate(algo, state, ops).loss.max()) < 1e-2


def test_fc_threshold_clustering_recovers_clusters(quad_cfg):
    cfg, data, ops, algo = setup(
        quad_cfg,
        "algorithm.name=fc",
        "data.noise=0.01",
        "data.center_scale=3",
        "data.partition.clients_per_cluster=[3,3]",
        "algorithm.lr=0.1",
        "data.init_scale=0",
    )
    state = run_rounds(algo, ops, 100)
    cl = data.cluster
    assert torch.equal(algo.collaboration(state), (cl[:, None] == cl[None, :]).float())
    assert_close(state.X, data.optima(), atol=0.05, rtol=0)


def test_threshold_clustering_ignores_outliers():
    from raycobo.algorithms.fc import threshold_cluster

    G = torch.tensor([[1.0, 0.0], [1.1, 0.0], [0.9, 0.1], [-5.0, 3.0], [8.0, 8.0]])
    v, inside = threshold_cluster(G, own=0, tau=0.5, c=3, iters=5)
    assert inside.tolist() == [True, True, True, False, False]
    # outliers are replaced by v: the fixed point is the inliers' mean
    assert_close(v, G[:3].mean(0), atol=1e-2, rtol=0)


def test_local_has_no_collaboration(quad_cfg):
    _, data, ops, algo = setup(quad_cfg, "algorithm.name=local", "data.noise=0", "algorithm.lr=0.3")
    state = run_rounds(algo, ops, 100)
    assert_close(state.X, data.optima(), atol=1e-4, rtol=0)
    assert algo.collaboration(state) is None
