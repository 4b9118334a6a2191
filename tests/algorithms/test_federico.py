"""FedeRiCo (Algorithm 1, Appendix E) on problems small enough to check by hand."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from raycobo.algorithms import build_algorithm, evaluate
from raycobo.algorithms.federico import FedeRiCo, FedeRiCoConfig, select_neighbours
from raycobo.data import load_data
from raycobo.engine import make_local_ops
from tests.helpers import build, on_engines, run_rounds


def test_e_step_is_softmax_of_ema_losses_by_hand(quad_cfg):
    """Noise 0, quadratic clients: ell_ib is the exact loss of model b on client i, the EMA
    starts at 0, and w_i = softmax(-L_i)."""
    cfg = quad_cfg(
        "data.noise=0",
        "data.partition.clients_per_cluster=[2,2]",
        "algorithm.name=federico",
        "algorithm.neighbors=1",
        "algorithm.beta=0.6",
        "algorithm.epsilon=0",
    )
    data = load_data(cfg)
    ops = make_local_ops(cfg, data)
    algo = build_algorithm(cfg.algorithm, 10, cfg.seed)
    s0 = algo.init(ops)
    s1, _ = algo.round(s0, 0, ops)
    n = 4
    # all weights are uniform at t=0: greedy picks the hash-ordered top neighbour
    B = select_neighbours(s0.W, 1, 0.0, cfg.seed, 0)
    ell = torch.zeros(n, n)
    for i in range(n):
        for b in (i, int(B[i, 0])):
            diff = s0.Phi[b] - data.optima()[i]
            ell[i, b] = 0.5 * data.a[i] * (diff @ diff)
    L = 0.6 * ell  # (1 - beta) * 0 + beta * ell
    assert_close(s1.ell, ell)
    assert_close(s1.L, L)
    assert_close(s1.W, torch.softmax(-L, dim=1))


def test_m_step_sums_weighted_gradients_received():
    """Two clients, SGD: each model moves by lr * sum_i w_ib grad ell_i(phi_b)."""
    from raycobo.data.quadratic import QuadraticProblem
    from raycobo.engine.quadratic import QuadraticOps

    p = QuadraticProblem(
        torch.tensor([[1.0, 0.0], [0.0, 2.0]]),
        torch.tensor([0, 1]),
        torch.tensor([1.0, 3.0]),
        0.0,
        torch.zeros(2),
    )
    ops = QuadraticOps(p, seed=0)
    cfg = FedeRiCoConfig(lr=0.1, neighbors=1, epsilon=0.0, beta=0.5)
    algo = FedeRiCo(cfg, 5, 0)
    s0 = algo.init(ops)
    s1, _ = algo.round(s0, 0, ops)
    mu, a = p.centers, p.a
    grads = torch.zeros(2, 2)
    for i in range(2):
        for b in range(2):  # each client evaluates itself and the other one
            grads[b] += s1.W[i, b] * a[i] * (s0.Phi[b] - mu[i])
    assert_close(s1.Phi, s0.Phi - 0.1 * grads)


def test_epsilon_greedy_selection():
    W = torch.tensor(
        [[0.1, 0.6, 0.2, 0.1], [0.5, 0.1, 0.3, 0.1], [0.2, 0.2, 0.1, 0.5], [0.3, 0.3, 0.3, 0.1]]
    )
    greedy = select_neighbours(W, 2, 0.0, seed=0, t=0)
    assert greedy[0].tolist() == [1, 2] and greedy[1].tolist() == [0, 2]
    assert all(i not in row.tolist() for i, row in enumerate(greedy))
    counts = torch.zeros(4, 4)
    for t in range(400):  # exploring: every other client comes up
        for i, row in enumerate(select_neighbours(W, 1, 1.0, seed=0, t=t)):
            counts[i, row] += 1
    assert torch.all(counts[~torch.eye(4, dtype=torch.bool)] > 60)
    assert torch.all(counts.diagonal() == 0)


def test_weights_concentrate_on_the_own_cluster(quad_cfg):
    """w_ij weighs *models*: a cluster's clients settle on the same model(s), other clusters
    on others (which client's model a cluster adopts depends on the random inits)."""
    cfg = quad_cfg(
        "data.noise=0.05",
        "data.center_scale=3",
        "data.dim=5",
        "data.partition.clients_per_cluster=[3,3]",
        "algorithm.name=federico",
        "algorithm.optimizer=adam",
        "algorithm.lr=0.05",
        "rounds=300",
    )
    data, ops, algo = build(cfg)
    state = run_rounds(algo, ops, cfg.rounds)
    cl = data.cluster
    same = cl[:, None] == cl[None, :]
    W = algo.collaboration(state)
    overlap = W @ W.T  # how much two clients rely on the same models
    assert torch.all(overlap[same] > 0.9) and torch.all(overlap[~same] < 0.05)
    assert float(evaluate(algo, state, ops).loss.max()) < 0.05


def test_mixture_prediction_agrees_across_engines(digits_cfg):
    """The mixture sum_j w_ij p(y|x; phi_j): vectorized logsumexp path = per-client loop."""
    cfg = digits_cfg("algorithm.name=federico", "algorithm.optimizer=adam", "algorithm.lr=0.01")
    out = [(s.Phi, s.W, evaluate(a, s, o)) for a, o, s in on_engines(cfg, 4)]
    (P1, W1, e1), (P2, W2, e2) = out
    assert_close(P1, P2, atol=1e-5, rtol=1e-4)
    assert_close(W1, W2, atol=1e-5, rtol=1e-4)
    assert_close(e1.loss, e2.loss, atol=1e-4, rtol=1e-4)
    assert_close(e1.accuracy, e2.accuracy)
