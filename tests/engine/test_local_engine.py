"""The vectorized engine gives the same numbers as a plain per-client loop."""

from __future__ import annotations

import platform

import pytest
import torch
from torch.testing import assert_close

from raycobo import rng
from raycobo.algorithms import build_algorithm, evaluate
from raycobo.config import with_overrides
from raycobo.data import load_data
from raycobo.engine import make_local_ops
from tests.helpers import build, method_cases, on_engines, run_rounds, short_run


@pytest.fixture
def both_engines(digits_cfg):
    cfg = digits_cfg()
    data = load_data(cfg)
    vec = make_local_ops(cfg, data)
    loop = make_local_ops(with_overrides(cfg, {"engine.kind": "loop"}), data)
    return cfg, data, vec, loop


def test_gradients_match_per_client_autograd(both_engines):
    cfg, data, vec, loop = both_engines
    n = data.n_clients
    g = torch.Generator().manual_seed(0)
    clients = torch.tensor([0, 1, 2, 3, 1, 0])
    Z = vec.initial_params().expand(len(clients), -1) + 0.1 * torch.randn(
        len(clients), vec.dim, generator=g
    )
    salts = torch.arange(len(clients))
    Gv, Lv = vec.grads(clients, Z, 3, 1, salts)
    Gl, Ll = loop.grads(clients, Z, 3, 1, salts)
    assert_close(Gv, Gl, atol=1e-5, rtol=1e-4)
    assert_close(Lv, Ll, atol=1e-6, rtol=1e-5)
    assert_close(vec.losses(clients, Z, 3, 1, salts), Ll, atol=1e-6, rtol=1e-5)
    ev, el = vec.evaluate(torch.arange(n), Z[:n]), loop.evaluate(torch.arange(n), Z[:n])
    assert_close(ev.loss, el.loss, atol=1e-5, rtol=1e-5)
    assert_close(ev.accuracy, el.accuracy)


def test_chunking_does_not_change_results(digits_cfg):
    cfg = digits_cfg()
    data = load_data(cfg)
    big = make_local_ops(cfg, data)
    small = make_local_ops(with_overrides(cfg, {"engine.chunk_size": 3}), data)
    clients = torch.arange(4).repeat(2)
    Z = big.initial_params().expand(8, -1).clone()
    assert_close(big.grads(clients, Z, 0, 1)[0], small.grads(clients, Z, 0, 1)[0])
    assert_close(big.evaluate(clients, Z).loss, small.evaluate(clients, Z).loss)


def test_fresh_batches_differ_by_round_stream_and_salt(both_engines):
    _, _, vec, _ = both_engines
    c = torch.tensor([0])
    base = vec.batches.positions(c, 0, 1, 0)
    assert not torch.equal(base, vec.batches.positions(c, 1, 1, 0))
    assert not torch.equal(base, vec.batches.positions(c, 0, 2, 0))
    assert not torch.equal(base, vec.batches.positions(c, 0, 1, 5))
    assert torch.equal(base, vec.batches.positions(c, 0, 1, 0))


def test_alignment_uses_each_clients_own_data(both_engines):
    """The two gradients at z_ij come from client i's and client j's data respectively
    (the official CoBo code had a bug where both came from one client)."""
    _, data, vec, _ = both_engines
    from raycobo import rng

    pos_i = vec.batches.positions(torch.tensor([0]), 0, rng.ALIGN, torch.tensor([2]))
    pos_j = vec.batches.positions(torch.tensor([2]), 0, rng.ALIGN, torch.tensor([0]))
    rows_i = set(vec.batches.rows[pos_i].flatten().tolist())
    rows_j = set(vec.batches.rows[pos_j].flatten().tolist())
    assert rows_i <= set(data.train_idx[0].tolist())
    assert rows_j <= set(data.train_idx[2].tolist())


@pytest.mark.parametrize("name", method_cases())
def test_algorithms_agree_across_engines(digits_cfg, name):
    """Every registered algorithm (a new one is covered by registering it)."""
    cfg = with_overrides(digits_cfg(), short_run(name))
    results = []
    for algo, ops, state in on_engines(cfg, cfg.rounds):  # vectorized, then the loop
        W = algo.collaboration(state)
        results.append((algo.eval_params(state), W, evaluate(algo, state, ops).loss))
    (Xv, Wv, Lv), (Xl, Wl, Ll) = results
    assert_close(Xv, Xl, atol=1e-4, rtol=1e-3)
    assert_close(Lv, Ll, atol=1e-4, rtol=1e-3)
    if Wv is not None:
        assert_close(Wv, Wl, atol=1e-4, rtol=1e-3)


