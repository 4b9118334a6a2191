"""The quadratic task's gradients against the closed form."""

import torch
from torch.testing import assert_close

from raycobo import rng
from raycobo.data import load_data
from raycobo.engine.quadratic import QuadraticOps


def test_gradients_equal_closed_form_without_noise(quad_cfg):
    cfg = quad_cfg("data.noise=0", "data.partition.clients_per_cluster=[2,1]", "data.dim=4")
    p = load_data(cfg)
    ops = QuadraticOps(p, cfg.seed)
    Z = torch.randn(3, 4)
    clients = torch.tensor([0, 1, 2])
    G, L = ops.grads(clients, Z, 0, rng.STEP)
    mu = p.centers[p.cluster]
    assert_close(G, p.a[:, None] * (Z - mu))
    assert_close(L, 0.5 * p.a * ((Z - mu) ** 2).sum(1))
    # a finite-difference check of the gradient of f_0
    eps = 1e-3
    e = torch.zeros(4, dtype=torch.float64)
    e[1] = eps
    f = lambda x: 0.5 * float(p.a[0]) * float(((x - mu[0].double()) ** 2).sum())  # noqa: E731
    fd = (f(Z[0].double() + e) - f(Z[0].double() - e)) / (2 * eps)
    assert abs(fd - float(G[0, 1])) < 1e-3


def test_noise_is_unbiased_with_the_configured_std(quad_cfg):
    cfg = quad_cfg("data.noise=0.5", "data.dim=2000")
    p = load_data(cfg)
    ops = QuadraticOps(p, cfg.seed)
    Z = p.optima()[:2]  # gradient is pure noise at the optimum
    G, _ = ops.grads(torch.tensor([0, 1]), Z, 3, rng.STEP)
    assert abs(float(G.mean())) < 0.05
    assert abs(float(G.std()) - 0.5) < 0.03
    G2, _ = ops.grads(torch.tensor([0, 1]), Z, 3, rng.STEP)
    assert torch.equal(G, G2)  # same coordinates, same draw
    G3, _ = ops.grads(torch.tensor([0, 1]), Z, 4, rng.STEP)
    assert not torch.equal(G, G3)


def test_uneven_cluster_sizes(quad_cfg):
    p = load_data(quad_cfg("data.partition.clients_per_cluster=[1,4,2]"))
    assert p.cluster.tolist() == [0, 1, 1, 1, 1, 2, 2]
    assert p.centers.shape[0] == 3
