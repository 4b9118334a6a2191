"""FedSep (Algorithm 1, Section 4.1) and Top-K with error feedback."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.testing import assert_close

from raycobo.algorithms.common import top_k
from raycobo.algorithms.fedsep import (
    active_set,
    encode_exact,
    encode_neumann,
    gaussian_sketch,
    lasso_decode,
    spectral_norm_sq,
)
from raycobo.config import ConfigError
from tests.helpers import build, on_engines, run_rounds


def _problem(p=30, d=60, seed=0):
    S = gaussian_sketch(p, d, seed).double()
    g = torch.Generator().manual_seed(seed + 1)
    truth = torch.zeros(d, dtype=torch.float64)
    truth[torch.randperm(d, generator=g)[:8]] = torch.randn(8, generator=g, dtype=torch.float64)
    omega = S @ truth + 0.01 * torch.randn(p, generator=g, dtype=torch.float64)
    return S, omega


def test_decoder_converges_to_the_reference_lasso_solution():
    """FISTA against scikit-learn's coordinate-descent Lasso (alpha = beta / p, since
    sklearn scales the squared error by 1 / (2 n_samples))."""
    from sklearn.linear_model import Lasso

    S, omega = _problem()
    beta = 0.01
    gamma = 1.0 / spectral_norm_sq(S)
    theta = lasso_decode(S, omega[None], beta, gamma, 3000)[0]
    ref = Lasso(alpha=beta / S.shape[0], fit_intercept=False, tol=1e-12, max_iter=100_000)
    ref.fit(S.numpy(), omega.numpy())
    assert_close(theta, torch.from_numpy(ref.coef_), atol=1e-6, rtol=1e-5)
    assert int((theta != 0).sum()) <= S.shape[0]  # at most p nonzeros


@pytest.mark.parametrize("encoder", ["exact", "neumann"])
def test_encoder_matches_finite_differences_of_the_decoder(encoder):
    """<Enc{v}, u> = -<v, (d theta / d omega) u> for a direction u, the Jacobian by
    central differences of the converged decoder (the active set does not change)."""
    S, omega = _problem()
    beta, p, d = 0.01, *S.shape
    gamma = 1.0 / spectral_norm_sq(S)

    def dec(w):
        return lasso_decode(S, w[None], beta, gamma, 5000)[0]

    theta = dec(omega)
    g = torch.Generator().manual_seed(7)
    u = torch.randn(p, generator=g, dtype=torch.float64)
    v = torch.randn(d, generator=g, dtype=torch.float64)
    eps = 1e-5
    jvp = (dec(omega + eps * u) - dec(omega - eps * u)) / (2 * eps)  # (d theta/d omega) u
    active = active_set(S, omega[None], theta[None], beta, gamma)
    if encoder == "exact":
        enc = encode_exact(S, active, v[None])[0]
    else:
        enc = encode_neumann(S, active, v[None], terms=3000, tau=gamma)[0]
    assert_close(enc @ u, -(v @ jvp), atol=1e-5, rtol=1e-4)
    # only the active coordinates move
    assert_close(jvp[~active[0]], torch.zeros_like(jvp[~active[0]]), atol=1e-8, rtol=0)


def test_identity_sketch_without_sparsity_is_fedavg(quad_cfg):
    """p = d, S = I, beta = 0: Dec = Enc = identity, and line 20 with eta_g = 1 is FedAvg
    (equal client sizes, so FedAvg's size weights are uniform)."""
    common = ("data.noise=0.2", "algorithm.local_steps=3", "algorithm.client_rate=0.5")
    _, ops, fedavg = build(quad_cfg("algorithm.name=fedavg", *common))
    _, ops2, fedsep = build(
        quad_cfg(
            "algorithm.name=fedsep", "algorithm.sketch=identity", "algorithm.sparsity=0", *common
        )
    )
    a = run_rounds(fedavg, ops, 6)
    b = run_rounds(fedsep, ops2, 6)
    assert_close(fedsep.eval_params(b)[0], a.x, atol=1e-6, rtol=1e-6)


def test_bytes_sent_scale_with_the_sketch_dimension(digits_cfg):
    sent = {}
    for p in (20, 80):
        cfg = digits_cfg("algorithm.name=fedsep", f"algorithm.sketch_dim={p}")
        _, ops, algo = build(cfg)
        state = algo.init(ops)
        _, stats = algo.round(state, 0, ops)
        sent[p] = stats["bytes_sent"]
        assert stats["bytes_sent"] == 2 * ops.n_clients * p * 4
    _, ops, algo = build(digits_cfg("algorithm.name=fedavg"))
    _, stats = algo.round(algo.init(ops), 0, ops)
    assert stats["bytes_sent"] == 2 * ops.n_clients * ops.dim * 4
    assert sent[80] == 4 * sent[20]


def test_fedsep_learns_through_a_small_sketch(digits_cfg):
    cfg = digits_cfg(
        "algorithm.name=fedsep",
        "algorithm.sketch_dim=300",
        "algorithm.sparsity=0.01",
        "algorithm.server_lr=5",
        "algorithm.local_steps=3",
        "rounds=30",
    )
    _, ops, algo = build(cfg)
    state = algo.init(ops)
    before = ops.evaluate(torch.arange(ops.n_clients), algo.eval_params(state)).loss.mean()
    state = run_rounds(algo, ops, 30, state)
    after = ops.evaluate(torch.arange(ops.n_clients), algo.eval_params(state)).loss.mean()
    assert after < 0.8 * before


def test_per_client_sketches_give_personal_decodings(digits_cfg):
    cfg = digits_cfg(
        "algorithm.name=fedsep", "algorithm.sketch_dim=100", "algorithm.sketch_shared=false"
    )
    (_, ops, s_local), (_, _, s_loop) = on_engines(cfg, 2)
    assert not torch.allclose(s_local.Y[0], s_local.Y[1])
    assert_close(s_local.x, s_loop.x, atol=1e-4, rtol=1e-4)


def test_bad_sketch_settings_name_their_key(quad_cfg):
    _, ops, algo = build(
        quad_cfg("algorithm.name=fedsep", "algorithm.sketch_dim=5", "algorithm.sparsity=0")
    )
    with pytest.raises(ConfigError, match="algorithm.sparsity"):
        algo.init(ops)
    _, ops, algo = build(
        quad_cfg("algorithm.name=fedsep", "algorithm.sketch=identity", "algorithm.sketch_dim=4")
    )
    with pytest.raises(ConfigError, match="algorithm.sketch_dim"):
        algo.init(ops)


def test_top_k_keeps_the_largest_entries_and_feeds_back_the_rest(quad_cfg):
    V = torch.tensor([[0.1, -3.0, 2.0, 0.5], [1.0, 0.0, -0.25, 0.375]])
    assert top_k(V, 2).tolist() == [[0.0, -3.0, 2.0, 0.0], [1.0, 0.0, 0.0, 0.375]]
    # K = d is FedAvg with a plain mean; smaller K leaves the rest in the error memory
    common = ("data.noise=0.2", "algorithm.local_steps=2")
    _, ops, fedavg = build(quad_cfg("algorithm.name=fedavg", *common))
    _, ops2, full = build(quad_cfg("algorithm.name=topk_ef", "algorithm.topk_fraction=1", *common))
    assert_close(run_rounds(full, ops2, 4).x, run_rounds(fedavg, ops, 4).x, atol=1e-6, rtol=1e-6)
    _, ops3, sparse = build(
        quad_cfg("algorithm.name=topk_ef", "algorithm.topk_fraction=0.2", *common)
    )
    s0 = sparse.init(ops3)
    s1, stats = sparse.round(s0, 0, ops3)
    # what was not sent is remembered: memory + sent = the full local update, per client
    assert int((s1.E != 0).sum(dim=1).max()) == ops3.dim - 2
    sent_mean = s1.x - s0.x
    full_update = s1.E.mean(dim=0) + sent_mean
    _, ops4, one = build(quad_cfg("algorithm.name=topk_ef", "algorithm.topk_fraction=1", *common))
    s_full, _ = one.round(one.init(ops4), 0, ops4)
    assert_close(full_update, s_full.x - s0.x, atol=1e-6, rtol=1e-6)
    assert stats["bytes_sent"] > 0


# -- model-heterogeneous FedSep (Section 4.2) ------------------------------------------


def _hetero(digits_cfg, *extra):
    return build(digits_cfg("algorithm.name=fedsep_hetero", "model.hidden=[16, 8]", *extra))


def test_channel_mask_gradient_matches_finite_differences(digits_cfg):
    """d L(expand(a) . omega) / d a_u, assembled from one gradient call, against central
    differences of the same minibatch loss."""
    from raycobo import rng
    from raycobo.algorithms.fedsep_hetero import expand_mask, unit_gradient

    _, ops, algo = _hetero(digits_cfg)
    state = algo.init(ops)
    layers, d = state.layers, ops.dim
    clients = torch.tensor([0])
    g = torch.Generator().manual_seed(3)
    A = 0.3 + 0.6 * torch.rand(1, 24, generator=g)
    omega = state.w[None]
    G, _ = ops.grads(clients, expand_mask(layers, A, d) * omega, 0, rng.LOSS, 0)
    analytic = unit_gradient(layers, G * omega)[0]
    eps = 1e-2
    for u in (0, 7, 16, 23):
        e = torch.zeros_like(A)
        e[0, u] = eps
        lp = ops.losses(clients, expand_mask(layers, A + e, d) * omega, 0, rng.LOSS, 0)
        lm = ops.losses(clients, expand_mask(layers, A - e, d) * omega, 0, rng.LOSS, 0)
        assert abs(float((lp - lm) / (2 * eps)) - float(analytic[u])) < 2e-3


def test_learned_masks_keep_useful_channels_within_budget(digits_cfg):
    """In a trained model, half of the first hidden layer is made to feed nothing forward
    (zero outgoing weights): the data-chosen masks drop those channels; every layer keeps
    ceil(p * C) channels."""

    _, ops, full = _hetero(digits_cfg, "algorithm.budgets=[1.0]", "algorithm.local_steps=5")
    trained = run_rounds(full, ops, 40)
    _, ops, algo = _hetero(
        digits_cfg, "algorithm.budgets=[0.5]", "algorithm.decode_steps=20", "algorithm.mask_lr=0.1"
    )
    state = algo.init(ops)
    L1, L2 = state.layers
    w = trained.w.clone()
    W2 = w[L2.offset : L2.offset + L2.channels * L2.size].view(L2.channels, L2.size)
    W2[:, 8:] = 0.0  # channels 8..15 of layer 1 are dead weight
    state = replace(state, w=w)
    clients = torch.arange(ops.n_clients)
    A, B = algo._select(ops, state, clients, 0)
    # (at a trained model the first-order signal is ~0 at a = 1; the resource pressure
    # lowers every a until dropping a useful channel shows in the loss)
    assert float(B[:, :8].mean()) >= 0.8 and float(B[:, 8:16].mean()) <= 0.2
    assert float(A[:, :8].mean()) > float(A[:, 8:16].mean())
    assert B[:, :16].sum(dim=1).tolist() == [8.0] * ops.n_clients  # ceil(0.5 * 16)
    assert B[:, 16:].sum(dim=1).tolist() == [4.0] * ops.n_clients  # ceil(0.5 * 8)


def test_full_budget_is_plain_mean_fedavg_and_small_budgets_send_less(digits_cfg):
    """p = 1 for everyone: the sub-model is the whole model and the server's step is the
    plain mean of the updates (Top-K with K = d is the same)."""
    _, ops, hetero = _hetero(digits_cfg, "algorithm.budgets=[1.0]", "algorithm.local_steps=2")
    _, ops2, topk = build(
        digits_cfg(
            "algorithm.name=topk_ef",
            "algorithm.topk_fraction=1",
            "model.hidden=[16, 8]",
            "algorithm.local_steps=2",
        )
    )
    a = run_rounds(hetero, ops, 3)
    b = run_rounds(topk, ops2, 3)
    assert_close(a.w, b.x, atol=1e-5, rtol=1e-5)
    sent = {}
    for p in ("1.0", "0.25"):
        _, ops3, algo = _hetero(digits_cfg, f"algorithm.budgets=[{p}]")
        _, stats = algo.round(algo.init(ops3), 0, ops3)
        sent[p] = stats["bytes_sent"]
        assert stats["flops_share"] <= float(p) + 0.1
    assert sent["0.25"] < 0.5 * sent["1.0"]


@pytest.mark.parametrize("selection", ["learned", "fixed", "random"])
def test_heterogeneous_run_trains_on_both_engines(digits_cfg, selection):
    cfg = digits_cfg(
        "algorithm.name=fedsep_hetero",
        "model.hidden=[16]",
        f"algorithm.mask_selection={selection}",
        "algorithm.decode_steps=2",
    )
    (algo, ops, s_local), (_, _, s_loop) = on_engines(cfg, 6)
    assert_close(s_local.w, s_loop.w, atol=1e-4, rtol=1e-4)
    assert torch.equal(s_local.B, s_loop.B)
    # and it trains: the clients' sub-models predict better than at the start
    from raycobo.algorithms import evaluate

    before = evaluate(algo, algo.init(ops), ops).loss.mean()
    assert evaluate(algo, s_local, ops).loss.mean() < before


def test_heterogeneous_needs_hidden_layers(quad_cfg):
    _, ops, algo = build(quad_cfg("algorithm.name=fedsep_hetero"))
    with pytest.raises(ConfigError, match="hidden"):
        algo.init(ops)


# -- Count-Sketch (FetchSGD) baseline ---------------------------------------------------


def test_count_sketch_is_linear_and_recovers_heavy_coordinates():
    from raycobo.algorithms.countsketch import count_sketch, sketch_hashes, unsketch

    d, rows, cols = 500, 5, 100
    bucket, sign = sketch_hashes(d, rows, cols, seed=0)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, d, generator=g)
    sa, sb = count_sketch(torch.stack([a, b]), bucket, sign, cols)
    assert_close(count_sketch((a + b)[None], bucket, sign, cols)[0], sa + sb)
    v = 0.01 * torch.randn(d, generator=g)
    heavy = torch.tensor([3, 77, 401])
    v[heavy] = torch.tensor([5.0, -4.0, 3.0])
    est = unsketch(count_sketch(v[None], bucket, sign, cols)[0], bucket, sign)
    assert_close(est[heavy], v[heavy], atol=0.1, rtol=0)
    assert set(est.abs().topk(3).indices.tolist()) == set(heavy.tolist())