def test_conv_model_engines_agree():
    """The vmap path (cnn1d on mnist1d) gives the per-client loop's numbers."""
    from raycobo.config import load_config

    cfg = load_config(
        None,
        [
            "data.name=mnist1d",
            "data.num_samples=400",
            "model.name=cnn1d",
            "batch_size=8",
            "data.partition.num_clusters=2",
            "data.partition.clients_per_cluster=2",
            "algorithm.sampling=full",
            "tracking.enabled=false",
        ],
    )
    out = [(s.X, s.W) for _, _, s in on_engines(cfg, 3)]
    assert_close(out[0][0], out[1][0], atol=1e-5, rtol=1e-4)
    assert_close(out[0][1], out[1][1], atol=1e-5, rtol=1e-4)


def test_per_row_streams_draw_what_separate_calls_draw(both_engines):
    """Mixing request kinds in one call (CoBo's alignment + step) changes no sample."""
    _, _, vec, loop = both_engines
    c = torch.tensor([0, 1, 2, 3])
    streams = torch.tensor([2, 2, 1, 1])
    mixed = vec.batches.positions(c, 5, streams, 0)
    assert torch.equal(mixed[:2], vec.batches.positions(c[:2], 5, 2, 0))
    assert torch.equal(mixed[2:], vec.batches.positions(c[2:], 5, 1, 0))
    Z = vec.initial_params().expand(4, -1).clone()
    Gv, _ = vec.grads(c, Z, 5, streams, 0)
    Gl, _ = loop.grads(c, Z, 5, streams, 0)
    assert_close(Gv, Gl, atol=1e-5, rtol=1e-4)


def _cnn(digits_cfg, *extra):
    return digits_cfg("model.name=cnn", "algorithm.sampling=full", *extra)


def test_every_strategy_gives_the_same_numbers(digits_cfg):
    """vmap (all rows at once), chunked (a budget so small that every call holds one or
    two rows and a few test samples) and the per-client loop: the same CoBo rounds."""
    cfg = _cnn(digits_cfg)
    data = load_data(cfg)
    out = {}
    for strategy, extra in (
        ("vmap", {}),
        ("chunked", {"engine.memory_gb": 0.0005}),
        ("loop", {}),
    ):
        c = with_overrides(cfg, {"engine.strategy": strategy, **extra})
        ops = make_local_ops(c, data)
        assert ops.execution.strategy == strategy
        algo = build_algorithm(c.algorithm, 3, c.seed)
        state = run_rounds(algo, ops, 3)
        out[strategy] = (state.X, state.W, evaluate(algo, state, ops))
        if strategy == "chunked":
            assert ops.execution.rows_per_call <= 2 and ops.execution.eval_block < 20
    ref = out["vmap"]
    for name in ("chunked", "loop"):
        X, W, ev = out[name]
        assert_close(X, ref[0], atol=1e-5, rtol=1e-4, msg=name)
        assert_close(W, ref[1], atol=1e-5, rtol=1e-4, msg=name)
        assert_close(ev.loss, ref[2].loss, atol=1e-5, rtol=1e-5, msg=name)
        assert_close(ev.accuracy, ref[2].accuracy, msg=name)


def test_chunked_evaluation_equals_unchunked(digits_cfg):
    cfg = digits_cfg()
    data = load_data(cfg)
    whole = make_local_ops(with_overrides(cfg, {"engine.strategy": "vmap"}), data)
    tiny = make_local_ops(with_overrides(cfg, {"engine.memory_gb": 1e-5}), data)
    assert tiny.execution.eval_rows == 1 and tiny.execution.eval_block < 50
    n = data.n_clients
    Z = whole.initial_params() + 0.05 * torch.randn(n, whole.dim, generator=torch.Generator())
    a, b = whole.evaluate(torch.arange(n), Z), tiny.evaluate(torch.arange(n), Z)
    assert_close(a.loss, b.loss, atol=1e-6, rtol=1e-6)
    assert_close(a.accuracy, b.accuracy)
    W = torch.softmax(torch.randn(n, 2, generator=torch.Generator().manual_seed(1)), 1)
    Zm = torch.stack([Z, Z.flip(0)], 1)
    a, b = (
        whole.evaluate_mixture(torch.arange(n), Zm, W),
        tiny.evaluate_mixture(torch.arange(n), Zm, W),
    )
    assert_close(a.loss, b.loss, atol=1e-6, rtol=1e-6)


