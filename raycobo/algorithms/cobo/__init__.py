"""CoBo: Collaborative Learning via Bilevel Optimization.

Hashemi, He, Jaggi, "CoBo: Collaborative Learning via Bilevel Optimization",
NeurIPS 2024, https://arxiv.org/abs/2409.05539 -- Algorithm 1.

Each round t:

1. client selection (Eq. 1 / Eq. 4): for every sampled pair (i, j), i != j,
   z_ij = (x_i + x_j) / 2 and
   w_ij <- Proj_D(w_ij + gamma * <g_i(z_ij), g_j(z_ij)>),
   with g_i, g_j stochastic gradients of f_i and f_j at z_ij, each on a fresh batch of
   that client's own data. D is the box [0, 1] (W symmetric, W^0 = 1) or, per row, the
   probability simplex over the other clients (W^0 uniform, w_ii = 0).
2. model training (Eq. 2 / Eq. 3), synchronous in the round-t models:
   x_i <- x_i - eta * (g_i(x_i) + rho * sum_k w_ik (x_i - x_k)).

The parts, one module each: ``score`` (Eq. 1's score of a pair), ``wstep`` (Eq. 1's
step on W, its schedule and fade), ``pull`` (Eq. 3), ``proposals`` (pairs scored
besides the sampler's: re-checks and a collaborator's collaborator), ``weights`` (W,
dense or sparse), ``rows`` (the
round on a host's rows), ``elastic`` (clients joining and leaving), ``method`` (the
round), ``settings`` (the keys and the presets ``paper``, ``authors`` and
``raycobo``).
"""

from raycobo.algorithms.cobo.method import CoBo, CoBoState
from raycobo.algorithms.cobo.pull import penalized_step, pull_weights
from raycobo.algorithms.cobo.rows import RowStep
from raycobo.algorithms.cobo.score import register_score
from raycobo.algorithms.cobo.settings import PRESETS, CoBoConfig, Sampling, register_preset
from raycobo.algorithms.cobo.sparse import SparseBoxWeights
from raycobo.algorithms.cobo.weights import initial_weights
from raycobo.algorithms.cobo.wstep import WStep, update_weight_rows, update_weights
from raycobo.algorithms.pairs import ALIGN_SALT_STRIDE, alignment_scores, pair_parts

__all__ = [
    "ALIGN_SALT_STRIDE",
    "PRESETS",
    "CoBo",
    "CoBoConfig",
    "CoBoState",
    "RowStep",
    "Sampling",
    "SparseBoxWeights",
    "WStep",
    "alignment_scores",
    "initial_weights",
    "pair_parts",
    "penalized_step",
    "pull_weights",
    "register_preset",
    "register_score",
    "update_weight_rows",
    "update_weights",
]