def test_count_sketch_training_lowers_the_loss_and_guards_its_size(digits_cfg):
    cfg = digits_cfg(
        "algorithm.name=countsketch",
        "algorithm.topk_fraction=0.02",
        "algorithm.sketch_cols=400",
        "algorithm.local_steps=3",
    )
    _, ops, algo = build(cfg)
    state = algo.init(ops)
    before = ops.evaluate(torch.arange(ops.n_clients), algo.eval_params(state)).loss.mean()
    state = run_rounds(algo, ops, 15, state)
    after = ops.evaluate(torch.arange(ops.n_clients), algo.eval_params(state)).loss.mean()
    assert after < before
    bad = digits_cfg(
        "algorithm.name=countsketch", "algorithm.topk_fraction=0.5", "algorithm.sketch_cols=100"
    )
    _, ops, algo = build(bad)
    with pytest.raises(ConfigError, match="topk_fraction"):
        algo.round(algo.init(ops), 0, ops)


def test_top_k_breaks_ties_toward_the_lower_index():
    """Equal magnitudes (common with integer-valued pixels) must select the same entries
    on every device: the lower indices."""
    from raycobo.algorithms.common import top_k

    V = torch.tensor([[1.0, -3.0, 3.0, 0.5, -3.0], [2.0, 2.0, 2.0, 2.0, 1.0]])
    assert torch.equal(top_k(V, 2), torch.tensor([[0.0, -3.0, 3.0, 0.0, 0.0], [2, 2, 0, 0, 0.0]]))


