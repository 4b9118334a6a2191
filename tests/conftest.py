"""Shared fixtures: tiny configs and problems small enough to check by hand."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
torch.set_num_threads(1)


@pytest.fixture
def quad_cfg():
    """A tiny quadratic config factory: quad_cfg(key=value, ...) -> Config."""
    from raycobo.config import load_config

    def make(*overrides: str):
        base = [
            "data.name=quadratic",
            "rounds=20",
            "eval_every=5",
            "tracking.enabled=false",
        ]
        return load_config(None, base + list(overrides))

    return make


@pytest.fixture
def digits_cfg():
    from raycobo.config import load_config
    from tests.helpers import DIGITS

    def make(*overrides: str):
        return load_config(None, DIGITS + list(overrides))

    return make
