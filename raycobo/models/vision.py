"""Convolutional models for 28x28 / 32x32 images and 1-D signals.

Parameter counts (10 classes unless noted):

- ``cnn`` on 1x28x28: 2 conv (32, 64 channels, 5x5) + FC 128: 454,922 parameters;
  on 3x32x32: 579,402.
- ``resnet9`` on 3x32x32, 100 classes (the CoBo paper's CIFAR-100 model): 6,619,300;
  10 classes: 6,573,130.
- ``fedavg_cnn`` on 1x28x28 (PFLlib's 4-layer ``FedAvgCNN``, the model of its benchmark
  table): 2 unpadded conv (32, 64 channels, 5x5) + FC 512: 582,026 parameters; on 3x32x32:
  878,538.
- ``cnn1d`` on mnist1d (1x40): 3 conv (25 channels) + FC: 5,210.
- ``mlp`` 784-64-10 (in ``raycobo.models``): 50,890.

ResNet-9 follows the DAWNBench design (prep 64 -> 128 + residual -> 256 -> 512 +
residual -> max-pool -> linear). Its normalisation is GroupNorm by default (``model.norm``):
BatchNorm keeps running statistics that a batched, per-client functional forward cannot
update, and per-client batch statistics over a 128-sample batch behave like GroupNorm's
anyway. ``model.norm: batch`` uses BatchNorm with batch statistics at train and test time.
"""

from __future__ import annotations

import torch
from torch import nn


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels, track_running_stats=False)
    if kind == "none":
        return nn.Identity()
    return nn.GroupNorm(min(32, channels // 4) or 1, channels)


class CNN(nn.Module):
    """conv(5x5, 32) - relu - pool - conv(5x5, 64) - relu - pool - fc 128 - fc C."""

    def __init__(self, in_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        c, h, w = in_shape
        self.conv1 = nn.Conv2d(c, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * (h // 4) * (w // 4), 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)  # (B, 32, H/2, W/2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)  # (B, 64, H/4, W/4)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class FedAvgCNN(nn.Module):
    """PFLlib's ``FedAvgCNN``: conv(5x5, 32, no padding) - relu - pool - conv(5x5, 64) -
    relu - pool - fc 512 - relu - fc C (1,024 features into fc 512 on 28x28 inputs)."""

    def __init__(self, in_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        c, h, w = in_shape
        self.conv1 = nn.Conv2d(c, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        side = lambda n: ((n - 4) // 2 - 4) // 2  # noqa: E731  (two valid 5x5 convs, two pools)
        self.fc1 = nn.Linear(64 * side(h) * side(w), 512)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(torch.relu(self.fc1(x.flatten(1))))


class CNN1d(nn.Module):
    """The mnist1d paper's small CNN: three 1-D convolutions and a linear layer."""

    def __init__(self, in_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        c, length = in_shape
        self.c1 = nn.Conv1d(c, 25, 5, stride=2, padding=1)
        self.c2 = nn.Conv1d(25, 25, 3, stride=2, padding=1)
        self.c3 = nn.Conv1d(25, 25, 3, stride=2, padding=1)
        out = length
        for k, s, p in ((5, 2, 1), (3, 2, 1), (3, 2, 1)):
            out = (out + 2 * p - k) // s + 1
        self.fc = nn.Linear(25 * out, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.relu(self.c3(x))
        return self.fc(x.flatten(1))


def _block(cin: int, cout: int, norm: str, pool: bool = False) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), _norm(norm, cout), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class ResNet9(nn.Module):
    def __init__(self, in_shape: tuple[int, ...], num_classes: int, norm: str = "group"):
        super().__init__()
        c = in_shape[0]
        self.prep = _block(c, 64, norm)
        self.layer1 = _block(64, 128, norm, pool=True)
        self.res1 = nn.Sequential(_block(128, 128, norm), _block(128, 128, norm))
        self.layer2 = _block(128, 256, norm, pool=True)
        self.layer3 = _block(256, 512, norm, pool=True)
        self.res3 = nn.Sequential(_block(512, 512, norm), _block(512, 512, norm))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.prep(x)
        x = self.layer1(x)
        x = x + self.res1(x)
        x = self.layer3(self.layer2(x))
        x = x + self.res3(x)
        x = torch.amax(x, dim=(2, 3))  # global max-pool (B, 512)
        return self.fc(x)