def test_auto_strategy_per_model_and_device(digits_cfg):
    from raycobo.engine.local import LoopOps, VectorizedOps

    data = load_data(_cnn(digits_cfg))
    conv = make_local_ops(_cnn(digits_cfg), data)
    assert isinstance(conv, LoopOps) and conv.execution.strategy == "loop"
    mlp = make_local_ops(digits_cfg(), data)
    assert isinstance(mlp, VectorizedOps) and mlp.execution.strategy == "chunked"
    from raycobo.config import ConfigError

    with pytest.raises(ConfigError, match="engine.strategy"):
        make_local_ops(digits_cfg("engine.kind=loop", "engine.strategy=vmap"), data)


def test_ten_thousand_clients_with_default_hyperparameters(tmp_path, quad_cfg):
    """rho: auto keeps the penalty step stable at any n (W^0 = 1 sums over n - 1)."""
    from raycobo.lifecycle.experiment import run_experiment

    cfg = quad_cfg(
        "data.partition.num_clusters=4",
        "data.partition.clients_per_cluster=2500",
        "rounds=12",
        "eval_every=6",
        "checkpoint.every=0",
    )
    res = run_experiment(cfg, tmp_path / "r")
    s = res.summary
    assert s["n_clients"] == 10_000 and s["status"] == "completed"
    losses = [h["mean_loss"] for h in s["history"]]
    assert all(v is not None for v in losses) and losses[-1] < losses[0]


def test_an_unstable_explicit_rho_is_refused(quad_cfg):
    from raycobo.config import ConfigError
    from raycobo.engine import open_session

    # n = 80; the summed pull of Algorithm 1 (rule paper) has the lr rho n < 2 bound
    cfg = quad_cfg(
        "data.partition.clients_per_cluster=20", "algorithm.preset=paper", "algorithm.rho=0.3"
    )
    session, _ = open_session(cfg)
    with pytest.raises(ConfigError, match=r"'algorithm.rho'.*algorithm.lr \* algorithm.rho \* n"):
        session.start()
    ok = with_overrides(cfg, {"algorithm.rho": "auto"})
    session, _ = open_session(ok)
    assert session.algorithm.pull.rho_for(80) == pytest.approx(0.4 / (0.1 * 80))
    # the default rule's mean pull: lr rho is the share of the way to the collaborators'
    # mean, refused at >= 1 whatever n
    mean = quad_cfg("data.partition.clients_per_cluster=20", "algorithm.rho=10")
    session, _ = open_session(mean)
    with pytest.raises(ConfigError, match=r"'algorithm.rho'.*>= 1 overshoots"):
        session.start()
    session, _ = open_session(with_overrides(mean, {"algorithm.rho": "auto"}))
    assert session.algorithm.pull.rho_for(80) == pytest.approx(0.5 / 0.1)  # pull_strength 0.5


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_bf16_autocast_stays_close_to_fp32_and_keeps_fp32_state(digits_cfg, model):
    """engine.precision=bf16: the passes in bfloat16 (CPU autocast here), the models,
    W and gradients in float32; the numbers stay near fp32's (a short run)."""
    from raycobo.engine import LocalSession

    out = {}
    for precision in ("fp32", "bf16"):
        cfg = digits_cfg(f"model.name={model}", f"engine.precision={precision}", "rounds=4")
        _, ops, algo = build(cfg)
        assert ops.execution.precision == precision
        session = LocalSession(algo, ops)
        session.start()
        for t in range(4):
            session.round(t)
        out[precision] = (session.models(), session.evaluate().loss)
    X32, L32 = out["fp32"]
    X16, L16 = out["bf16"]
    assert X16.dtype == torch.float32 and L16.dtype == torch.float32
    assert not torch.equal(X16, X32)  # bf16 really ran
    torch.testing.assert_close(X16, X32, atol=2e-2, rtol=5e-2)
    torch.testing.assert_close(L16, L32, atol=5e-2, rtol=5e-2)


