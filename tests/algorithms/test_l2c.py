"""L2C and meta-L2C (Algorithm 1 of the L2C paper) on problems with a known answer."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from raycobo import rng
from raycobo.algorithms.l2c import (
    masked_softmax,
    prune,
    validation_signal,
)
from raycobo.algorithms.meta_l2c import ChannelEncoder
from raycobo.config import ConfigError
from tests.helpers import build, on_engines, run_rounds


def _quad(quad_cfg, *extra):
    return quad_cfg(
        "data.partition.clients_per_cluster=[3,3,3]",
        "data.noise=0.1",
        "algorithm.local_steps=5",
        "algorithm.lr=0.1",
        *extra,
    )


def test_alpha_gradient_matches_finite_differences(digits_cfg):
    """d L_val(theta_i^{t+1}(alpha)) / d alpha through the softmax and the aggregation,
    against central differences of the validation losses on the same minibatch."""
    cfg = digits_cfg("algorithm.name=l2c", "algorithm.local_steps=3")
    _, ops, algo = build(cfg)
    torch.manual_seed(0)
    state = run_rounds(algo, ops, 2)
    n, t = ops.n_clients, 2
    clients = torch.arange(n)
    Y = state.X.clone()
    for s in range(3):
        G, _ = ops.grads(clients, Y, t, rng.STEP, s)
        Y -= 0.1 * G
    D = (state.X - Y).double()
    X = state.X.double()
    alpha = (0.5 * torch.randn(n, n, dtype=torch.float64)).requires_grad_()
    mask = torch.ones(n, n, dtype=torch.bool)
    mask[0, 3] = False  # a pruned edge carries no weight and no gradient
    W = masked_softmax(alpha, mask)
    A, _, _ = validation_signal(ops, X.float(), D.float(), W.detach().float(), t)
    W.backward(A.double())

    def total_val_loss(a: torch.Tensor) -> float:
        Wa = masked_softmax(a, mask)
        return float(ops.losses(clients, (X - Wa @ D).float(), t, rng.VAL, 0).double().sum())

    eps = 1e-2
    fd = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            e = torch.zeros(n, n, dtype=torch.float64)
            e[i, j] = eps
            fd[i, j] = (total_val_loss(alpha.detach() + e) - total_val_loss(alpha.detach() - e)) / (
                2 * eps
            )
    assert alpha.grad[0, 3] == 0
    assert_close(alpha.grad, fd, atol=2e-3, rtol=5e-2)


def test_validation_gradient_uses_each_clients_own_held_out_data(digits_cfg):
    """Row i of dL/dW comes from client i's validation minibatch: changing another
    client's model leaves it unchanged; validation draws never touch training positions."""
    cfg = digits_cfg("algorithm.name=l2c")
    data, ops, _ = build(cfg)
    n = ops.n_clients
    X = ops.initial_params().repeat(n, 1)
    D = 0.01 * torch.randn(n, ops.dim, generator=torch.Generator().manual_seed(1))
    W = torch.eye(n)
    A1, _, _ = validation_signal(ops, X, D, W, 0)
    X2 = X.clone()
    X2[1] += 0.5
    A2, _, _ = validation_signal(ops, X2, D, W, 0)
    assert_close(A1[0], A2[0])
    assert not torch.allclose(A1[1], A2[1])
    b = ops.batches
    clients = torch.arange(n)
    val_pos = b.positions(clients, 0, rng.VAL, 0) - b.offsets[:, None]
    fit_pos = b.positions(clients, 0, rng.STEP, 0) - b.offsets[:, None]
    assert (val_pos >= b.sizes[:, None]).all()
    assert (fit_pos < b.sizes[:, None]).all()
    assert data.val_sizes == [round(0.2 * s) for s in data.train_sizes()]


def test_l2c_weights_and_pruned_topology_favour_same_task_clients(quad_cfg):
    cfg = _quad(quad_cfg, "algorithm.name=l2c", "algorithm.prune_fraction=0.625")
    data, ops, algo = build(cfg)
    state = algo.init(ops)
    stats = []
    for t in range(40):
        state, s = algo.round(state, t, ops)
        stats.append(s)
    cl = torch.tensor(ops.clusters)
    same = cl[:, None] == cl[None, :]
    W = state.W
    assert float(W[same].sum()) / 9 > 0.9  # rows sum to 1; > 90 % on the own cluster
    # after T0 = 10 each client kept its 2 cluster mates among its 3 remaining neighbours
    off = ~torch.eye(9, dtype=torch.bool)
    assert int((state.mask & off).sum(1).max()) == 3
    assert bool((state.mask | ~same).all())
    assert stats[5]["edges"] == 72 and stats[10]["edges"] == 27
    assert stats[10]["bytes_sent"] == 27 * ops.dim * 4
    ev = ops.evaluate(torch.arange(9), state.X).loss
    assert float(ev.mean()) < 0.01  # near the cluster optima, which Local cannot reach


