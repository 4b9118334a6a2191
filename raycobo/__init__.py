"""raycobo: an experiment platform for collaborative (personalized federated) learning,
built around CoBo (Hashemi, He and Jaggi, NeurIPS 2024).

The Python API (``raycobo.api``)::

    import raycobo

    res = raycobo.run("examples/quickstart.yaml", rounds=200)      # -> raycobo.Result
    res.frame("history")                                           # pandas
    cmp = raycobo.compare("examples/quickstart.yaml", ["local", "cobo"], seeds=[0, 1])
    raycobo.resume(res.run_dir, rounds=400)
    raycobo.load_run(res.run_dir)

and the classes a plugin builds on: ``MethodConfig`` (a method's settings), the
``Algorithm`` protocol and ``ClientOps`` it runs on, ``Evaluation``, a round as plan ->
apply (``PlansRounds``, ``Plan``, the requests ``Gradients``, ``LocalSGD`` and
``PairScores``, ``run_plan``), a round on resident rows (``StepsInRows``,
``ScoresPairsInRows``), and ``RawDataset`` / ``FederatedData`` for data sets. Names load on first
use, so ``import raycobo`` is cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from raycobo.version import __version__ as __version__

_EXPORTS = {
    "run": "raycobo.api",
    "resume": "raycobo.api",
    "compare": "raycobo.api",
    "resume_compare": "raycobo.api",
    "resume_sweep": "raycobo.api",
    "sweep": "raycobo.api",
    "load_run": "raycobo.api",
    "load": "raycobo.api",
    "Comparison": "raycobo.api",
    "Result": "raycobo.lifecycle.result",
    "Config": "raycobo.config",
    "ConfigError": "raycobo.settings",
    "MethodConfig": "raycobo.algorithms.settings",
    "Algorithm": "raycobo.algorithms.base",
    "ClientOps": "raycobo.algorithms.base",
    "Evaluation": "raycobo.algorithms.base",
    "Gradients": "raycobo.algorithms.base",
    "LocalSGD": "raycobo.algorithms.base",
    "Plan": "raycobo.algorithms.base",
    "PlansRounds": "raycobo.algorithms.base",
    "StepsInRows": "raycobo.algorithms.base",
    "ScoresPairsInRows": "raycobo.algorithms.base",
    "PairScores": "raycobo.algorithms.pairs",
    "run_plan": "raycobo.algorithms.base",
    "RawDataset": "raycobo.data.base",
    "FederatedData": "raycobo.data.base",
}

__all__ = [
    "Algorithm",
    "ClientOps",
    "Comparison",
    "Config",
    "ConfigError",
    "Evaluation",
    "FederatedData",
    "Gradients",
    "LocalSGD",
    "MethodConfig",
    "PairScores",
    "Plan",
    "PlansRounds",
    "RawDataset",
    "Result",
    "ScoresPairsInRows",
    "StepsInRows",
    "compare",
    "load",
    "load_run",
    "resume",
    "resume_compare",
    "resume_sweep",
    "run",
    "run_plan",
    "sweep",
]

if TYPE_CHECKING:  # what type checkers and IDEs see
    from raycobo.algorithms.base import (
        Algorithm,
        ClientOps,
        Evaluation,
        Gradients,
        LocalSGD,
        Plan,
        PlansRounds,
        ScoresPairsInRows,
        StepsInRows,
        run_plan,
    )
    from raycobo.algorithms.pairs import PairScores
    from raycobo.algorithms.settings import MethodConfig
    from raycobo.api import (
        Comparison,
        compare,
        load,
        load_run,
        resume,
        resume_compare,
        resume_sweep,
        run,
        sweep,
    )
    from raycobo.config import Config
    from raycobo.data.base import FederatedData, RawDataset
    from raycobo.lifecycle.result import Result
    from raycobo.settings import ConfigError


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raycobo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