def test_channels_last_on_the_loop_gives_the_loops_numbers(digits_cfg):
    """NHWC weights and inputs on the per-client loop compute the same functions."""
    states = []
    for layout in ("false", "true"):
        cfg = digits_cfg("model.name=cnn", "engine.kind=loop", f"engine.channels_last={layout}")
        _, ops, algo = build(cfg)
        states.append(run_rounds(algo, ops, 3))
    torch.testing.assert_close(states[0].X, states[1].X, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["engine.precision=tf32"], "tf32 is a CUDA format"),
        (["engine.channels_last=true"], "the model has no convolution"),
        (
            ["model.name=cnn", "engine.strategy=chunked", "engine.channels_last=true"],
            "per-client loop",
        ),
        (["data.name=quadratic", "engine.precision=bf16"], "not to data.name=quadratic"),
    ],
)
def test_precision_and_layout_settings_that_would_do_nothing_are_refused(
    digits_cfg, overrides, needle
):
    from raycobo.config import ConfigError

    cfg = digits_cfg(*overrides)
    with pytest.raises(ConfigError, match=needle):
        build(cfg)


def test_engine_threads_hold_for_the_run_and_are_given_back(quad_cfg):
    """engine.threads was read by Ray hosts only: a local run with threads 1 used ~1.75
    cores. The local session takes torch's intra-op pool for the run and restores it."""
    import torch

    from raycobo.engine import open_session

    before = torch.get_num_threads()
    session, _ = open_session(quad_cfg("engine.threads=1", "algorithm.name=cobo"))
    session.start()
    assert torch.get_num_threads() == 1
    session.round(0)
    session.close()
    assert torch.get_num_threads() == before


def test_a_state_that_cannot_fit_is_refused_before_anything_is_allocated(monkeypatch, quad_cfg):
    """(#39 item 12) 10^6 clients with a dense W asked for 4 TB at run time: refused with
    the figure and the setting that fits; the sparse W (auto at that size) fits."""
    from raycobo.algorithms.cobo import CoBo, CoBoConfig
    from raycobo.config import ConfigError
    from raycobo.engine import memory

    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"a dense W \(algorithm.weights=sparse\): 7,450\.6 GiB"):
        memory.check_fits(CoBo(CoBoConfig(weights="dense"), 10, 0), 10**6, 10, cpu)
    memory.check_fits(CoBo(CoBoConfig(), 10, 0), 10**6, 10, cpu)  # auto: sparse, 0.1 GiB
    from raycobo.engine import LocalSession

    _, ops, algo = build(quad_cfg("rounds=1"))
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    with pytest.raises(ConfigError, match="more than the 0.0 GiB available"):
        LocalSession(algo, ops).start()


def test_engines_and_ops_are_chosen_by_registry():
    """engine.kind names a registered engine (its spec opens the session: nothing else
    lists the kinds), and every data set declares the ClientOps that train it (no
    isinstance on data classes, no string branches on the kind)."""
    from raycobo.config import ConfigError
    from raycobo.data.base import FederatedData
    from raycobo.data.quadratic import QuadraticProblem
    from raycobo.data.text import TextData
    from raycobo.engine import ENGINES, OPS, local_session
    from raycobo.engine.ray import ray_session
    from raycobo.registry import engine, import_object

    assert list(ENGINES.builtin) == ["local", "loop", "ray"]
    opened = [import_object(engine(k).session, "engine.kind") for k in ENGINES.builtin]
    assert opened == [local_session, local_session, ray_session]
    with pytest.raises(ConfigError, match=r"'engine.kind'.*unknown engine 'rya'.*local, loop"):
        engine("rya")
    assert {FederatedData.ops, QuadraticProblem.ops, TextData.ops} == set(OPS)