def test_top_k_ranks_magnitudes_a_few_ulps_apart_as_ties():
    """The H200 measurement (benchmarks/topk_cuda_diag.py): one client's update had 9
    magnitudes equal in exact arithmetic; CUDA computed all 9 as 0.0387636349, the CPU 4
    of them one rounding step higher (0.0387636386), and each device kept a different 2.
    Ranked as ties they select the same (lowest) indices on both."""
    from raycobo.algorithms.common import rank_key, top_k

    low, high = 0.0387636349, 0.0387636386
    assert torch.tensor(low) != torch.tensor(high)  # distinct float32 values
    group = [832, 840, 848, 856, 863, 864, 870, 872, 880]
    cuda = torch.zeros(1, 1210)
    cuda[0, :10] = torch.linspace(0.5, 0.1, 10)  # 10 clear winners
    cuda[0, group] = low
    cpu = cuda.clone()
    cpu[0, [856, 863, 870, 872]] = high  # the CPU's rounding: later entries one step up
    k = 12
    kept_cuda, kept_cpu = top_k(cuda, k) != 0, top_k(cpu, k) != 0
    assert torch.equal(kept_cuda, kept_cpu)
    assert kept_cuda[0].nonzero().flatten().tolist() == [*range(10), 832, 840]
    # the key keeps the order of magnitudes that differ beyond rounding
    m = torch.tensor([3.0, 1.0, 0.5, 0.25, 1e-3, 1e-30, 0.0])
    keys = rank_key(m)
    assert torch.all(keys[:-1] > keys[1:]) and keys[-1] == 0
    x = torch.rand(10_000)
    order = torch.argsort(x)
    assert torch.all(rank_key(x[order]).diff() >= 0)  # monotone
