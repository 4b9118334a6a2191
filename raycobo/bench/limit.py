"""A round's arithmetic and the machine's limit for it (``raycobo bench engine``).

One round is run under a dispatch mode that records every matrix product and
convolution it executes (the operators that carry its arithmetic), each with the phase
that issued it: the clients' gradients (split into the model step and CoBo's alignment
by the rows each asked for), everything else in the round (the penalty's W @ X, W
updates), and one evaluation. Each recorded operator's FLOPs come from torch's own
counter (``torch.utils.flop_counter``); the **limit** is the time the same operators take
when replayed back to back on this machine, on tensors of the same shapes, strides and
dtypes, measured in the same call. ``limit_ms / round_ms`` is then the share of the
machine's attainable throughput on the round's own shapes that the round reaches: what
is left is overhead (minibatch gathering, elementwise work, Python, allocation).

On a shared machine the speed of the same work moves between windows (on the 2-core VM
the replay alone measured 81 and 39 GFLOP/s in consecutive calls), so a round timed in
one window against a replay timed in another gives shares from 41 to 101 %. The share is
therefore taken on the recorded round itself: it is run again from the same state
(same edges, same minibatches) and replayed, interleaved, ``repeats`` times, and the best
of each is compared: both from the machine's fast windows.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from raycobo import rng

aten = torch.ops.aten
HEAVY = {  # by overload packet: the ``out=`` forms the fused kernels call count too
    aten.mm,
    aten.addmm,
    aten.addmm_,  # CoBo's penalty step, X += -lr rho (W X) in place
    aten.bmm,
    aten.baddbmm,
    aten.baddbmm_,
    aten.convolution,
    aten.convolution_backward,
}
# torch's FLOP counter knows the out-of-place forms; an in-place one does the same work
COUNTED_AS = {aten.addmm_.default: aten.addmm.default, aten.baddbmm_.default: aten.baddbmm.default}


def _meta(x: Any) -> Any:
    """A hashable description of an operator argument (tensors by layout)."""
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype, x.device.type)
    if isinstance(x, list | tuple):
        return ("L" if isinstance(x, list) else "U", tuple(_meta(v) for v in x))
    return x


def _make(m: Any) -> Any:
    """An argument like the one ``m`` describes (tensors of random values)."""
    if isinstance(m, tuple) and len(m) == 5 and m[0] == "T":
        # the same view of a storage of its own (a stride of 0, as expand() makes, too)
        _, shape, stride, dtype, device = m
        span = sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        base = torch.empty(1 + span if all(shape) else 0, dtype=dtype, device=device)
        base = base.normal_() if dtype.is_floating_point else base.zero_()
        return base.as_strided(shape, stride)
    if isinstance(m, tuple) and len(m) == 2 and m[0] in ("L", "U"):
        items = [_make(v) for v in m[1]]
        return items if m[0] == "L" else tuple(items)
    return m


class _Recorder(TorchDispatchMode):
    """Counts the heavy operators a block runs, by (operator, argument layout, phase)."""

    def __init__(self):
        super().__init__()
        self.seen: Counter = Counter()
        self.phase = "penalty and W"  # whatever the round runs outside the gradients

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._overloadpacket in HEAVY:
            key = (func, _meta(args), tuple(sorted((k, _meta(v)) for k, v in kwargs.items())))
            self.seen[(key, self.phase)] += 1
        return func(*args, **kwargs)


def _prepared(key, count: bool = True) -> tuple[Any, tuple, dict, float | None, bool]:
    """(operator, arguments on fresh tensors, keyword arguments, FLOPs per call or None
    without ``count``, on CUDA) of one recorded operator."""
    func, args_m, kwargs_m = key
    args, kwargs = _make(args_m), {k: _make(v) for k, v in kwargs_m}
    flops = None
    if count:  # one extra call of the operator under the counter
        with FlopCounterMode(display=False) as fc:
            COUNTED_AS.get(func, func)(*args, **kwargs)
        flops = float(fc.get_total_flops())
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    return func, args, kwargs, flops, cuda


def _replay_seconds(op, min_s: float = 0.02, max_reps: int = 200) -> float:
    """Seconds per call of a prepared operator, repeated back to back."""
    func, args, kwargs, _, cuda = op
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    func(*args, **kwargs)  # warm
    sync()
    reps, t0 = 0, time.perf_counter()
    while reps < max_reps and (reps < 3 or time.perf_counter() - t0 < min_s):
        func(*args, **kwargs)
        reps += 1
    sync()
    return (time.perf_counter() - t0) / reps


@dataclass
class Limit:
    """FLOPs and the replayed-operator time of one round, by phase (and of one
    evaluation)."""

    gflop: dict[str, float] = field(default_factory=dict)  # by phase
    limit_ms: dict[str, float] = field(default_factory=dict)  # by phase
    eval_gflop: float = 0.0
    eval_limit_ms: float = 0.0
    round_ms: float | None = None  # the recorded round run again: the best of ``repeats``
    repeats: int = 1

    @property
    def round_gflop(self) -> float:
        return sum(self.gflop.values())

    @property
    def round_limit_ms(self) -> float:
        return sum(self.limit_ms.values())

    def share(self) -> float:
        """The round's share of the machine's limit on its own operators: the best
        replay against the best rerun of the same round."""
        ms = self.round_ms
        return self.round_limit_ms / ms if ms else float("nan")

    def line(self) -> str:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in self.gflop.items() if v > 0)
        rate = 1e3 * self.round_gflop / self.round_limit_ms if self.round_limit_ms else 0.0
        return (
            f"{self.round_gflop:.3f} GFLOP/round ({parts}); its operators replayed: "
            f"{self.round_limit_ms:.2f} ms ({rate:.0f} GFLOP/s) = "
            f"{100 * self.share():.0f} % of the same round's {self.round_ms or 0:.2f} ms "
            f"(each the best of {self.repeats}, interleaved); evaluation "
            f"{self.eval_gflop:.3f} GFLOP, limit {self.eval_limit_ms:.2f} ms"
        )


def _record(session, ops, t: int) -> tuple[_Recorder, Counter]:
    """Run round ``t`` and one evaluation under the recorder: the heavy operators by
    phase, and the gradient rows by kind (alignment or model step)."""
    rec = _Recorder()
    rows = Counter()
    real_grads = ops.grads

    def grads(clients, Z, round, stream, salt=0):
        before = rec.phase
        rec.phase = "gradients"
        try:
            s = stream if isinstance(stream, torch.Tensor) else torch.tensor([stream])
            s = s.expand(clients.numel()) if s.numel() == 1 else s
            align = int((s == rng.ALIGN).sum())
            rows["alignment"] += align
            rows["model step"] += s.numel() - align
            return real_grads(clients, Z, round, stream, salt)
        finally:
            rec.phase = before

    own = ops.__dict__.get("grads")  # an instance's own grads, if it has one
    ops.grads = grads
    try:
        with rec:
            session.round(t)
        rec.phase = "evaluation"
        with rec:
            session.evaluate()
    finally:
        if own is None:
            del ops.grads  # the class's method again
        else:
            ops.grads = own
    return rec, rows


def _best_of(session, t: int, before, recorded: list, out: Limit, sync) -> tuple[dict, dict]:
    """``out.repeats`` times, interleaved: round t rerun from ``before`` (its best time
    into ``out.round_ms``) and every recorded operator replayed. -> (the fastest replay's
    milliseconds by phase, FLOPs per call by operator)"""
    flops: dict = {}
    best: dict[str, float] | None = None
    for _ in range(out.repeats):
        if before is not None:
            session.state = before
        sync()
        t0 = time.perf_counter()
        session.round(t)
        sync()
        ms = 1e3 * (time.perf_counter() - t0)
        out.round_ms = ms if out.round_ms is None else min(out.round_ms, ms)
        spent: dict[str, float] = {}
        for (key, phase), count in recorded:  # one operator's tensors alive at a time
            op = _prepared(key, count=key not in flops)  # FLOPs counted on the first pass
            if op[3] is not None:
                flops[key] = op[3]
            spent[phase] = spent.get(phase, 0.0) + count * _replay_seconds(op) * 1e3
            del op
        if best is None or sum(spent.values()) < sum(best.values()):
            best = spent
    return best or {}, flops


def round_limit(session, ops, t: int, repeats: int = 5) -> Limit:
    """Record round ``t`` of a started session (and one evaluation), then ``repeats``
    times, interleaved, run round t again from the same state and replay each heavy
    operator it ran: its FLOPs by phase, the best replay and the best rerun (the
    session's state is the recorded round's afterwards)."""
    before = getattr(session, "state", None)  # rounds return new states (resume relies on it)
    rec, rows = _record(session, ops, t)
    after = getattr(session, "state", None)
    recorded = list(rec.seen.items())  # ((key, phase), count)
    cuda = getattr(getattr(ops, "device", None), "type", "cpu") == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = Limit(repeats=max(1, repeats))
    best, flops = _best_of(session, t, before, recorded, out, sync)
    if after is not None:
        session.state = after
    for (key, phase), count in recorded:
        gflop = count * flops[key] / 1e9
        if phase == "evaluation":
            out.eval_gflop += gflop
        else:
            out.gflop[phase] = out.gflop.get(phase, 0.0) + gflop
    out.eval_limit_ms = best.pop("evaluation", 0.0)
    out.limit_ms = {phase: best.get(phase, 0.0) for phase in out.gflop}
    total = sum(rows.values())
    if "gradients" in out.gflop and total:  # equal work per row: split by rows
        g, ms = out.gflop.pop("gradients"), out.limit_ms.pop("gradients")
        for part, r in rows.items():
            out.gflop[part] = g * r / total
            out.limit_ms[part] = ms * r / total
    return out
