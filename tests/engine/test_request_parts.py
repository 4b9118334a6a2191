"""Pair scores in parts of the rows an ops holds at once (``engine.memory``'s
``request_rows``): the loop's parts give the numbers of one request bit for bit, and a
round's peak memory follows ``engine.memory_gb`` whatever its pairs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch

from raycobo.algorithms import build_algorithm
from raycobo.data import load_data
from raycobo.engine import make_local_ops
from raycobo.engine.memory import LOOP_PART_ROWS
from tests.helpers import run_rounds


class Asked:
    """``ops`` with the rows of each ``grads`` call recorded."""

    def __init__(self, ops):
        self.ops, self.rows = ops, []

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def grads(self, clients, Z, *args):
        self.rows.append(clients.numel())
        return self.ops.grads(clients, Z, *args)


def test_the_loops_parts_give_one_requests_numbers(digits_cfg):
    """A conv net on the per-client loop with every pair sampled (4 clusters of 3: 66
    pairs, 264 alignment rows a round): asked in parts of LOOP_PART_ROWS rows, the same
    models and W bit for bit as in one request per round, and no call over the part."""
    cfg = digits_cfg(
        "model.name=cnn",
        "algorithm.sampling=full",
        "data.partition.num_clusters=4",
        "data.partition.clients_per_cluster=3",
    )
    data = load_data(cfg)
    out = {}
    for held in (LOOP_PART_ROWS, None):
        ops = make_local_ops(cfg, data)
        assert ops.execution.strategy == "loop" and ops.request_rows == LOOP_PART_ROWS
        ops.request_rows = held
        asked = Asked(ops)
        state = run_rounds(build_algorithm(cfg.algorithm, 3, cfg.seed), asked, 3)
        out[held] = (state.X, state.W, max(asked.rows))
    X, W, most = out[LOOP_PART_ROWS]
    assert most <= LOOP_PART_ROWS and out[None][2] > 4 * LOOP_PART_ROWS
    assert torch.equal(X, out[None][0]) and torch.equal(W, out[None][1])


PEAK = textwrap.dedent(
    """
    import json, sys
    from raycobo.bench.common import peak_rss_mb, rss_mb  # VmHWM: not pytest's peak
    from raycobo.config import load_config
    from tests.helpers import build, DIGITS

    cfg = load_config(None, DIGITS + sys.argv[1:])
    data, ops, algo = build(cfg)
    state = algo.init(ops)
    before = rss_mb() * 2**20
    state, stats = algo.round(state, 0, ops)
    peak = peak_rss_mb() * 2**20
    budget = ops.execution.memory_budget_gb
    print(json.dumps({"grew": peak - before, "edges": stats["edges"],
                      "rows": ops.request_rows, "dim": ops.dim, "budget": budget}))
    """
)


def _round_peak(*overrides: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", PEAK, *overrides], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_rounds_peak_memory_follows_the_budget():
    """A conv net's round of 780 pairs (3,120 alignment rows of 86,000 parameters: 1 GiB
    of points and as much of gradients, were they held at once) on the per-client loop
    with engine.memory_gb 0.25 grows the process by less than twice that budget (its
    first round also makes torch's and the batches' buffers), a quarter of the request."""
    small = _round_peak(
        "model.name=cnn",
        "algorithm.sampling=full",
        "data.fraction=1.0",
        "data.partition.num_clusters=4",
        "data.partition.clients_per_cluster=10",
        "engine.memory_gb=0.25",
    )
    assert small["edges"] == 780 and small["rows"] <= 64
    whole = 3120 * small["dim"] * 4 * 2  # the request's points and gradients at once
    assert whole > 2**30 and small["grew"] < 2 * 0.25 * 2**30 < whole / 2, small


def test_shared_point_parts_leave_nothing_between_them():
    """The MLP's shared-point parts (435 pairs of a 150,000-parameter model in parts of
    nine pairs, batch 512, engine.memory_gb 1): the round grows the process by less than
    twice the budget. Each part's scores once stayed alive in a list while the next part's
    gradients and minibatches were made, so each split the heap's free block that the
    next part needed (glibc never trims or maps it: ``keep_freed_memory``) and the
    process grew by about one part's memory per part: 3.5 GB here, 19 GB in round 0 of a
    400-client run with every pair sampled."""
    got = _round_peak(
        "algorithm.sampling=full",
        "data.fraction=1.0",
        "data.partition.num_clusters=3",
        "data.partition.clients_per_cluster=10",
        "batch_size=512",
        "model.hidden=[2048]",
        "engine.chunk_size=64",
        "engine.memory_gb=1",
    )
    assert got["edges"] == 435 and got["rows"] < 64, got
    assert got["grew"] < 2 * 2**30, got