def test_prune_removes_the_smallest_weights():
    W = torch.tensor(
        [[0.4, 0.1, 0.3, 0.2], [0.2, 0.4, 0.3, 0.1], [0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]]
    )
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2, 0] = False
    out = prune(W, mask, 0.5)
    assert out.diagonal().all()
    # floor(0.5 * 3) = 1 removed; row 2 had 2 neighbours left (0 was gone): 1 removed
    assert out.sum(1).tolist() == [3, 3, 2, 3]
    assert not out[0, 1] and not out[1, 3] and not out[3, 0]
    assert not out[2, 0] and not out[2, 1] and out[2, 3]


def test_meta_l2c_encoder_gives_identical_updates_identical_weights():
    layout = [(0, 4, 3), (12, 1, 4), (16, 2, 4)]
    enc = ChannelEncoder(layout, hidden=10, out=5)
    V = torch.randn(5, 24)
    V[3] = V[1]
    E = enc(V)
    assert E.shape == (5, (4 + 1 + 2) * 5)
    W = masked_softmax(E @ E.T, torch.ones(5, 5, dtype=torch.bool))
    assert_close(W[:, 1], W[:, 3])
    assert_close(W[0, 1], W[0, 3])
    # one network per layer, shared across the layer's channels (Eq. 7)
    assert len(enc.nets) == 3 and enc.nets[0][0].in_features == 3


def test_meta_l2c_learns_and_transfers_its_encoder(quad_cfg, tmp_path):
    """Weights concentrate on the own cluster; the exported encoder loads into a fresh
    run (frozen) and reproduces the trained mixing; a mismatched model is refused."""
    from raycobo.algorithms.meta_l2c import encoder_payload

    cfg = _quad(
        quad_cfg, "algorithm.name=meta_l2c", "algorithm.mix_lr=0.01", "algorithm.prune_round=null"
    )
    _, ops, algo = build(cfg)
    state = run_rounds(algo, ops, 100)
    cl = torch.tensor(ops.clusters)
    same = cl[:, None] == cl[None, :]
    assert float(state.W[same].sum()) / 9 > 0.6
    path = tmp_path / "encoder.pt"
    torch.save(algo.artifacts(state)["encoder"], path)
    frozen = _quad(
        quad_cfg,
        "algorithm.name=meta_l2c",
        f"algorithm.encoder_path={path}",
        "algorithm.train_encoder=false",
        "algorithm.prune_round=null",
    )
    _, ops2, algo2 = build(frozen)
    s2 = algo2.init(ops2)
    assert s2.opt is None
    trained = algo.artifacts(state)["encoder"]["state_dict"]
    assert_close(encoder_payload(s2.params)["state_dict"], trained)
    # the frozen encoder gives the trained one's mixing weights on the same state
    from raycobo.algorithms.l2c import masked_softmax

    Dhat = state.X - state.X0
    W_trained = masked_softmax(algo.mixing.logits(state.params, Dhat), state.mask)
    W_frozen = masked_softmax(algo2.mixing.logits(s2.params, Dhat), state.mask)
    assert_close(W_frozen, W_trained, atol=1e-7, rtol=1e-6)
    s2 = run_rounds(algo2, ops2, 30, s2)
    assert float(s2.W[same].sum()) / 9 > 0.6  # good weights without training the encoder
    other = quad_cfg("data.dim=7", "algorithm.name=meta_l2c", f"algorithm.encoder_path={path}")
    with pytest.raises(ConfigError, match="encoder_path"):
        build(other)[2].init(build(other)[1])


@pytest.mark.parametrize("name", ["l2c", "meta_l2c"])
def test_engines_agree(digits_cfg, name):
    cfg = digits_cfg(f"algorithm.name={name}", "algorithm.local_steps=2", "algorithm.prune_round=2")
    (a, _, s_local), (_, _, s_loop) = on_engines(cfg, 4)
    assert_close(s_local.X, s_loop.X, atol=1e-4, rtol=1e-4)
    assert_close(s_local.W, s_loop.W, atol=1e-4, rtol=1e-4)
    assert torch.equal(s_local.mask, s_loop.mask)


def test_validation_draw_without_holdout_is_refused(digits_cfg):
    cfg = digits_cfg("algorithm.name=cobo")
    _, ops, _ = build(cfg)
    with pytest.raises(ValueError, match="validation_fraction"):
        ops.grads(torch.arange(2), ops.initial_params().repeat(2, 1), 0, rng.VAL, 0)
    cfg = digits_cfg("algorithm.name=l2c", "data.validation_fraction=0")
    _, ops, algo = build(cfg)
    with pytest.raises(ValueError, match="validation_fraction"):
        run_rounds(algo, ops, 1)


def test_meta_l2c_run_exports_its_encoder_for_transfer(quad_cfg, tmp_path):
    from raycobo.lifecycle.experiment import run_experiment

    res = run_experiment(quad_cfg("algorithm.name=meta_l2c", "rounds=4"), tmp_path / "pre")
    path = res.run_dir / "encoder.pt"
    assert path.is_file() and res.summary["status"] == "completed"
    again = run_experiment(
        quad_cfg(
            "algorithm.name=meta_l2c",
            "rounds=2",
            f"algorithm.encoder_path={path}",
            "algorithm.train_encoder=false",
        ),
        tmp_path / "transfer",
    )
    assert again.summary["status"] == "completed"
    history = again.summary["history"]
    assert history[-1]["edges"] > 0 and "val_loss" in history[-1]
