"""A round as plan -> compute -> apply (``PlansRounds``), and the bounded-staleness
schedule that applies a plan's ``ahead`` results late, run in-process: the Ray
engine's ``StaleRounds`` over the local engine's ops, with results that arrive when a
test says so."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from raycobo.algorithms.base import (
    Gradients,
    LocalSGD,
    PlansRounds,
    compute,
    run_plan,
    sgd_steps,
)
from raycobo.algorithms.fedavg import fedavg_update
from raycobo.algorithms.pairs import PairScores
from raycobo.engine.ray.policies import RoundTiming, StaleRounds, plan_from_tree
from tests.helpers import build

REPO = Path(__file__).resolve().parents[2]

PLANNERS = {  # the built-ins that plan their rounds, and the FedProx example plugin
    "cobo": ["algorithm.sampling=full"],
    # W's fade acts every round, also in the rounds that sample no pair (p = 1/4 of 6)
    "cobo-fade": ["algorithm.sampling=constant", "algorithm.sampling_c=1"],
    "fedavg-1": ["algorithm.name=fedavg"],
    "fedavg-3": ["algorithm.name=fedavg", "algorithm.local_steps=3", "algorithm.client_rate=0.5"],
    "fedavg-ft": ["algorithm.name=fedavg_ft", "algorithm.ft_steps=2", "algorithm.local_steps=2"],
    "ditto": ["algorithm.name=ditto", "algorithm.local_steps=2", "algorithm.client_rate=0.5"],
    "fedprox": ["algorithm.name=fp_plan:FedProx", "algorithm.mu=0.1", "algorithm.local_steps=3"],
    "oracle": ["algorithm.name=oracle", "algorithm.local_steps=2", "algorithm.client_rate=0.5"],
}


@pytest.fixture
def planner(digits_cfg, tmp_path):
    """A config per planning method (the FedProx example copied onto a plugin path)."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    shutil.copy(REPO / "examples" / "plugins" / "fedprox.py", folder / "fp_plan.py")

    def make(key: str, *extra: str):
        return digits_cfg(f"plugin_paths=[{folder}]", *PLANNERS[key], *extra)

    yield make
    sys.modules.pop("fp_plan", None)


