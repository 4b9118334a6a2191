"""``raycobo bench engine``: the local engine (its automatic strategy) against the plain
per-client loop (``engine.kind: loop``, the reference the tests check it against), for
each model and number of clients, with time per round and peak memory.

Each (model, n, engine) is measured in a fresh process, so its peak resident memory is
its own. The workload is the platform's own: FedAvg and CoBo (constant sampling,
p = 1/n, rho auto) from ``raycobo.algorithms`` over ``make_local_ops``, on synthetic
inputs of the model's shape. Each local-engine row also gives the round's FLOPs and
its share of this machine's limit on the round's own operators (``bench/limit.py``),
its minibatch passes (gradients and forward-only losses) a round, and its time against
Local's and against CoBo's ``preset: paper`` measured in the same process.

Entries (``algorithms``): a method's name with its defaults (``cobo``, ``fedavg``,
``local``), ``cobo-paper`` (``algorithm.preset: paper``), or ``cobo-KEY``: CoBo's
defaults with one preset key at the paper preset's value (``cobo-alignment_batches``:
one minibatch an end), what that default costs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from raycobo.bench.common import (
    CountingOps,
    _time,
    peak_rss_mb,
    started,
    synthetic_data,
    write_rows,
)
from raycobo.bench.limit import round_limit
from raycobo.settings import ConfigError

SHAPES = {
    "mlp": (1, 28, 28),
    "cnn": (1, 28, 28),
    "fedavg_cnn": (1, 28, 28),
    "cnn1d": (1, 40),
    "resnet9": (3, 32, 32),
}


@dataclass
class EngineRow:
    model: str
    n: int
    algorithm: str
    engine: str  # local | loop
    strategy: str  # what the local engine chose (auto), or loop
    ms_per_round: float
    eval_ms: float
    speedup_vs_loop: float | None
    peak_mib: float
    threads: int
    gflop_per_round: float | None = None  # the round's matrix products and convolutions
    limit_ms: float | None = None  # the same operators replayed back to back here
    share_of_limit: float | None = None  # limit_ms / ms_per_round
    grads_per_round: float | None = None  # minibatch gradients a round (local engine)
    losses_per_round: float | None = None  # forward-only minibatch losses a round
    vs_local: float | None = None  # ms_per_round over Local's, same process
    vs_paper: float | None = None  # ms_per_round over CoBo preset paper's, same process


REFERENCES = ("local", "cobo-paper")  # measured beside every local-engine row


# the CoBo keys every measurement sets (``workload``): constant sampling from round 0 on,
# a steady round
WORKLOAD_COBO = {"sampling": "constant", "start_all_pairs": False}


def entry_overrides(entry: str) -> dict:
    """The config keys of a bench entry (module docstring); an unknown one raises."""
    from raycobo.algorithms import method_names
    from raycobo.algorithms.cobo.settings import PRESET_KEYS, PRESETS

    if entry in method_names():
        return {"algorithm.name": entry}
    if entry == "cobo-paper":
        return {"algorithm.name": "cobo", "algorithm.preset": "paper"}
    key = entry.removeprefix("cobo-")
    if entry.startswith("cobo-") and key in PRESET_KEYS:
        value = PRESETS["paper"][key]
        if value == WORKLOAD_COBO.get(key, PRESETS["raycobo"][key]):
            raise ConfigError(
                f"--algorithms: {entry} measures nothing here: every row's CoBo runs with "
                f"{key} = {value} already"
            )
        return {"algorithm.name": "cobo", f"algorithm.{key}": value}
    raise ConfigError(
        f"--algorithms: unknown entry '{entry}' (a method, cobo-paper, or cobo-KEY with KEY "
        f"one of CoBo's preset keys: {', '.join(PRESET_KEYS)})"
    )


def workload(model: str, n: int, engine: str, batch_size: int, extra: list[str] | None = None):
    """(config, data) of one measurement: the model on synthetic data, n clients."""
    from raycobo.config import load_config

    cfg = load_config(
        None,
        [
            f"model.name={model}",
            "model.hidden=[64]",
            f"engine.kind={engine}",
            f"batch_size={batch_size}",
            *(f"algorithm.{k}={str(v).lower()}" for k, v in WORKLOAD_COBO.items()),
            "algorithm.lr=0.05",
            "tracking.enabled=false",
            *(extra or []),
        ],
    )
    return cfg, synthetic_data(n, per_client=100, shape=SHAPES[model])


def measure(
    model: str,
    n: int,
    engine: str,
    algorithms: list[str],
    rounds: int,
    batch_size: int,
    threads: int,
    device: str = "cpu",
    strategy: str = "auto",
) -> list[dict]:
    """One (model, n, engine, strategy): ms per round of each entry (the local engine:
    the REFERENCES too), one evaluation, peak RSS (and peak GPU memory on CUDA). Runs in
    its own process (see bench_engine)."""
    from raycobo.algorithms import build_algorithm
    from raycobo.config import with_overrides
    from raycobo.engine import make_local_ops

    torch.set_num_threads(threads)
    extra = [f"engine.device={device}", f"engine.strategy={strategy}"]
    cfg, data = workload(model, n, engine, batch_size, extra)
    ops = CountingOps(make_local_ops(cfg, data))
    cuda = device.startswith("cuda")
    out = []
    if engine == "local":
        algorithms = [*algorithms, *(r for r in REFERENCES if r not in algorithms)]
    for name in algorithms:
        algo = build_algorithm(with_overrides(cfg, entry_overrides(name)).algorithm, 10**6, 0)
        out.append(_measure_entry(name, started(algo, ops), ops, engine, rounds, cuda))
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mb()
    ms = {r["algorithm"]: r["ms_per_round"] for r in out}
    for r in out:
        r["vs_local"] = r["ms_per_round"] / ms["local"] if "local" in ms else None
        r["vs_paper"] = r["ms_per_round"] / ms["cobo-paper"] if "cobo-paper" in ms else None
    return [{**r, "peak_mib": peak} for r in out]


def _measure_entry(name: str, session, ops, engine: str, rounds: int, cuda: bool) -> dict:
    """One entry's row: ms per round, one evaluation, its gradient and loss rows a round,
    and on the local engine the round's arithmetic against this machine's limit."""
    ops.grad_rows = ops.loss_rows = 0

    def step(t):
        session.round(t)
        if cuda:  # the GPU works asynchronously: a round ends with its kernels
            torch.cuda.synchronize()

    sec = _time(step, rounds, warmup=1)
    passes = (ops.grad_rows / (rounds + 1), ops.loss_rows / (rounds + 1))
    ev = _time(lambda t: session.evaluate(), 1, warmup=0)
    row = {
        "algorithm": name,
        "ms_per_round": 1e3 * sec,
        "eval_ms": 1e3 * ev,
        "strategy": ops.execution.strategy if engine == "local" else "loop",
        "grads_per_round": passes[0],
        "losses_per_round": passes[1],
    }
    if engine == "local":  # the round's arithmetic and this machine's limit for it
        # the recorded round rerun and replayed up to 5 times (a 1-round bench: once)
        lim = round_limit(session, ops, rounds + 1, repeats=min(5, rounds))
        row |= {
            "gflop_per_round": lim.round_gflop,
            "limit_ms": lim.round_limit_ms,
            "share_of_limit": lim.share(),
            "limit_line": lim.line(),
        }
    return row


def _call_into(conn, fn, args: tuple) -> None:
    try:
        conn.send((True, fn(*args)))
    except BaseException as err:  # noqa: BLE001 - handed to the parent, which raises it
        conn.send((False, err))


def in_fresh_process(fn, args: tuple, ctx, timeout_s: float, what: str):
    """``fn(*args)`` in a new process; one that dies (the kernel's out-of-memory killer,
    say) or outlasts ``timeout_s`` stops the benchmark with one line naming ``what``
    (a pool would wait for ever on a worker that is gone)."""
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_call_into, args=(child, fn, args), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):  # true at once where the process ended
            raise RuntimeError(f"the measurement of {what} took over {timeout_s:.0f} s")
        ok, value = parent.recv()
    except EOFError:
        proc.join(5)
        raise RuntimeError(
            f"the measurement of {what} died (exit code {proc.exitcode}; out of memory? see "
            "dmesg): measure fewer clients or a smaller model on this machine"
        ) from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()
    if not ok:
        raise value
    return value


def bench_engine(
    models: list[str],
    clients: list[int],
    rounds: int = 5,
    batch_size: int = 32,
    out: Path | None = None,
    echo=print,
    algorithms: list[str] = ("cobo",),
    threads: int | None = None,
    timeout_s: float = 3600.0,
    device: str = "cpu",
    strategies: list[str] = ("auto",),
    with_loop: bool = True,
) -> list[EngineRow]:
    """The loop once per (model, n) (``with_loop``), then the local engine with each of
    ``strategies`` (``auto`` is reported as what it chose) and the REFERENCES. Peak
    memory: the process's resident set on a CPU, the GPU memory allocated on CUDA."""
    for a in algorithms:
        entry_overrides(a)  # an unknown entry stops here, before any measurement
    threads = threads or torch.get_num_threads()
    echo(f"torch threads: {threads}, load average: {os.getloadavg()[0]:.2f}, device {device}")
    rows: list[EngineRow] = []
    ctx = mp.get_context("spawn")

    def fresh(model, n, engine, strategy):
        args = (model, n, engine, list(algorithms), rounds, batch_size, threads, device)
        return in_fresh_process(
            measure, (*args, strategy), ctx, timeout_s, f"{model}, n={n}, {engine}"
        )

    for model in models:
        for n in clients:
            loop = {r["algorithm"]: r for r in fresh(model, n, "loop", "auto")} if with_loop else {}
            rows += [_row(model, n, "loop", r, r, threads) for r in loop.values()]
            for strategy in strategies:
                for r in fresh(model, n, "local", strategy):
                    loop_r = loop.get(r["algorithm"])
                    rows.append(_row(model, n, "local", r, loop_r, threads))
                    vs = f"x{r['vs_local']:.2f} Local" + (
                        f", x{r['vs_paper']:.2f} paper" if r["vs_paper"] is not None else ""
                    )
                    against = (
                        f"   loop {loop_r['ms_per_round']:9.1f} ms/round "
                        f"{loop_r['peak_mib']:7.0f} MiB   "
                        f"x{loop_r['ms_per_round'] / r['ms_per_round']:.2f}"
                        if loop_r
                        else ""
                    )
                    echo(
                        f"{model:8s} n={n:4d} {r['algorithm']:6s} local ({r['strategy']}) "
                        f"{r['ms_per_round']:9.1f} ms/round {r['peak_mib']:7.0f} MiB   "
                        f"{r['grads_per_round']:.0f} gradients + {r['losses_per_round']:.0f} "
                        f"losses a round, {vs}{against}"
                    )
                    echo(f"{'':8s} {r['algorithm']}: {r['limit_line']}")
    if out is not None:
        write_rows(out / "bench_engine.csv", rows)
    return rows


