"""Eq. (3)'s pull by hand: dense and sparse W, the threshold, the mean pull, the stepped models."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from raycobo.algorithms.cobo import update_weights
from raycobo.algorithms.cobo.pull import penalty
from raycobo.algorithms.cobo.sparse import SparseBoxWeights


def test_penalty_is_weighted_sum_of_differences():
    X = torch.randn(4, 3)
    W = torch.rand(4, 4)
    expected = torch.stack([sum(W[i, k] * (X[i] - X[k]) for k in range(4)) for i in range(4)])
    assert_close(penalty(X, W), expected)


def test_fused_step_equals_equation_3():
    from raycobo.algorithms.cobo import penalized_step

    g = torch.Generator().manual_seed(0)
    X, G, W = (
        torch.randn(5, 7, generator=g),
        torch.randn(5, 7, generator=g),
        torch.rand(5, 5, generator=g),
    )
    assert_close(penalized_step(X, G, W, 0.1, 0.3), X - 0.1 * (G + 0.3 * penalty(X, W)))


@pytest.mark.parametrize("pull", ["mean", "sum"])
def test_the_mean_pull_acts_on_the_models_after_their_gradient_step(pull):
    """The mean pull: Eq. (3)'s pull on y = x - lr g instead of x (dense and sparse W
    alike, thresholded too); the summed pull is Eq. (3) as printed."""
    from raycobo.algorithms.cobo import penalized_step, pull_weights

    g = torch.Generator().manual_seed(3)
    n, d, lr, rho = 6, 4, 0.1, 2.0
    X, G = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    edges = torch.tensor([[0, 1], [0, 5], [2, 3], [4, 5], [1, 4]])
    sparse = update_weights(
        SparseBoxWeights.ones(n), edges, torch.tensor([-0.3, -0.9, -0.1, -0.8, -0.6]), 1.0, "box"
    )
    dense = sparse.to_dense()
    P = pull_weights(dense, pull, 0.3)
    Y = X - lr * G
    stepped = Y - lr * rho * (P.sum(dim=1, keepdim=True) * Y - P @ Y)
    printed = X - lr * (G + rho * (P.sum(dim=1, keepdim=True) * X - P @ X))
    assert not torch.allclose(stepped, printed)
    want = stepped if pull == "mean" else printed
    assert_close(penalized_step(X, G, dense, lr, rho, pull, 0.3), want)
    assert_close(penalized_step(X, G, sparse, lr, rho, pull, 0.3), want)


def test_the_mean_pull_agrees_between_dense_and_sparse_w():
    from raycobo.algorithms.cobo import penalized_step

    g = torch.Generator().manual_seed(0)
    n, d = 7, 4
    X, G = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    sparse = SparseBoxWeights.ones(n)
    edges = torch.tensor([[0, 1], [0, 5], [2, 3], [4, 6], [1, 6]])
    sparse = update_weights(sparse, edges, torch.tensor([-3.0, -8.0, 2.0, -1.0, -0.5]), 0.1, "box")
    dense = sparse.to_dense()
    want = penalized_step(X, G, dense, 0.1, 2.0, "mean")
    assert_close(penalized_step(X, G, sparse, 0.1, 2.0, "mean"), want)
    # the pull is toward the weighted mean of y_i = x_i - lr g_i and its collaborators
    Y = X - 0.1 * G
    target = (dense @ Y) / dense.sum(dim=1, keepdim=True)
    assert_close(want, Y - 0.1 * 2.0 * (Y - target))


@pytest.mark.parametrize("pull", ["mean", "sum"])
def test_the_pull_threshold_leaves_weak_edges_out_dense_and_sparse(pull):
    """pull_threshold: entries of W below it are left out of Eq. (3); the same step from
    a dense W, from SparseBoxWeights, and by hand with those entries zeroed."""
    from raycobo.algorithms.cobo import penalized_step

    g = torch.Generator().manual_seed(1)
    n, d = 7, 3
    X, G = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    edges = torch.tensor([[0, 1], [0, 5], [2, 3], [4, 6], [1, 6]])
    sparse = update_weights(
        SparseBoxWeights.ones(n), edges, torch.tensor([-0.45, -0.9, -0.8, -0.1, -0.3]), 1.0, "box"
    )
    dense = sparse.to_dense()  # stored entries 0.55, 0.1, 0.2, 0.9, 0.7
    cut = dense.where(dense >= 0.3, torch.zeros(()))
    assert int((cut == 0).sum()) == 4  # (0, 5) and (2, 3), both ways
    lr, rho = 0.1, 0.5
    want = penalized_step(X, G, cut, lr, rho, pull)
    assert_close(penalized_step(X, G, dense, lr, rho, pull, 0.3), want)
    assert_close(penalized_step(X, G, sparse, lr, rho, pull, 0.3), want)
    assert not torch.allclose(penalized_step(X, G, dense, lr, rho, pull), want)


@pytest.mark.parametrize("pull", ["mean", "sum"])
def test_w0_below_one_agrees_between_dense_and_sparse_w(pull):
    """W^0 between clients below 1 (w_ii = 1; 0 with a pull threshold). A sparse W
    started at 0 gives the dense W's step (thresholded or not), its degree and its
    export; the pairs never sampled do not pull."""
    from raycobo.algorithms.cobo import initial_weights, penalized_step

    g = torch.Generator().manual_seed(2)
    n, d = 6, 3
    X, G = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    edges = torch.tensor([[0, 1], [0, 5], [2, 3], [1, 4]])
    scores = torch.tensor([0.9, 0.2, 0.6, -0.5])
    for w0 in (0.0, 0.4):
        dense = update_weights(initial_weights(n, "box", value=w0), edges, scores, 1.0, "box")
        sparse = update_weights(SparseBoxWeights.initial(n, w0), edges, scores, 1.0, "box")
        assert torch.equal(sparse.to_dense(), dense) and bool((dense.diagonal() == 1).all())
        assert_close(sparse.degree(), dense.sum(dim=1))
        for cut in (0.0, 0.3, 0.5):
            want = penalized_step(X, G, dense, 0.1, 2.0, pull, cut)
            assert_close(penalized_step(X, G, sparse, 0.1, 2.0, pull, cut), want)
    # W^0 = 0: client 3's only collaborator is 2, client 5's none above 0.5 -> no pull
    dense = update_weights(initial_weights(n, "box", value=0.0), edges, scores, 1.0, "box")
    step = penalized_step(X, G, dense, 0.1, 2.0, pull, 0.5)
    assert_close(step[5], X[5] - 0.1 * G[5])
    assert not torch.allclose(step[3], X[3] - 0.1 * G[3])


def test_a_mostly_zero_pull_is_multiplied_as_a_sparse_matrix(monkeypatch):
    """Eq. (3)'s W X where at most a tenth of W's entries are nonzero (W^0 = 0 and the
    threshold leave a cluster's worth per row) is a sparse product: the same numbers as
    the dense one to float rounding, and no product at all where W is all zeros."""
    from raycobo.algorithms.cobo import pull as cobo

    g = torch.Generator().manual_seed(3)
    n, d = 40, 16
    X, G = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    cl = torch.arange(n) // 4
    W = (cl[:, None] == cl[None, :]).float() * torch.rand(n, n, generator=g)
    calls = []
    real = torch.sparse.mm
    monkeypatch.setattr(torch.sparse, "mm", lambda *a: calls.append(1) or real(*a))
    sparse = cobo.penalized_rows(X, X, G, W, 0.1, 5.0)
    assert calls == [1]
    monkeypatch.setattr(cobo, "SPARSE_PULL_SHARE", 0.0)
    assert_close(sparse, cobo.penalized_rows(X, X, G, W, 0.1, 5.0), atol=1e-6, rtol=1e-6)
    assert calls == [1]  # the dense product this time
    monkeypatch.setattr(torch.Tensor, "addmm_", None)  # no product of either kind is made
    monkeypatch.setattr(cobo, "SPARSE_PULL_SHARE", 0.1)
    assert_close(cobo.penalized_rows(X, X, G, torch.zeros(n, n), 0.1, 5.0), X - 0.1 * G)
    assert calls == [1]