class Delayed:
    """A request in flight whose answer is ready after ``polls`` calls of ``ready``."""

    def __init__(self, answer, polls: int):
        self.answer, self.polls = answer, polls

    def ready(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def result(self):
        return self.answer


class LateOps:
    """The local engine's ops with ``submit`` (what StaleRounds calls): the answer is
    computed at once and handed over ``delay`` rounds later (one readiness poll a
    round)."""

    def __init__(self, ops, delay: int):
        self.ops, self.delay, self.submitted = ops, delay, []

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def submit(self, request, t):
        self.submitted.append(t)
        return Delayed(compute(self.ops, request, t), self.delay)


def stale_run(cfg, rounds: int, staleness: int, delay: int):
    _, ops, algo = build(cfg, rounds=rounds)
    policy = StaleRounds(algo, LateOps(ops, delay), RoundTiming(), staleness, rounds)
    policy.start()
    stats = [policy.round(t) for t in range(rounds)]
    return policy, stats


@pytest.mark.parametrize("key", sorted(PLANNERS))
def test_a_planned_round_is_the_methods_own_round(planner, key):
    """run_plan (plan, compute, apply) gives the method's ``round`` numbers exactly:
    CoBo's one-call round, FedAvg with one step (gradients) and with local SGD, the
    Oracle (FedAvg per cluster) and the plugin."""
    cfg = planner(key)
    _, ops, algo = build(cfg)
    assert isinstance(algo, PlansRounds) and algo.plan_refusal() is None
    a = b = algo.init(ops)
    for t in range(cfg.rounds):
        a, sa = algo.round(a, t, ops)
        b, sb = run_plan(algo, b, t, ops)
        assert {k: sb[k] for k in sa} == sa
    assert torch.equal(algo.eval_params(a), algo.eval_params(b))
    if getattr(a, "W", None) is not None:
        assert torch.equal(a.W, b.W)


@pytest.mark.parametrize("key", sorted(PLANNERS))
def test_staleness_zero_is_the_synchronous_round(planner, key):
    """Results that arrive late but are waited for (staleness 0): the synchronous
    numbers, bit for bit."""
    cfg = planner(key)
    policy, _ = stale_run(cfg, cfg.rounds, staleness=0, delay=3)
    _, ops, algo = build(cfg)
    state = algo.init(ops)
    for t in range(cfg.rounds):
        state, _ = algo.round(state, t, ops)
    assert torch.equal(policy.models(), algo.eval_params(state))
    if getattr(state, "W", None) is not None:
        assert torch.equal(policy.state.W, state.W)
    assert policy.report()["ahead_lag_max"] == 0


@pytest.mark.parametrize("key", ["cobo", "ditto", "fedavg-3", "fedprox", "oracle"])
def test_late_results_are_applied_once_within_the_bound(planner, key):
    """Every answer two rounds late, staleness 2: each round applies the plan of two
    rounds before (none in the first two), the last round applies what is left; every
    plan is applied exactly once and the models stay finite and differ from the
    synchronous ones."""
    cfg = planner(key, "rounds=7")
    policy, stats = stale_run(cfg, 7, staleness=2, delay=2)
    applied = [s["ahead_applied"] for s in stats]
    assert applied == [0, 0, 1, 1, 1, 1, 3]
    assert [s["ahead_pending"] for s in stats] == [1, 2, 2, 2, 2, 2, 0]
    assert policy.report() == {"ahead_lag_max": 2, "ahead_lag_mean": pytest.approx(11 / 7)}
    assert torch.isfinite(policy.models()).all()
    sync, _ = stale_run(cfg, 7, staleness=0, delay=0)
    assert not torch.equal(policy.models(), sync.models())
    if key not in ("cobo", "ditto"):  # averaging methods: the losses of what they applied
        assert "train_loss" not in stats[0] and "train_loss" in stats[2]
    if key == "ditto":  # the personal steps' own losses, every round
        assert all("train_loss" in s for s in stats)


def test_fedavg_ft_applies_every_late_update_before_it_fine_tunes(planner):
    """FedAvg-FT's last FedAvg round drains (Plan.drain): every update still in flight is
    applied there, so the fine-tuning rounds start from the global model of all of them
    and apply none late; with staleness 0 it is the synchronous run (above)."""
    cfg = planner("fedavg-ft", "rounds=7", "algorithm.ft_steps=3")  # FedAvg rounds 0-3
    policy, stats = stale_run(cfg, 7, staleness=2, delay=2)
    assert [s["ahead_applied"] for s in stats] == [0, 0, 1, 3, 0, 0, 0]
    assert [s["ahead_pending"] for s in stats] == [1, 2, 2, 0, 0, 0, 0]
    assert policy.report()["ahead_lag_max"] == 2
    assert all("train_loss" in s for s in stats[4:])  # the fine-tuning's own losses
    models = policy.models()
    assert torch.isfinite(models).all() and not torch.equal(models[0], models[1])


def test_a_late_update_moves_the_model_by_what_it_learned():
    """FedAvg's late local SGD: x + (average end point - the x it started from); a fresh
    one: the average end point; late gradients: asynchronous SGD, x - lr avg(g)."""
    x = torch.tensor([1.0, 2.0])
    old = torch.tensor([0.0, 0.0])
    Y = torch.tensor([[1.0, 1.0], [3.0, -1.0]])
    sizes = torch.tensor([1.0, 3.0])
    req = LocalSGD(torch.tensor([0, 1]), old.expand(2, -1), 0.1, 3, 1)
    assert torch.allclose(fedavg_update(x, req, Y, sizes, 0.1, True), torch.tensor([2.5, -0.5]))
    assert torch.allclose(fedavg_update(x, req, Y, sizes, 0.1, False), torch.tensor([3.5, 1.5]))
    grads = Gradients(torch.tensor([0, 1]), old.expand(2, -1), 1)
    assert torch.allclose(
        fedavg_update(x, grads, Y, sizes, 0.1, False), x - 0.1 * Y[1] * 0.75 - 0.1 * Y[0] * 0.25
    )


def test_local_sgd_with_a_proximal_term(quad_cfg):
    """sgd_steps: y <- y - lr (g + prox (y - anchor)), the anchor the start unless given;
    the first step's losses."""
    _, ops, _ = build(quad_cfg())
    clients = torch.arange(ops.n_clients)
    start = torch.randn(ops.n_clients, ops.dim)
    Y, L = sgd_steps(ops, LocalSGD(clients, start, 0.1, 2, 1, prox=0.5), 0)
    y = start.clone()
    first = None
    for s in range(2):
        G, loss = ops.grads(clients, y, 0, 1, s)
        y = y - 0.1 * (G + 0.5 * (y - start))
        first = loss if first is None else first
    assert torch.allclose(Y, y) and torch.equal(L, first)
    anchor = torch.zeros(ops.dim)
    Ya, _ = sgd_steps(ops, LocalSGD(clients, start, 0.1, 1, 1, prox=0.5, anchor=anchor), 0)
    G, _ = ops.grads(clients, start, 0, 1, 0)
    assert torch.allclose(Ya, start - 0.1 * (G + 0.5 * start))


def test_a_plan_in_flight_survives_a_checkpoint(planner):
    """A pending plan as plain data (what a stale run's checkpoint holds) comes back as
    the same request (FedAvg's local steps, CoBo's pair scores)."""
    cfg = planner("fedavg-3")
    _, ops, algo = build(cfg)
    plan = algo.plan_round(algo.init(ops), 0, ops)
    policy = StaleRounds(algo, LateOps(ops, 5), RoundTiming(), 3, 6)
    policy.start()
    policy.round(0)
    (saved,) = policy.snapshot()["pending"]
    back = plan_from_tree(saved)
    assert back.round == 0 and isinstance(back.ahead, LocalSGD)
    assert torch.equal(back.ahead.start, plan.ahead.start) and back.ahead.steps == 3
    assert torch.equal(back.keep["sizes"], plan.keep["sizes"])
    # CoBo's plan sends its pairs' scores ahead: a PairScores request, as plain data
    _, c_ops, cobo = build(planner("cobo"))
    policy = StaleRounds(cobo, LateOps(c_ops, 5), RoundTiming(), 3, 6)
    policy.start()
    policy.round(0)
    (saved,) = policy.snapshot()["pending"]
    back = plan_from_tree(saved)
    assert isinstance(back.ahead, PairScores) and back.ahead.score == "bounded"
    assert back.ahead.batches == 2 and torch.equal(back.ahead.pairs, back.keep["edges"])
    x0 = c_ops.initial_params().expand_as(back.ahead.models)  # round 0's models: x^0
    assert torch.equal(back.ahead.models, x0) and not torch.equal(policy.state.X, x0)


@pytest.mark.parametrize("key", ["cobo", "fedavg-3"])
def test_a_stale_run_resumes_with_its_plans_in_flight(planner, key):
    """Checkpointed after round 2 with two plans in flight, restored into a new policy
    (the plans sent again) and continued: the numbers of the run never interrupted
    (results held back past the bound, so each is applied exactly 2 rounds late)."""
    cfg = planner(key, "rounds=6")
    whole, _ = stale_run(cfg, 6, staleness=2, delay=9)
    _, ops, algo = build(cfg, rounds=6)
    first = StaleRounds(algo, LateOps(ops, 9), RoundTiming(), 2, 6)
    first.start()
    for t in range(3):
        first.round(t)
    tree = first.snapshot()
    assert len(tree["pending"]) == 2 and "now" not in tree["pending"][0]
    again = StaleRounds(algo, LateOps(ops, 9), RoundTiming(), 2, 6)
    again.restore(tree)
    for t in range(3, 6):
        again.round(t)
    assert torch.equal(again.models(), whole.models())
