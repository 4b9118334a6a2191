"""W's storage: the sparse W against the dense one, and the agreement figures."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from raycobo.algorithms.cobo import CoBo, CoBoConfig, CoBoState, update_weights
from raycobo.algorithms.cobo.sparse import SparseBoxWeights
from tests.helpers import build, run_rounds


def test_sparse_w_stores_only_what_was_sampled():

    W = SparseBoxWeights.ones(5)
    W = W.update(torch.tensor([0, 1]), torch.tensor([3, 2]), torch.tensor([0.5, 0.0]))
    W = W.update(torch.tensor([0]), torch.tensor([3]), torch.tensor([0.25]))  # overwrite
    assert W.nnz == 2
    assert W.get(torch.tensor([0, 1, 2]), torch.tensor([3, 2, 4])).tolist() == [0.25, 0.0, 1.0]
    dense = W.to_dense()
    assert dense[3, 0] == 0.25 and dense[2, 1] == 0.0 and dense[4, 4] == 1.0
    X = torch.randn(5, 3)
    assert_close(W.matmul(X), dense @ X)
    assert_close(W.degree(), dense.sum(dim=1))


def test_sparse_w_keeps_only_entries_that_differ_from_w0():
    """With W^0 = 0, a pair measured misaligned returns to 0 and is dropped, and the
    product gathers only entries a threshold has not zeroed: memory and time follow the
    pairs that pull, not every pair ever sampled (a run of 2,500 clients slowed from 6.5
    to 11.5 s a round over its first 8 rounds before). The numbers are the dense W's."""
    from raycobo.algorithms.cobo import initial_weights, penalized_step

    g = torch.Generator().manual_seed(4)
    n, d = 9, 5
    X, G = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    edges = torch.tensor([[0, 1], [0, 5], [2, 3], [4, 8], [6, 7]])
    scores = torch.tensor([0.9, -0.4, 0.3, 0.6, -1.0])
    sparse = update_weights(SparseBoxWeights.initial(n, 0.0), edges, scores, 1.0, "box")
    dense = update_weights(initial_weights(n, "box", value=0.0), edges, scores, 1.0, "box")
    assert sparse.nnz == 3  # (0, 5) and (6, 7) projected back to 0: not stored
    assert torch.equal(sparse.to_dense(), dense)
    later = update_weights(sparse, torch.tensor([[0, 1]]), torch.tensor([-2.0]), 1.0, "box")
    assert later.nnz == 2 and float(later.get(torch.tensor([0]), torch.tensor([1]))) == 0.0
    ones = update_weights(SparseBoxWeights.initial(n, 1.0), edges, scores, 1.0, "box")
    assert ones.nnz == 2  # W^0 = 1: (0, 5) at 0.6 and (6, 7) at 0 kept, those back at 1 not
    for cut in (0.0, 0.5):  # the threshold zeroes (2, 3): it is left out of the gather
        want = penalized_step(X, G, dense, 0.1, 2.0, "mean", cut)
        assert_close(penalized_step(X, G, sparse, 0.1, 2.0, "mean", cut), want)


def test_mass_inside_is_the_same_for_dense_and_sparse_w():
    from raycobo.algorithms.base import cluster_agreement

    clusters = [0, 0, 0, 1, 1, 2, 2]
    sparse = SparseBoxWeights.ones(7)
    edges = torch.tensor([[0, 1], [0, 5], [2, 3], [4, 6], [1, 6], [3, 4]])
    scores = torch.tensor([-3.0, -8.0, -2.0, -10.0, -0.5, 1.0])
    sparse = update_weights(sparse, edges, scores, 0.1, "box")
    dense = cluster_agreement(sparse.to_dense(), clusters)
    got = sparse.cluster_agreement(clusters)
    assert set(got) == set(dense) == {"w_within", "w_across", "mass_inside"}
    for k in dense:
        assert got[k] == pytest.approx(dense[k])
    # by hand: W = 1 except the entries above; client 0's row: inside 1 + 0.7, all 6 - 1.1
    assert 0 < dense["mass_inside"] < 1