def _freed_memory_kept(env: dict[str, str]) -> str:
    """keep_freed_memory()'s answer in a fresh process with ``env`` added."""
    import os
    import subprocess
    import sys

    code = "from raycobo.engine.memory import keep_freed_memory as k; print(k())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_freed_memory_is_kept_unless_the_user_set_the_thresholds():
    assert _freed_memory_kept({}) == "True"
    assert _freed_memory_kept({"MALLOC_TRIM_THRESHOLD_": "1000000"}) == "False"
    assert _freed_memory_kept({"MALLOC_MMAP_MAX_": "65536"}) == "False"
    assert _freed_memory_kept({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}) == "False"
    # a malloc setting it does not touch leaves it free to set its own
    assert _freed_memory_kept({"MALLOC_ARENA_MAX": "2"}) == "True"


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.alignment_batches=1", "algorithm.alignment=inner"],
        ["algorithm.preset=paper", "algorithm.sampling=full"],
    ],
)
def test_shared_points_give_the_copied_points_numbers(digits_cfg, overrides):
    """CoBo on the local engine's MLP asks for each midpoint once (SharedPoints: its 2k
    requests as one GEMM); with one minibatch an end the state after the rounds is the
    one of the same rounds with every request row its own copy of its point, bit for
    bit, and the shared request's rows equal the materialized request's."""
    from raycobo.algorithms.pairs import SharedPoints
    from tests.helpers import assert_trees_equal

    cfg = digits_cfg("algorithm.name=cobo", "rounds=8", *overrides)
    data, ops, algo = build(cfg)
    assert ops.shares_points
    shared = run_rounds(algo, ops, 8)
    ops.shares_points = False  # the copied rows
    copied = run_rounds(algo, ops, 8)
    assert_trees_equal(shared.__dict__, copied.__dict__)
    ops.shares_points = True
    mid, X = shared.X[:3], shared.X
    points = SharedPoints(((mid, 4), (X, 1)))
    clients = torch.cat([torch.arange(3).repeat_interleave(4), torch.arange(X.shape[0])])
    G1, L1 = ops.grads(clients, points, 3, rng.ALIGN, 5)
    G2, L2 = ops.grads(clients, points.materialize(), 3, rng.ALIGN, 5)
    assert torch.equal(G1, G2) and torch.equal(L1, L2)
    with pytest.raises(ValueError, match="request rows"):
        ops.grads(clients[:-1], points, 3, rng.ALIGN, 5)


def test_an_ends_minibatches_as_one_gradient_give_their_mean(digits_cfg):
    """With the defaults (2 minibatches an end) the local engine's MLP answers each pair
    end as one gradient of both minibatches' samples: the mean of the two minibatch
    gradients to float rounding, the same rows' losses, and each pair's score that of
    the plain rows (every row its own point, each end's minibatches averaged after)."""
    from raycobo.algorithms.pairs import PairScores, SharedPoints, answer, mean_of_runs

    cfg = digits_cfg("algorithm.name=cobo", "rounds=4")
    data, ops, algo = build(cfg)
    assert ops.shares_points and algo.batches == 2
    X = run_rounds(algo, ops, 4).X
    points = SharedPoints(((X[:3], 4),), means=2)
    clients = torch.arange(3).repeat_interleave(4)
    G1, L1 = ops.grads(clients, points, 3, rng.ALIGN, torch.arange(12))
    G2, L2 = ops.grads(clients, points.materialize(), 3, rng.ALIGN, torch.arange(12))
    assert G1.shape == (6, X.shape[1]) and torch.equal(L1, L2)
    assert_close(G1, mean_of_runs(G2, 2), atol=1e-7, rtol=1e-5)
    n = X.shape[0]
    i, j = torch.triu_indices(n, n, 1)
    req = PairScores(torch.stack([i, j], 1), X, 2, "bounded", 0.3)
    fused, _ = answer(ops, req, 5)
    ops.shares_points = False
    plain, _ = answer(ops, req, 5)
    assert not torch.equal(fused, plain)  # float rounding apart: a different sum
    assert_close(fused, plain, atol=1e-6, rtol=1e-5)


GRAMS = ["batch_size=4", "model.hidden=[32]", "algorithm.name=cobo"]  # S = 8: they pay


