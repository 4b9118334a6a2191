"""Small helpers shared by the tests."""

from __future__ import annotations

from pathlib import Path

import torch

# Settings under which every registered algorithm shows its whole round in a few rounds
# of a tiny task (fine-tuning, pruning and trust updates happen; sketches fit the MLP).
# the small digits task of most engine and algorithm tests (the digits_cfg fixture)
DIGITS = [
    "data.name=digits",
    "data.fraction=0.3",
    "data.test_fraction=0.3",
    "data.partition.num_clusters=2",
    "data.partition.clients_per_cluster=2",
    "model.hidden=[16]",
    "batch_size=8",
    "rounds=6",
    "eval_every=3",
    "tracking.enabled=false",
]

# per method, overrides that make it do its characteristic work within 4 rounds on DIGITS
CHARACTERISTIC = {
    "fedsep": ["algorithm.sketch_dim=200", "algorithm.decode_steps=20"],
    "countsketch": ["algorithm.sketch_cols=200"],
    "fedsep_hetero": ["model.hidden=[16,8]"],
    "validation_based": ["algorithm.trust_every=2"],
    "fedavg_ft": ["algorithm.ft_steps=2"],
    "l2c": ["algorithm.prune_round=1"],
    "meta_l2c": ["algorithm.prune_round=1"],
    "apple": ["algorithm.mu_rounds=1.0"],  # mu's decay spans the few rounds run
}

# settings that make each algorithm do its characteristic work within a few rounds
SHORT_SETTINGS = {
    "ft_steps": 2,
    "prune_round": 1,
    "trust_every": 2,
    "sketch_dim": 100,
    "sampling": "full",
}


def only_own(name: str, *overrides: str) -> list[str]:
    """The ``key=value`` overrides that apply to method ``name`` (other methods'
    ``algorithm.*`` keys left out)."""
    from raycobo.algorithms import method_keys

    keys = set(method_keys(name))
    own = []
    for item in overrides:
        key = item.partition("=")[0]
        if not key.startswith("algorithm.") or key.removeprefix("algorithm.") in keys:
            own.append(item)
    return own


# a method's offered modes that take another path through its round: each is a case of
# the per-method engine, Ray and resume tests beside the method's defaults
MODES = {"apple:downloads": ("apple", {"algorithm.downloads": 1})}


def method_cases() -> list[str]:
    """Every registered method (a new one is covered by registering it), then MODES."""
    from raycobo.algorithms import ALGORITHMS

    return [*sorted(ALGORITHMS), *MODES]


def short_run(name: str, skip: tuple[str, ...] = ()) -> dict:
    """``algorithm.name`` and those of SHORT_SETTINGS that the method has; for a case of
    MODES, its method with the mode's settings."""
    from raycobo.algorithms import method_keys

    name, mode = MODES.get(name, (name, {}))
    keys = set(method_keys(name)) - set(skip)
    short = {f"algorithm.{k}": v for k, v in SHORT_SETTINGS.items() if k in keys}
    return {"algorithm.name": name, **short, **mode}


def at_rates(algo, recheck: float | None = None, closure: float | None = None):
    """CoBo ``algo`` with its proposals' parts at other rates (the Python API: the
    settings give them the pull threshold's, settings.RECHECK and settings.CLOSURE)."""
    from dataclasses import replace

    p = algo.proposals
    if recheck is not None:
        p = replace(p, rechecks=replace(p.rechecks, rate=recheck))
    if closure is not None:
        p = replace(p, closure=replace(p.closure, rate=closure))
    algo.proposals = p
    return algo


def run_rounds(algo, ops, rounds: int, state=None, start: int = 0):
    """Advance ``algo`` from ``state`` (or its initial state) for ``rounds`` rounds."""
    state = algo.init(ops) if state is None else state
    for t in range(start, start + rounds):
        state, _ = algo.round(state, t, ops)
    return state


def build(cfg, data=None, rounds: int | None = None):
    """(data, ops, algo) for a config on its own engine kind."""
    from raycobo.algorithms import build_algorithm
    from raycobo.data import load_data
    from raycobo.engine import make_local_ops

    data = load_data(cfg) if data is None else data
    ops = make_local_ops(cfg, data)
    return data, ops, build_algorithm(cfg.algorithm, rounds or cfg.rounds, cfg.seed)


