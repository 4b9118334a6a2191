"""``raycobo bench paper``: the CoBo paper's vision experiments at full size -- how long
they take here, against what one plain model trains at on the same device.

Settings (CoBo Section 4, Appendix B; ResNet-9, batch 128):

- ``cross_silo``: 8 clients (4 label-permuted clusters of 2), CIFAR-100's 100 classes,
  40,000 iterations;
- ``cross_device``: 80 clients in 10 clusters of 6-10, 10 classes per cluster, 20,000
  iterations.

Each (setting, precision, layout) measures CoBo's rounds (constant sampling, p = 1/n) on
CIFAR-shaped synthetic data with the local engine: seconds per round, gradients per
round, images per second (gradients x batch / second), peak GPU memory, and the whole
experiment's projected wall time. The practical limit is measured in the same call: one
plain ResNet-9 (``nn.Module``, SGD) trained at the same batch, precision and layout --
its images per second. ``ratio`` is CoBo's images per second over the single model's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from raycobo.bench.common import started, synthetic_data, write_rows

SETTINGS = {
    "cross_silo": {"clients": 8, "classes": 100, "iterations": 40_000},
    "cross_device": {"clients": 80, "classes": 10, "iterations": 20_000},
}


@dataclass
class PaperRow:
    setting: str
    n: int
    device: str
    precision: str
    channels_last: bool
    strategy: str
    s_per_round: float
    grads_per_round: float
    images_per_s: float
    single_images_per_s: float
    ratio: float
    peak_gib: float | None
    projected_hours: float


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def single_model_rate(
    classes: int, batch: int, device: str, precision: str, channels_last: bool, steps: int
) -> float:
    """Images per second of one ResNet-9 trained the plain way at this batch, precision
    and layout (forward, backward, SGD step)."""
    from raycobo.models.vision import ResNet9

    dev = torch.device(device)
    net = ResNet9((3, 32, 32), classes, "group").to(dev)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(batch, 3, 32, 32, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (batch,), device=dev)
    use_bf16 = precision == "bf16"
    # the same switches the engine sets for this precision (process-wide)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss = torch.nn.functional.cross_entropy(net(x).float(), y)
        loss.backward()
        opt.step()

    for _ in range(5):  # cuDNN's algorithm search and the allocator settle
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return steps * batch / (time.perf_counter() - t0)


def cobo_rate(
    setting: str, n: int, batch: int, device: str, precision: str, channels_last: bool, rounds: int
) -> tuple[float, float, str, float | None]:
    """(seconds per round, gradients per round, strategy, peak GiB) of CoBo's rounds."""
    from raycobo.algorithms import build_algorithm
    from raycobo.config import load_config
    from raycobo.engine import make_local_ops

    classes = SETTINGS[setting]["classes"]
    extra = ["engine.strategy=loop"] if channels_last else []
    cfg = load_config(
        None,
        [
            "model.name=resnet9",
            f"batch_size={batch}",
            "algorithm.sampling=constant",
            "algorithm.start_all_pairs=false",  # a steady round, round 0 included
            "algorithm.lr=0.01",
            "tracking.enabled=false",
            f"engine.device={device}",
            f"engine.precision={precision}",
            f"engine.channels_last={str(channels_last).lower()}",
            *extra,
        ],
    )
    data = synthetic_data(n, per_client=2 * batch, shape=(3, 32, 32), classes=classes)
    ops = make_local_ops(cfg, data)
    session = started(build_algorithm(cfg.algorithm, 10**6, 0), ops)
    # warm-up: kernels chosen and buffers allocated. Two rounds: the sampled pairs differ
    # from round to round, and so do the shapes the alignment's batched calls see (after
    # one warm-up round, the first measurement of a setting on an H200 ran at 18-29 % of
    # one model's speed and the next precision's, with the same kernels, at 77-98 %)
    for t in range(2):
        session.round(t)
    _sync(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    grads = 0.0
    t0 = time.perf_counter()
    for t in range(2, rounds + 2):
        stats = session.round(t)
        grads += stats["alignment_grads"] + stats["clients"]
    _sync(device)
    sec = (time.perf_counter() - t0) / rounds
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    return sec, grads / rounds, ops.execution.strategy, peak


def bench_paper(
    settings: list[str],
    device: str = "cuda",
    precisions: list[str] = ("fp32",),
    layouts: list[bool] = (False,),
    rounds: int = 3,
    batch_size: int = 128,
    clients: int | None = None,
    out: Path | None = None,
    echo=print,
) -> list[PaperRow]:
    """Every (setting, precision, layout); ``clients`` scales a setting down (smoke runs)."""
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    echo(
        f"device {gpu}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.2f}, batch {batch_size}"
    )
    rows: list[PaperRow] = []
    for setting in settings:
        spec = SETTINGS[setting]
        n = clients or spec["clients"]
        for precision in precisions:
            for cl in layouts:
                sec, grads, strategy, peak = cobo_rate(
                    setting, n, batch_size, device, precision, cl, rounds
                )
                single = single_model_rate(
                    spec["classes"], batch_size, device, precision, cl, max(20, rounds * 6)
                )
                rate = grads * batch_size / sec
                row = PaperRow(
                    setting,
                    n,
                    gpu,
                    precision,
                    cl,
                    strategy,
                    sec,
                    grads,
                    rate,
                    single,
                    rate / single,
                    peak,
                    spec["iterations"] * sec / 3600,
                )
                rows.append(row)
                echo(
                    f"{setting:12s} n={n:3d} {precision:4s} {'NHWC' if cl else 'NCHW'} "
                    f"({strategy}): {sec:7.3f} s/round, {grads:5.0f} grads, {rate:8.0f} img/s "
                    f"= {rate / single:5.1%} of one model's {single:8.0f} img/s; "
                    f"{spec['iterations']} iterations in {row.projected_hours:6.2f} h"
                    + (f", peak {peak:.1f} GiB" if peak is not None else "")
                )
    if out is not None:
        write_rows(out / "bench_paper.csv", rows)
    return rows
