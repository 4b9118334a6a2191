"""pFedGraph: the graph rows against a direct solver of their quadratic programme, the
graph term's gradient against autograd, one round by hand on three clients, and the
clusters recovered on the CoBo paper's quadratic clusters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from raycobo import rng
from raycobo.algorithms.pfedgraph import (
    PFedGraphConfig,
    PFedGraphState,
    graph_rows,
    graph_term_grad,
)
from raycobo.algorithms.projections import project_simplex
from tests.helpers import build, trained_losses


def test_the_graph_rows_solve_their_quadratic_programme():
    """min over the simplex of D_i . a + alpha ||a - p||^2, solved directly (SLSQP)."""
    g = torch.Generator().manual_seed(0)
    for alpha in (0.1, 0.8, 5.0):
        D = -torch.rand(6, 6, generator=g, dtype=torch.float64)
        p = torch.rand(6, generator=g, dtype=torch.float64)
        p /= p.sum()
        rows = project_simplex(p[None] - D / (2 * alpha))
        for i in range(6):
            d, q = D[i].numpy(), p.numpy()
            res = minimize(
                lambda a, d=d, q=q, k=alpha: d @ a + k * ((a - q) ** 2).sum(),
                np.full(6, 1 / 6),
                bounds=[(0, None)] * 6,
                constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1}],
                method="SLSQP",
                options={"ftol": 1e-12},
            )
            assert np.allclose(rows[i].numpy(), res.x, atol=1e-5), (alpha, i)
    assert torch.allclose(rows.sum(1), torch.ones(6, dtype=torch.float64))
    assert torch.equal(project_simplex(torch.tensor([[0.2, 0.8]])), torch.tensor([[0.2, 0.8]]))


def test_saturated_dissimilarities_count_as_minus_one():
    x0 = torch.zeros(2, dtype=torch.float64)
    Y = torch.tensor([[1.0, 0.0], [1.0, 0.2], [0.0, 1.0]], dtype=torch.float64)
    shares = torch.full((3,), 1 / 3, dtype=torch.float64)
    rows = graph_rows(Y, x0, shares, alpha=0.5)
    # client 0 and 1: cosine 0.98 (D -1 after saturation), 0 and 2: cosine 0
    D = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, -1.0, -0.2 / 1.0198039]], dtype=torch.float64)
    D = torch.cat([D, torch.tensor([[0.0, -0.2 / 1.0198039, -1.0]], dtype=torch.float64)])
    assert torch.allclose(rows, project_simplex(shares[None] - D / 1.0), atol=1e-6)


@pytest.mark.parametrize("term", ["paper", "code"])
def test_the_graph_terms_gradient_is_autograds(term):
    cfg = PFedGraphConfig(lam=0.3, graph_term=term)
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    a = torch.randn(3, 5, generator=g, dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity(a, theta, dim=1)
    if term == "paper":
        value = -0.3 * cos.sum()
    else:
        value = 0.3 * ((a * theta).sum(1) / theta.norm(dim=1)).sum()
    (want,) = torch.autograd.grad(value, theta)
    assert torch.allclose(graph_term_grad(theta.detach(), a, cfg), want)
    assert torch.equal(graph_term_grad(theta.detach(), torch.zeros(3, 5), cfg), torch.zeros(3, 5))


def test_one_round_by_hand_on_three_clients(quad_cfg):
    """Three quadratic clients, hand-set models and directions: two SGD steps each with
    the graph term, the rows from the changes' cosines, the aggregates and directions."""
    cfg = quad_cfg(
        "algorithm.name=pfedgraph",
        "algorithm.local_steps=2",
        "algorithm.lr=0.1",
        "algorithm.lam=0.5",
        "algorithm.alpha=0.4",
        "data.partition.num_clusters=3",
        "data.partition.clients_per_cluster=1",
    )
    _, ops, algo = build(cfg)
    st = algo.init(ops)
    X = st.x0 + torch.stack([torch.linspace(-1, 1, ops.dim) * s for s in (1.0, 2.0, -0.5)])
    a = torch.stack([torch.linspace(0, 1, ops.dim), torch.zeros(ops.dim), -X[0]])
    new, stats = algo.round(PFedGraphState(X, st.x0, st.A, a), 4, ops)
    clients, y = torch.arange(3), X.clone()
    for s in range(2):
        g = ops.grads(clients, y, 4, rng.STEP, s)[0]
        reg = torch.zeros_like(y)
        for i in (0, 2):  # client 1 has no direction yet
            yi = y[i].clone().requires_grad_(True)
            term = -0.5 * torch.nn.functional.cosine_similarity(a[i], yi, dim=0)
            reg[i] = torch.autograd.grad(term, yi)[0]
        y = y - 0.1 * (g + reg)
    unit = (y - st.x0) / (y - st.x0).norm(dim=1, keepdim=True)
    D = -(unit @ unit.T)
    D[D < -0.9] = -1.0
    rows = project_simplex(torch.full((1, 3), 1 / 3) - D / 0.8)
    assert torch.allclose(new.A, rows, atol=1e-6)
    assert torch.allclose(new.X, rows @ y, atol=1e-6)
    assert torch.allclose(new.direction, rows @ (y / y.norm(dim=1, keepdim=True)), atol=1e-6)
    assert stats["bytes_sent"] == 3 * 3 * ops.dim * 4  # model up, aggregate and direction down


def test_the_graph_recovers_the_quadratic_clusters(quad_cfg):
    """Example 2's clusters (2 of 4) with the defaults: after 30 rounds every client's row
    of the graph lies inside its own cluster, and its loss is below Local's."""
    partition = ["data.partition.num_clusters=2", "data.partition.clients_per_cluster=4"]
    ops, state, losses = trained_losses(quad_cfg("algorithm.name=pfedgraph", *partition), 30)
    cl = torch.as_tensor(ops.clusters)
    same = cl[:, None] == cl[None, :]
    inside = (state.A * same).sum(1)
    assert bool((inside > 0.99).all()), state.A
    _, _, alone_losses = trained_losses(quad_cfg("algorithm.name=local", *partition), 30)
    graph, alone = float(losses.mean()), float(alone_losses.mean())
    assert graph < alone, (graph, alone)
