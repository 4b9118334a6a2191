"""How client batches execute in the local engine, and how much memory they may take.

``engine.strategy``:

- ``vmap``: all requested (client, point) rows in one batched call (``torch.func.vmap`` or
  the MLP's hand-batched GEMMs), up to ``engine.chunk_size`` rows: the fastest path on a
  GPU, and for the MLP on a CPU.
- ``chunked``: the same batched calls over chunks of rows sized so that one call's
  activations fit the memory budget; evaluation over blocks of test samples likewise.
- ``loop``: one client at a time through the plain ``nn.Module`` (oneDNN's direct
  convolutions): on a CPU, grouped per-client convolutions under vmap are about 2x
  slower than this loop for conv nets (measured in the issue "Local engine").
- ``auto`` (default): ``loop`` for conv nets (any model with a convolution) on a CPU,
  ``chunked`` otherwise.

Every strategy draws the same minibatches and computes the same per-client functions, so
their numbers agree to float rounding (tested).

The budget is ``engine.memory_gb``, else half of the memory available now (the CPU's
``MemAvailable``, or the GPU's free memory). Activation sizes come from one probe
forward of the model on a single sample. A request of more gradient rows than the budget
holds beside one call (``request_rows``: each row's point, gradient and a temporary) is
answered in parts where it can be: pair scores (``pairs.answer``), each part reduced to
its scores before the next, whatever the strategy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

BYTES = 4  # float32
# saved activations, their gradients and the temporaries of a backward pass, per float
# of forward output; functional ops (relu, pooling) outside modules are not hooked
TRAIN_FACTOR = 6.0
EVAL_FACTOR = 3.0
# a gradient request's rows held at once, per float of a row: its points, its gradients
# and one temporary (the pair scores' minibatch mean or the rows' repeated points)
REQUEST_COPIES = 3
# the loop's parts: its rows run one at a time whatever the part, and parts of one size,
# freed and made again each round, are reused where the heap keeps its memory
# (``keep_freed_memory``) instead of leaving holes a larger round's rows do not fit
LOOP_PART_ROWS = 64


@dataclass
class Execution:
    """What the local engine chose for this run (reported in summary.json)."""

    strategy: str  # vmap | chunked | loop
    rows_per_call: int  # client rows in one batched training call
    request_rows: int  # gradient rows of one request held at once (pair scores in parts)
    eval_rows: int  # client rows in one evaluation call
    eval_block: int  # test samples per evaluation call
    memory_budget_gb: float
    activation_floats_per_sample: int
    precision: str = "fp32"  # fp32 | tf32 | bf16 (engine.precision)
    channels_last: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


_MALLOC_TUNED = False
# glibc's names of what keep_freed_memory sets (MALLOC_<NAME>_ in the environment)
TUNED = ("mmap_threshold", "trim_threshold", "mmap_max")


def keep_freed_memory() -> bool:
    """Let glibc keep the memory a round frees for the next round, instead of returning
    it to the system: no block is served by its own mmap (M_MMAP_MAX 0) and the heap is
    never trimmed (M_TRIM_THRESHOLD -1), so the process holds its peak heap, as torch's
    CUDA caching allocator holds its peak on a GPU. A round allocates and frees the same
    activation, gradient and minibatch buffers every time; with glibc's defaults each of
    those above 128 KiB is an mmap/munmap pair with fresh page faults, and a threshold
    only helps below it (a round's transient memory grows with the pairs it samples).
    Measured (MLP, fresh processes, interleaved): 32 MiB thresholds took the cross-device
    twin (80 clients, 2 threads) from 49-85 to 36-45 ms a round; 1 GiB ones took 40
    clients from 45-51 to 29-30 ms and 160 clients from 242-284 to 172-181 ms; at 400
    clients (fmnist-400-r1000, ~1,500 pairs a round, 1 thread) 1 GiB still left 315k page
    faults a round (2.3-3.0 s a round) where this leaves none (1.6-1.7 s), at the same peak
    resident memory (3.7-4.0 GB). Once per process; glibc on Linux only (elsewhere nothing
    happens), and not where the user set any of these (MALLOC_MMAP_THRESHOLD_,
    MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_MAX_ or GLIBC_TUNABLES in the environment).
    -> whether it was applied"""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return True
    import ctypes
    import ctypes.util
    import os
    import sys

    if not sys.platform.startswith("linux"):
        return False
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(f"MALLOC_{k.upper()}_" in os.environ or f"malloc.{k}" in tunables for k in TUNED):
        return False  # the user's own settings stand
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
        ok = libc.mallopt(M_MMAP_MAX, 0) == 1
        ok = libc.mallopt(M_TRIM_THRESHOLD, -1) == 1 and ok
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    _MALLOC_TUNED = ok
    return ok


def available_bytes(device: torch.device) -> int:
    """Memory this process may still use on ``device``."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30  # no /proc: assume a modest machine


def check_fits(algorithm, n: int, d: int, device: torch.device) -> None:
    """Refuse, before anything is allocated, a run whose state cannot fit: the parts an
    algorithm reports (``SizesItsState``; else its clients' models) against the memory
    available now, with the figures and the setting that shrinks each part."""
    from raycobo.algorithms.base import MODELS, SizesItsState
    from raycobo.settings import ConfigError

    if isinstance(algorithm, SizesItsState):
        parts = algorithm.state_bytes(n, d)
    else:
        parts = {MODELS: 4 * n * d * 2}
    need, have = sum(parts.values()), available_bytes(device)
    if need > 0.9 * have:
        shown = "; ".join(f"{k}: {v / 2**30:,.1f} GiB" for k, v in parts.items())
        raise ConfigError(
            f"{n:,} clients of {d:,} parameters need about {need / 2**30:,.1f} GiB on "
            f"{device.type} ({shown}), more than the {have / 2**30:,.1f} GiB available"
        )


def budget_bytes(memory_gb: float | None, device: torch.device) -> int:
    if memory_gb is not None:
        return int(memory_gb * 2**30)
    return available_bytes(device) // 2


@torch.no_grad()
def activation_floats(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Floats of forward output of every leaf module for one sample (a probe on CPU)."""
    total = 0

    def hook(_m, _inp, out):
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel()

    handles = [m.register_forward_hook(hook) for m in module.modules() if not list(m.children())]
    was = module.training
    try:
        module.eval()
        module(torch.zeros(1, *input_shape))
    finally:
        module.train(was)
        for h in handles:
            h.remove()
    return max(total, 1)


def is_conv_net(module: nn.Module) -> bool:
    """Convolutions anywhere in the module (built-in or a plugin's)."""
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in module.modules())


def check_precision(precision: str, channels_last: bool, strategy: str, module, device) -> None:
    """Refuse the settings that would do nothing where they are asked for."""
    from raycobo.config import ConfigError

    if precision == "tf32" and device.type != "cuda":
        raise ConfigError(
            "invalid config key 'engine.precision': tf32 is a CUDA format (matmuls and "
            f"convolutions on tensor cores); on {device.type} use fp32 or bf16"
        )
    if channels_last and not is_conv_net(module):
        raise ConfigError("invalid config key 'engine.channels_last': the model has no convolution")
    if channels_last and strategy != "loop":
        raise ConfigError(
            f"invalid config key 'engine.channels_last': it applies to the per-client loop "
            f"(engine.strategy=loop); the {strategy} strategy batches clients as grouped "
            "convolutions in their own layout"
        )


def plan_execution(
    strategy: str,
    module: nn.Module,
    input_shape: tuple[int, ...],
    dim: int,
    batch_size: int,
    device: torch.device,
    memory_gb: float | None,
    chunk_size: int,
    precision: str = "fp32",
    channels_last: bool = False,
) -> Execution:
    """Resolve ``auto``, size the chunks from the memory budget, check the precision and
    layout settings."""
    if strategy == "auto":
        strategy = "loop" if device.type == "cpu" and is_conv_net(module) else "chunked"
    act = activation_floats(module, input_shape)
    budget = budget_bytes(memory_gb, device)
    per_row = (TRAIN_FACTOR * act * batch_size + 4 * dim) * BYTES  # one row's train call
    per_sample = EVAL_FACTOR * act * BYTES  # one (model, test sample) pair's forward
    if strategy == "vmap":
        rows = chunk_size
    elif strategy == "loop":
        rows = 1
    else:
        rows = int(max(1, min(chunk_size, budget // max(per_row, 1))))
    # evaluation: rows x block test samples per call within the budget
    eval_block = int(max(1, min(2048, budget // max(per_sample, 1))))
    if strategy == "vmap":  # no bound: every client's block in one call
        eval_rows, eval_block = chunk_size, 2048
    elif strategy == "loop":
        eval_rows = 1
    else:
        eval_rows = int(max(1, min(chunk_size, budget // max(per_sample * eval_block, 1))))
    check_precision(precision, channels_last, strategy, module, device)
    budget_gb = round(budget / 2**30, 3)
    request = request_rows(budget, rows * per_row, dim)
    if strategy == "loop":
        request = min(request, LOOP_PART_ROWS)
    return Execution(
        strategy, rows, max(rows, request), eval_rows, eval_block, budget_gb, act, precision,
        channels_last,
    )  # fmt: skip


def request_rows(budget: int, call: float, dim: int) -> int:
    """The gradient rows of d = ``dim`` floats that one request may hold at once beside
    one call's activations (``call`` bytes) within ``budget`` bytes (at least 4)."""
    return int(max(4, (budget - call) // (REQUEST_COPIES * BYTES * max(dim, 1))))