def test_pair_scores_from_the_ends_inner_products(digits_cfg, monkeypatch):
    """Where the MLP's per-sample factors are the cheaper way (small minibatches here)
    the local engine answers pair scores from the ends' inner products, without writing
    a gradient: each built-in score that of the written gradients, to float rounding; a
    score registered by a plugin is read from the gradients; and CoBo's run agrees with
    the per-client loop's."""
    from raycobo.algorithms import pairs
    from raycobo.algorithms.pairs import PairScores, answer

    data, ops, algo = build(digits_cfg(*GRAMS, "rounds=3"))
    assert ops.scores_by_grams(2) and not ops.scores_by_grams(64)
    assert not ops.scores_by_grams(1)  # one minibatch an end: the plain rows' bits
    X = run_rounds(algo, ops, 3).X
    n = X.shape[0]
    i, j = torch.triu_indices(n, n, 1)
    for score in ("inner", "cosine", "bounded"):
        req = PairScores(torch.stack([i, j], 1), X, 2, score, 0.3)
        grams, _ = answer(ops, req, 5)
        with monkeypatch.context() as m:
            m.setattr(ops, "scores_by_grams", lambda k: False)
            written, _ = answer(ops, req, 5)
        assert_close(grams, written, atol=1e-6, rtol=1e-5)
    monkeypatch.setitem(pairs.SCORES, "mine", pairs.SCORES["inner"])
    monkeypatch.setattr(ops, "pair_grams", None)  # would fail if asked
    answer(ops, PairScores(torch.stack([i, j], 1), X, 2, "mine"), 5)
    cfg = digits_cfg(*GRAMS, "algorithm.sampling=full")
    (Xv, Wv), (Xl, Wl) = [(s.X, s.W) for _, _, s in on_engines(cfg, 3)]
    assert_close(Xv, Xl, atol=1e-5, rtol=1e-4)
    assert_close(Wv, Wl, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_pair_grams_asked_in_parts_give_the_one_requests_numbers(digits_cfg, threads):
    """The ends' inner products of a round asked a few pairs at a time, or a few points a
    call: the state after the rounds is the one of a single request, bit for bit."""
    from tests.helpers import assert_trees_equal

    cfg = digits_cfg(*GRAMS, "algorithm.sampling=full", "data.partition.clients_per_cluster=4")
    data, ops, algo = build(cfg)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = run_rounds(algo, ops, 4)
        ops.request_rows = ops.chunk_size = 4 * 3 + 1  # parts of 3 pairs, calls of 3 points
        ops.shared_part_rows = None
        parted = run_rounds(algo, ops, 4)
    finally:
        torch.set_num_threads(before)
    assert_trees_equal(whole.__dict__, parted.__dict__)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("overrides", "per"),
    [
        ([], 2),  # the defaults: 2 minibatches per alignment gradient
        (  # 36 pairs a round in parts of 5, the last of 6; d = 38,410, past the
            # size where torch's reductions start to use both threads
            [
                "model.hidden=[512]",
                "algorithm.alignment_batches=1",
                "algorithm.sampling=full",
                "data.partition.num_clusters=3",
                "data.partition.clients_per_cluster=3",
            ],
            5,
        ),
    ],
)
def test_a_round_asked_in_parts_gives_the_one_requests_numbers(digits_cfg, overrides, per, threads):
    """Where a round's request exceeds the ops' ``request_rows``, CoBo asks its alignment
    gradients a few pairs at a time and reduces each part to scores: the state after
    the rounds is the one of a single request per round, bit for bit, on one thread and
    on two (where a reduction over one row alone would split between the threads)."""
    from raycobo.algorithms.cobo import pair_parts
    from tests.helpers import assert_trees_equal

    assert pair_parts(7, 3) == [(0, 3), (3, 7)] and pair_parts(1, 5) == [(0, 1)]
    assert pair_parts(0, 4) == [] and pair_parts(6, 1) == [(0, 2), (2, 4), (4, 6)]
    cfg = digits_cfg("algorithm.name=cobo", "rounds=6", *overrides)
    data, ops, algo = build(cfg)
    ops.scores_by_grams = lambda k: False  # the gradients' parts (the grams': above)
    calls, grads = [], ops.grads
    ops.grads = lambda *a, **kw: calls.append(a[0].numel()) or grads(*a, **kw)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = run_rounds(algo, ops, 6)
        one = len(calls)  # a request a round (and the start's)
        k = algo.cfg.alignment_batches
        ops.request_rows = 2 * k * per + 1  # parts of ``per`` pairs
        parted = run_rounds(algo, ops, 6)
    finally:
        torch.set_num_threads(before)
    assert len(calls) - one > one + 6
    assert max(calls[one:]) <= max(2 * k * (per + 1), data.n_clients)
    assert_trees_equal(whole.__dict__, parted.__dict__)
