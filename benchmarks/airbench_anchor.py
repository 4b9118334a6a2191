"""A second anchor for `raycobo bench paper`: airbench's CIFAR-10 trainer (Jordan 2024,
https://arxiv.org/abs/2404.00498; PyPI `airbench`, carried as a wheel), its images per
second on this GPU.

No data can be fetched on the GPU machine, so the run trains on random images of
CIFAR-10's shape written where airbench's loader looks first (`cifar10/train.pt` and
`test.pt`: uint8 images (N, 32, 32, 3), int64 labels, class names): the accuracy means
nothing, the speed is airbench's own. Prints one line: epochs, seconds, images/s.

Usage: python benchmarks/airbench_anchor.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def fake_cifar(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    classes = [f"class{k}" for k in range(10)]
    for name, n in (("train", 50_000), ("test", 10_000)):
        images = torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8, generator=g)
        labels = torch.randint(0, 10, (n,), generator=g)
        torch.save(
            {"images": images, "labels": labels, "classes": classes},
            os.path.join(folder, f"{name}.pt"),
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="airbench_run")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    os.chdir(args.dir)  # airbench reads ./cifar10
    fake_cifar("cifar10")
    import airbench

    if hasattr(airbench, "warmup94"):
        airbench.warmup94()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    airbench.train94(verbose=False)
    torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    epochs = airbench.lib_airbench94.hyp["opt"]["train_epochs"]
    print(
        f"airbench94 on {torch.cuda.get_device_name()}: {epochs} epochs of 50,000 images "
        f"in {sec:.2f} s = {epochs * 50_000 / sec:,.0f} images/s (fp16, channels-last)"
    )


if __name__ == "__main__":
    main()