def test_the_agreement_gives_the_share_the_pull_reads():
    """Light cross-cluster weights everywhere: the whole W holds only 0.9 / (0.9 + 2 x
    0.3) = 0.6 of each row's mass inside its cluster, while the weights Eq. (3) reads
    (at or above the threshold, 0.5 by rule raycobo) hold all of it. A sparse W gives
    the same figures; rule paper and the simplex domain have no threshold and no such
    share; the run's summary records the cut."""

    clusters = [0, 0, 1, 1]
    W = torch.full((4, 4), 0.3)
    W[0, 1] = W[1, 0] = W[2, 3] = W[3, 2] = 0.9
    W.fill_diagonal_(1.0)
    algo = CoBo(CoBoConfig(), rounds=10, seed=0)
    assert CoBoConfig().collaboration_cut() == 0.5 == algo.pull.threshold
    dense = algo.cluster_agreement(CoBoState(torch.zeros(4, 1), W), clusters)
    assert dense["mass_inside"] == pytest.approx(0.6)
    assert dense["mass_pulled_inside"] == pytest.approx(1.0)
    keys = torch.tensor([0 * 4 + 1, 2 * 4 + 3])
    sparse = SparseBoxWeights(4, keys, torch.tensor([0.9, 0.9]), base=0.3, diag=1.0)
    got = algo.cluster_agreement(CoBoState(torch.zeros(4, 1), sparse), clusters)
    assert got.keys() == dense.keys()
    for k in dense:
        assert got[k] == pytest.approx(dense[k])
    for cfg in (CoBoConfig(preset="paper"), CoBoConfig(domain="simplex")):
        assert cfg.collaboration_cut() is None
        own = CoBo(cfg, rounds=10, seed=0).cluster_agreement(CoBoState(W[:, :1], W), clusters)
        assert "mass_pulled_inside" not in own and own["mass_inside"] == pytest.approx(0.6)


def test_sparse_w_needs_the_box_domain(quad_cfg):
    from raycobo.config import ConfigError

    _, ops, algo = build(quad_cfg("algorithm.weights=sparse", "algorithm.domain=simplex"))
    with pytest.raises(ConfigError, match="algorithm.weights"):
        algo.init(ops)


def test_a_run_beyond_the_dense_limit_writes_sparse_w(quad_cfg, tmp_path):
    from raycobo.lifecycle.experiment import run_experiment

    cfg = quad_cfg(
        "data.partition.clients_per_cluster=[2600,2600]",
        "rounds=2",
        "eval_every=1",
        "algorithm.rho=0.001",
    )
    res = run_experiment(cfg, tmp_path / "big")
    s = res.summary
    assert s["n_clients"] == 5200 and s["collaboration"] is None
    assert not (res.run_dir / "collaboration.npy").exists()
    W = torch.load(res.run_dir / "collaboration_sparse.pt")
    assert W["n"] == 5200 and W["i"].numel() == W["w"].numel() > 0
    assert set(s["cluster_agreement"]) == {
        "w_within",
        "w_across",
        "mass_inside",
        "mass_pulled_inside",
    }


def test_sparse_w_gives_the_dense_numbers(quad_cfg):
    """Ones + the sampled entries (algorithm.weights=sparse) is the same W and the same
    models as the dense matrix; only the pairs sampled so far are stored."""
    from raycobo.algorithms.base import cluster_agreement

    common = ("data.partition.clients_per_cluster=[3,4,5]", "algorithm.sampling=constant")
    _, ops, dense = build(quad_cfg("algorithm.weights=dense", *common))
    _, ops2, sparse = build(quad_cfg("algorithm.weights=sparse", *common))
    a = run_rounds(dense, ops, 12)
    b = run_rounds(sparse, ops2, 12)
    assert isinstance(b.W, SparseBoxWeights) and 0 < b.W.nnz < 66
    assert_close(b.W.to_dense(), a.W, atol=1e-6, rtol=1e-6)
    assert_close(b.X, a.X, atol=1e-5, rtol=1e-5)
    assert_close(sparse.collaboration(b), a.W, atol=1e-6, rtol=1e-6)
    clusters = list(ops.clusters)
    got, want = b.W.cluster_agreement(clusters), cluster_agreement(a.W, clusters)
    assert got.keys() == want.keys()
    for k in want:
        assert abs(got[k] - want[k]) < 1e-6