def trained_losses(cfg, rounds: int):
    """A config's method run ``rounds`` rounds on its own engine kind.
    -> (ops, the state, every client's test loss (n,))"""
    _, ops, algo = build(cfg)
    state = run_rounds(algo, ops, rounds)
    return ops, state, ops.evaluate(torch.arange(ops.n_clients), algo.eval_params(state)).loss


def on_engines(cfg, rounds: int, kinds=("local", "loop")):
    """Run ``cfg`` for ``rounds`` on each engine kind over the same data.

    Returns [(algo, ops, state)] in the order of ``kinds``."""
    from raycobo.config import with_overrides
    from raycobo.data import load_data

    data = load_data(cfg)
    out = []
    for kind in kinds:
        _, ops, algo = build(with_overrides(cfg, {"engine.kind": kind}), data, rounds)
        out.append((algo, ops, run_rounds(algo, ops, rounds)))
    return out


def run_local(cfg, rounds: int):
    """(X, W, evaluation loss) after ``rounds`` rounds on the config's local engine."""
    from raycobo.engine import LocalSession

    _, ops, algo = build(cfg)
    session = LocalSession(algo, ops)
    session.start()
    for t in range(rounds):
        session.round(t)
    return session.models(), session.collaboration(), session.evaluate().loss


def run_ray(cfg, rounds: int, between=None, hosts_load: bool = False):
    """The same on the Ray engine (Ray already started): ((X, W, loss), engine report).
    ``between(session, t)`` is called before each round (to kill hosts, join clients).
    The hosts get their data from the driver through the object store, as in a run, or
    with ``hosts_load`` load it themselves from the config."""
    from raycobo.data import load_data
    from raycobo.engine.ray import RaySession

    data = load_data(cfg)
    session = RaySession(cfg, data.n_clients, None if hosts_load else data)
    try:
        session.start()
        for t in range(rounds):
            if between is not None:
                between(session, t)
            session.round(t)
        out = (session.models(), session.collaboration(), session.evaluate().loss)
        return out, session.report()["engine_report"]
    finally:
        session.close()


def ray_matches_local(
    cfg, rounds: int, atol: float = 1e-5, rtol: float = 1e-4, between=None, hosts_load=False
):
    """Run ``cfg`` on the local engine (on the CPU) and on Ray for ``rounds`` rounds and
    assert the same models, W and evaluation losses. -> (local (X, W, loss), Ray report)"""
    from torch.testing import assert_close

    from raycobo.config import with_overrides

    local = run_local(with_overrides(cfg, {"engine.device": "cpu"}), rounds)
    remote, report = run_ray(cfg, rounds, between, hosts_load)
    for name, r, ref in zip(("models", "W", "losses"), remote, local, strict=True):
        if ref is None:
            assert r is None, name
            continue
        assert_close(r.cpu(), ref, atol=atol, rtol=rtol, msg=lambda m, n=name: f"{n}: {m}")
    return local, report


class StopAt:
    """A run callback that raises ``exc`` at the end of round ``at`` (a crash or a
    Ctrl-C mid-run)."""

    def __init__(self, at: int, exc: BaseException):
        self.at, self.exc = at, exc

    def on_run_start(self, ctx):
        pass

    def on_round_end(self, ctx, round, stats):
        if round == self.at:
            raise self.exc

    def on_eval(self, ctx, round, metrics):
        pass

    def on_run_end(self, ctx, summary):
        pass


def final_state(run_dir: Path) -> dict:
    """The algorithm state in a run directory's latest checkpoint (plain data)."""
    from raycobo.lifecycle import checkpoint as ckpt

    found = ckpt.latest_checkpoint(run_dir / "checkpoints")
    assert found is not None
    return ckpt.read_checkpoint(found[1])["algo_state"]


def assert_trees_equal(a, b, where="state"):
    """Two state trees (``raycobo.state``) equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), f"{where}: max diff {(a.double() - b.double()).abs().max()}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_trees_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_trees_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a} != {b}"