def _row(model: str, n: int, engine: str, r: dict, loop_r: dict | None, threads: int) -> EngineRow:
    speed = loop_r["ms_per_round"] / r["ms_per_round"] if loop_r else None
    return EngineRow(
        model,
        n,
        r["algorithm"],
        engine,
        r["strategy"],
        r["ms_per_round"],
        r["eval_ms"],
        speed,
        r["peak_mib"],
        threads,
        r.get("gflop_per_round"),
        r.get("limit_ms"),
        r.get("share_of_limit"),
        r.get("grads_per_round"),
        r.get("losses_per_round"),
        r.get("vs_local"),
        r.get("vs_paper"),
    )


def as_markdown(rows: list[EngineRow]) -> str:
    """The throughput table (docs/explanation/throughput.md): one line per local-engine
    (model, n, entry)."""
    lines = [
        "| model | n | entry | local (strategy) ms/round | vs Local | vs paper | "
        "gradients + losses a round | loop ms/round | local/loop speed | "
        "peak MiB local / loop | GFLOP/round | share of limit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    loops = {(r.model, r.n, r.algorithm): r for r in rows if r.engine == "loop"}
    for a in rows:
        if a.engine != "local":
            continue
        b = loops.get((a.model, a.n, a.algorithm))
        lines.append(
            f"| {a.model} | {a.n} | {a.algorithm} | {a.ms_per_round:.1f} ({a.strategy}) | "
            f"{_x(a.vs_local)} | {_x(a.vs_paper)} | "
            f"{a.grads_per_round or 0:.0f} + {a.losses_per_round or 0:.0f} | "
            f"{f'{b.ms_per_round:.1f}' if b else '-'} | "
            f"{_x(b.ms_per_round / a.ms_per_round) if b else '-'} | "
            f"{a.peak_mib:.0f} / {f'{b.peak_mib:.0f}' if b else '-'} | "
            f"{a.gflop_per_round or 0:.3f} | {100 * (a.share_of_limit or 0):.0f} % |"
        )
    return "\n".join(lines) + "\n"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"x{ratio:.2f}"
