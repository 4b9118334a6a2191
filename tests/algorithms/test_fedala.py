"""FedALA: the blend by hand, the weights' first adaptation reaching its known answer on a
noise-free quadratic, one round by hand on two clients, and its personalisation beating
FedAvg on the CoBo paper's quadratic clusters."""

from __future__ import annotations

import torch

from raycobo import rng
from raycobo.algorithms.fedala import FedALAState, adapt, blend, head_start
from tests.helpers import build, run_rounds, trained_losses


def test_the_blend_and_the_head_by_hand():
    layout = [(0, 4, 3), (12, 4, 1), (16, 2, 4), (24, 2, 1)]  # W1, b1, W2, b2
    assert head_start(layout, 2) == 16 and head_start(layout, 1) == 24
    assert head_start(layout, 9) == 0  # more layers than the model has: all of it
    X = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    g = torch.tensor([5.0, 6.0, 7.0, 8.0])
    W = torch.tensor([[0.0, 0.25]])
    # the lower entries take g; the head theta + (g - theta) * W
    assert torch.equal(blend(X, g, W), torch.tensor([[5.0, 6.0, 3.0, 5.0]]))


def test_the_first_adaptation_reaches_the_clipped_minimiser(quad_cfg):
    """One noise-free quadratic client, f = a/2 ||z - mu||^2, g = theta + 1 on every
    entry, step size 1/a: each entry's weight is the minimiser of f over [0, 1],
    clip(mu - theta, 0, 1), after the passes its constant losses end."""
    cfg = quad_cfg(
        "algorithm.name=fedala",
        "data.noise=0",
        "data.partition.num_clusters=1",
        "data.partition.clients_per_cluster=1",
    )
    data, ops, _ = build(cfg)
    a, mu = float(data.a[0]), data.optima()[0]
    cfg = cfg.algorithm.model_copy(update={"ala_lr": 0.5 / a})
    theta = mu - torch.linspace(-1.5, 2.5, ops.dim, dtype=mu.dtype)  # mu - theta spans [-1.5, 2.5]
    g = theta + 1.0
    rows = torch.tensor([0])
    W = adapt(ops, cfg, rows, theta[None], g, torch.ones(1, ops.dim), torch.tensor([True]), 1)
    assert torch.allclose(W[0], (mu - theta).clamp(0, 1), atol=2e-3)


def test_one_round_by_hand_on_two_clients(quad_cfg):
    """Two clients past their first adaptation: one pass (round(0.8 * 5) = 4 projected
    steps on W, stream ADAPT), the blend, five SGD steps, and the size-weighted mean."""
    cfg = quad_cfg(
        "algorithm.name=fedala",
        "algorithm.local_steps=5",
        "algorithm.lr=0.1",
        "algorithm.ala_lr=0.3",
        "data.partition.num_clusters=2",
        "data.partition.clients_per_cluster=1",
    )
    _, ops, algo = build(cfg)
    st = algo.init(ops)
    X = st.X + torch.stack([torch.linspace(-1, 1, ops.dim), torch.linspace(2, 0, ops.dim)])
    g = st.g + 0.5
    W0 = torch.full((2, ops.dim), 0.7)
    state = FedALAState(g, X, W0, torch.ones(2, dtype=torch.bool))
    new, stats = algo.round(state, 3, ops)
    clients, W = torch.arange(2), W0
    for k in range(4):
        Z = g + (1 - W) * (X - g)  # theta + (g - theta) W, the whole vector a quadratic's head
        G = ops.grads(clients, Z, 3, rng.ADAPT, k)[0]
        W = (W - 0.3 * G * (g - X)).clamp(0, 1)
    y = X + (g - X) * W
    assert torch.allclose(new.W, W, atol=1e-6)
    for s in range(5):
        y = y - 0.1 * ops.grads(clients, y, 3, rng.STEP, s)[0]
    assert torch.allclose(new.X, y, atol=1e-5)
    sizes = ops.data_sizes()
    assert torch.allclose(new.g, (sizes[:, None] * y).sum(0) / sizes.sum(), atol=1e-5)
    assert stats["bytes_sent"] == 2 * 2 * ops.dim * 4  # the global model down, each model up
    assert algo.collaboration(new) is None


def test_the_first_round_trains_from_the_global_model_and_later_ones_adapt(quad_cfg):
    cfg = quad_cfg("algorithm.name=fedala", "algorithm.local_steps=2")
    _, ops, algo = build(cfg)
    st = algo.init(ops)
    one = run_rounds(algo, ops, 1, st)
    assert torch.equal(one.W, st.W) and not bool(one.adapted.any())  # nothing adapted yet
    two = run_rounds(algo, ops, 1, one)
    assert bool(two.adapted.all()) and not torch.equal(two.W, one.W)


def test_its_personal_models_beat_fedavg_on_the_quadratic_clusters(quad_cfg):
    """Example 2's clusters (2 of 4): a quadratic's one layer is all head, so each entry
    of W picks between the global and the own model; after 30 rounds every client's loss
    is below FedAvg's mean."""
    partition = ["data.partition.num_clusters=2", "data.partition.clients_per_cluster=4"]
    _, _, ala = trained_losses(quad_cfg("algorithm.name=fedala", *partition), 30)
    _, _, avg = trained_losses(quad_cfg("algorithm.name=fedavg", *partition), 30)
    assert float(ala.max()) < float(avg.mean()), (ala, avg)
