"""Collaborative-learning algorithms as pure torch math over explicit state.

This package imports neither ray nor mlflow: engines (``raycobo.engine``) and tracking
(``raycobo.tracking``) live above it. Algorithms are chosen by name from ``ALGORITHMS``.
"""

from __future__ import annotations

from collections.abc import Callable

from raycobo.algorithms.base import Algorithm, ClientOps, Evaluation, evaluate
from raycobo.algorithms.cobo import CoBo
from raycobo.algorithms.countsketch import CountSketchFL
from raycobo.algorithms.ditto import Ditto
from raycobo.algorithms.fc import FederatedClustering
from raycobo.algorithms.fedavg import FedAvg, FedAvgFT
from raycobo.algorithms.federico import FedeRiCo
from raycobo.algorithms.fedsep import FedSep
from raycobo.algorithms.fedsep_hetero import FedSepHetero
from raycobo.algorithms.ifca import IFCA
from raycobo.algorithms.l2c import L2C, MetaL2C
from raycobo.algorithms.local import Local
from raycobo.algorithms.oracle import Oracle
from raycobo.algorithms.topk_ef import TopKEF
from raycobo.algorithms.validation import ValidationBased
from raycobo.config import AlgorithmConfig, choose

ALGORITHMS: dict[str, Callable[[AlgorithmConfig, int, int], Algorithm]] = {
    "cobo": CoBo,
    "local": Local,
    "fedavg": FedAvg,
    "fedavg_ft": FedAvgFT,
    "ditto": Ditto,
    "ifca": IFCA,
    "fc": FederatedClustering,
    "oracle": Oracle,
    "federico": FedeRiCo,
    "l2c": L2C,
    "meta_l2c": MetaL2C,
    "fedsep": FedSep,
    "topk_ef": TopKEF,
    "fedsep_hetero": FedSepHetero,
    "countsketch": CountSketchFL,
    "validation_based": ValidationBased,
}


def build_algorithm(cfg: AlgorithmConfig, rounds: int, seed: int) -> Algorithm:
    factory = choose(ALGORITHMS, cfg.name, "algorithm.name", "algorithm")
    return factory(cfg, rounds, seed)


__all__ = ["ALGORITHMS", "Algorithm", "ClientOps", "Evaluation", "build_algorithm", "evaluate"]
