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

That is ``algorithm.rule: paper``. The default rule (``raycobo``, chosen on the regime
matrix of benchmarks/regimes, README "CoBo's defaults") changes three things, each a
setting of its own: the score is the cosine of g_i(z_ij) and g_j(z_ij) with a floor under
its denominator (``alignment: bounded``: <g_i, g_j> / max(||g_i|| ||g_j||, c S_0), S_0 the
clients' mean squared gradient norm at x^0 and c = ``cosine_floor``; while gradients are
large it is the cosine -- the same gamma whatever their scale -- and once training has
shrunk them it shrinks with them, as Eq. (1)'s inner product does, so that the late
negative scores of clients fitting their own few data do not erase what W learned early;
``alignment: cosine`` is the cosine alone), gamma shrinks with the samples a pair has
had (``gamma_decay``: W is learned early, and its late samples -- noisy, or negative once
the models fit their few data -- move it little), and the pull goes toward the
W-weighted mean of x_i and its collaborators (``pull: mean``: its strength does not
grow with the number of clients, and many small cross-cluster weights do not add up to
a pull of their own). Among its other keys (each documented on ``CoBoConfig``): W^0 = 0
between clients, a threshold below which a weight does not pull, re-checks of the pulled
pairs, and ``fade``: every round the weights below that threshold fall a little (the
threshold per expected sample of a pair, grown as n / 160 past 160 present clients, as a
row's pairs across the clusters grow with n: ``fade_clients``), so that what one early
sample gave a pair the pull never reads returns to 0 and W ends holding the
collaborators the pull reads.
A client that joins late has its pairs' W step restart its decay (``PairClock``), so it
finds its cluster against that fade as the first rounds' clients did. ``closure``
(each client with probability 0.1 a round) adds to a round's pairs some two pulled steps
apart (a collaborator's collaborator), so that a cluster's pairs whose few early samples
scored low are measured again while the scores still tell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Annotated, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from raycobo import rng
from raycobo.algorithms.base import (
    MODELS,
    Answer,
    ClientOps,
    Gradients,
    Plan,
    SharedPoints,
    cluster_agreement,
)
from raycobo.algorithms.common import FLOAT
from raycobo.algorithms.projections import project_box, project_simplex
from raycobo.algorithms.samplers import SAMPLINGS, EdgeSampler, floor_at
from raycobo.algorithms.settings import MethodConfig
from raycobo.algorithms.sparse_weights import SparseBoxWeights, fade_below
from raycobo.settings import ConfigError, Section

Sampling = Literal[tuple(SAMPLINGS)]  # the strategies samplers.py registers
Domain = Literal["box", "simplex"]


# The defaults of Eq. (1)'s score and step and of Eq. (2)'s pull, per ``algorithm.rule``.
# raycobo: chosen on the regime matrix's validation data (benchmarks/regimes, README
# "CoBo's defaults"); paper: Algorithm 1 as printed (inner product, constant gamma, the
# penalty summed over collaborators, W^0 = 1), gamma 0.01 as measured on the cross-device
# twin. pull_strength is the mean pull's lr * rho where rho is auto.
PULL_THRESHOLD = 0.5  # rule raycobo's: collaborators weighted below it do not pull
# alignment_batches: batch b > 0 of a pair's gradient is drawn with the pair's salt (the
# partner's global id) + b * ALIGN_SALT_STRIDE, a salt no partner id reaches
ALIGN_SALT_STRIDE = 1 << 24
ALIGN_BATCHES_MAX = 64
RULES: dict[str, dict[str, object]] = {
    "raycobo": {
        "alignment": "bounded",
        "gamma": 3.0,
        "gamma_decay": "sqrt",
        "pull": "mean",
        "pull_at": "stepped",
        "pull_strength": 0.5,
        "mixed_switch": 0.5,
        "cosine_floor": 0.3,
        "pull_threshold": PULL_THRESHOLD,
        "initial_weight": 0.0,
        "recheck": 0.02,
        "recheck_samples": 8.0,
        "sampling_samples": 12.0,
        "sampling_scale_max": 4.0,
        "entry_samples": 1,
        # each end's alignment gradient the mean of 2 minibatches (the fifteenth round:
        # the score's noise halved in variance for 2x the alignment's gradient work)
        "alignment_batches": 2,
        "sampling_start": 0.0,
        # weights below the threshold fall by fade * threshold * p_t every round, the same
        # all run long (the eighteenth round; a late joiner's pairs step on their own
        # clock, PairClock), at 1.0 and grown as n / 160 past 160 present clients, with
        # each client proposing a collaborator's collaborator with probability 0.1 a
        # round (the twenty-first round, chosen on validation by benchmarks/regimes/
        # choose.py: the only entry with >= 75 % of the gap and >= 0.9 of the whole W's
        # mass inside the clusters at 400 clients)
        "fade": 1.0,
        "fade_decay": "none",
        "fade_clients": 160,
        "closure": 0.1,
    },
    "paper": {
        "alignment": "inner",
        "gamma": 0.01,
        "gamma_decay": "none",
        "pull": "sum",
        "pull_at": "current",
        "pull_strength": 0.2,
        "mixed_switch": 0.5,
        "cosine_floor": 0.3,
        "pull_threshold": 0.0,
        "initial_weight": 1.0,
        "recheck": 0.0,
        "recheck_samples": 0.0,
        "sampling_samples": 0.0,
        "sampling_scale_max": 4.0,  # acts only where sampling_samples is set
        "entry_samples": 1,
        "alignment_batches": 1,
        "sampling_start": 0.0,
        "fade": 0.0,
        "fade_decay": "none",  # acts only with a fade (set by hand under this rule)
        "fade_clients": 0,
        "closure": 0.0,
    },
}
# keys that apply only where other keys have these values: written out (pinned, MLflow
# params) only there, refused elsewhere (they would do nothing)
ONLY_WITH: dict[str, dict[str, str]] = {
    "cosine_floor": {"alignment": "bounded"},
    "pull_threshold": {"domain": "box"},
    "initial_weight": {"domain": "box"},
    "recheck": {"domain": "box"},
    "recheck_unsettled": {"domain": "box"},
    "recheck_decay": {"domain": "box"},
    "recheck_samples": {"domain": "box"},
    "hold": {"domain": "box"},
    "entry_samples": {"domain": "box"},
    "fade": {"domain": "box"},
    "fade_decay": {"domain": "box"},
    "fade_clients": {"domain": "box"},
    "closure": {"domain": "box"},
    "pull_strength": {"pull": "mean", "rho": "auto", "domain": "box"},
}


def _needs_positive(info: ValidationInfo, key: str) -> None:
    """Refuse the key being validated where CoBo's ``key`` (set, else its rule's) is 0:
    it would do nothing."""
    have = info.data.get(key)
    if not (RULES[info.data.get("rule", "raycobo")][key] if have is None else have):
        raise ValueError(
            f"applies with algorithm.{key} > 0, not 0 (it would do nothing): drop it, "
            f"or set algorithm.{key}"
        )


def _needs_skipped_pairs(info: ValidationInfo) -> None:
    """Refuse the key being validated with ``sampling: full``: every pair is sampled every
    round, so it would do nothing."""
    if info.data.get("sampling") == "full":
        raise ValueError(
            "applies to a sampling that skips pairs, not full (every pair every round: it "
            "would do nothing): drop it"
        )


class SwitchAfter(Section):
    """mixed sampling's constant phase, as a number of samples of each pair (in
    expectation) instead of a share of the rounds."""

    samples: float = Field(gt=0, description="expected samples of a pair before the switch")


def unmet_condition(key: str, settings: dict, rule: str) -> tuple[str, str, object] | None:
    """The first of ``ONLY_WITH[key]``'s conditions that ``settings`` (CoBo's keys as a
    mapping; a null or missing key takes the rule's value, else the field's default)
    fails, as (field, wanted, value); None where the key applies."""
    for field, wanted in ONLY_WITH.get(key, {}).items():
        have = settings.get(field)
        if have is None:
            have = RULES[rule].get(field, CoBoConfig.model_fields[field].default)
        if have != wanted:
            return field, wanted, have
    return None


def _by_rule(key: str) -> str:
    return " (null: by algorithm.rule: raycobo {raycobo}, paper {paper})".format(
        **{r: RULES[r][key] for r in RULES}
    )


def _share(description: str):
    """A CoBo key in [0, 1], null by default (the rule's value, or off)."""
    return Field(default=None, ge=0, le=1, description=description)


class CoBoConfig(MethodConfig):
    """CoBo (Algorithm 1; Eq. 1-3)."""

    name: Literal["cobo"] = "cobo"
    rule: Literal["raycobo", "paper"] = Field(
        default="raycobo",
        description="the defaults of alignment, cosine_floor, gamma, gamma_decay, pull, "
        "pull_at, pull_strength, pull_threshold, initial_weight, recheck, recheck_samples, "
        "mixed_switch, sampling_samples, sampling_scale_max, sampling_start, entry_samples, "
        "fade, fade_decay, fade_clients, closure and alignment_batches: "
        "raycobo's (chosen on the regime matrix) or Algorithm 1 as printed",
    )
    # penalty strength; auto: pull mean: lr * rho = pull_strength (that share of the way to
    # the collaborators' weighted mean per step); pull sum: 0.3, lowered as 0.4 / (lr n)
    # where the box domain's W^0 = 1 would make the penalty step unstable (CoBo.penalty)
    rho: Annotated[float, Field(ge=0)] | Literal["auto"] = Field(
        default="auto", description="rho: strength of the pull toward collaborators"
    )
    gamma: float | None = Field(
        default=None, gt=0, description="gamma: W step size" + _by_rule("gamma")
    )
    alignment: Literal["inner", "cosine", "bounded"] | None = Field(
        default=None,
        description="Eq. (1)'s score: the inner product <g_i, g_j> (paper), its cosine "
        "(scale-free), or bounded: the cosine with a floor under its denominator (shrinks "
        "as the gradients do)" + _by_rule("alignment"),
    )
    alignment_batches: int | None = Field(
        default=None,
        ge=1,
        le=ALIGN_BATCHES_MAX,
        description="Eq. (1)'s gradients g_i(z_ij) and g_j(z_ij) each the mean over this "
        "many minibatches of the client's data (a larger batch for the inner problem: the "
        "score's sampling noise shrinks, the alignment's gradient work grows by the factor)"
        + _by_rule("alignment_batches"),
    )
    cosine_floor: float | None = Field(
        default=None,
        gt=0,
        description="alignment bounded: the cosine's denominator ||g_i|| ||g_j|| is never "
        "below this share of the clients' mean squared gradient norm at x^0"
        + _by_rule("cosine_floor"),
    )
    gamma_decay: Literal["none", "sqrt", "linear"] | None = Field(
        default=None,
        description="W step schedule: constant gamma (paper), gamma / sqrt(1 + k_t) or "
        "gamma / (1 + k_t), k_t the samples a pair has had in expectation before round t "
        "(a pair the pull reads counts recheck's: the sum of max(p_tau, recheck))"
        + _by_rule("gamma_decay"),
    )
    pull: Literal["sum", "mean"] | None = Field(
        default=None,
        description="Eq. (2)'s penalty: rho sum_j w_ij (x_i - x_j) (paper), or toward the "
        "W-weighted mean of x_i and its collaborators (rows divided by max(1, sum_j w_ij), "
        "w_ii = 1 in the box domain)" + _by_rule("pull"),
    )
    pull_at: Literal["current", "stepped"] | None = Field(
        default=None,
        description="where Eq. (3)'s pull acts: on the current models x^t, beside the "
        "gradient step (paper), or on the stepped models x^t - lr g (adapt then combine, "
        "as diffusion methods order it: the pull also averages the step's gradient noise)"
        + _by_rule("pull_at"),
    )
    sampling: Sampling = Field(default="mixed", description="edge sampling strategy")
    domain: Domain = Field(default="box", description="W's domain: box [0,1] or simplex rows")
    pull_strength: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="pull: mean with rho: auto (box domain): lr * rho, the share of the way "
        "to the collaborators' weighted mean a model moves per step" + _by_rule("pull_strength"),
    )
    initial_weight: float | None = _share(
        "box domain: W^0's entries between clients (w_ii = 1): 1 pulls every pair "
        "until it is measured misaligned (Algorithm 1), a value below pull_threshold only "
        "the pairs measured aligned" + _by_rule("initial_weight"),
    )
    pull_threshold: float | None = _share(
        "box domain: collaborators whose w_ij is below this are left out of "
        "Eq. (3)'s pull (many small cross-cluster weights add up to a large share of a "
        "row's pull)" + _by_rule("pull_threshold"),
    )
    recheck: float | None = _share(
        "box domain: each pair the pull reads (w_ij >= pull_threshold; > 0 "
        "without one) is sampled with at least this probability each round (drawn again "
        "where the sampling strategy's own p_t is lower), so that a pair that one early "
        "sample made a collaborator is measured again" + _by_rule("recheck"),
    )
    recheck_unsettled: float | None = _share(
        "box domain, with recheck: the rate of the pulled pairs whose w_ij is "
        "still inside the box (below 1: not yet settled by consistent scores); those at 1 "
        "keep recheck's rate (null: recheck's for all)",
    )
    recheck_decay: Literal["sqrt"] | None = Field(
        default=None,
        description="box domain, with recheck: sqrt raises the early rounds' rate to "
        "recheck * sqrt(rounds / (t + 1)) (at most 1; recheck's at the last round), so a "
        "pair pulled early is measured again while its scores are informative, and no "
        "more often late, when a cluster's pairs score about 0 (null: recheck's all along)",
    )
    recheck_samples: float | None = Field(
        default=None,
        ge=0,
        description="box domain, with recheck: where the sampling strategy alone samples "
        "a pair fewer than this many times over the run (S, in expectation, its own rates "
        "before sampling_samples), the pulled "
        "pairs' re-check rates are multiplied by this / S (at most 1), so that where the "
        "sampler sees each pair rarely (many clients, a short run) a pair wrongly pulled "
        "after one early sample is measured again sooner (0: recheck's rate whatever S)"
        + _by_rule("recheck_samples"),
    )
    entry_samples: int | None = Field(
        default=None,
        ge=1,
        description="box domain, with pull_threshold: the aligned samples a pair needs "
        "before the pull reads it: below the threshold a pair's weight rises by at most "
        "pull_threshold / entry_samples per W step (falls as Eq. (1) says), so that one "
        "noisy early score does not make a collaborator (1: no limit, as Algorithm 1)"
        + _by_rule("entry_samples"),
    )
    fade: float | None = Field(
        default=None,
        ge=0,
        description="box domain, with pull_threshold: each round every weight below the "
        "threshold (and above 0) falls by fade * pull_threshold * p_t, p_t a pair's "
        "sampling rate that round, decayed as gamma is (gamma_decay), whether or not the "
        "pair is sampled: below the threshold a pair drifts as if it scored "
        "-fade * pull_threshold / gamma at each of its expected samples, so a weight that "
        "one early sample left below the threshold, and the pull does not read, returns "
        "to 0, while a pair whose scores stay above that still climbs (0: weights below "
        "the threshold stay as learned)" + _by_rule("fade"),
    )
    fade_decay: Literal["gamma", "none"] | None = Field(
        default=None,
        description="with fade: its loss the same at each expected sample (none: stronger "
        "late, when the W step is small, so that what early samples left below the "
        "threshold returns to 0 within the run; a pair below the threshold needs ever "
        "larger scores to climb, except a late joiner's, whose pairs step on their own "
        "clock) or decayed as gamma is (gamma: the drift below the threshold weighs the "
        "same against a pair's steps all run long, and leaves more of W outside the "
        "clusters)" + _by_rule("fade_decay"),
    )
    fade_clients: int | None = Field(
        default=None,
        ge=0,
        description="with fade: past this many present clients n the fade grows as "
        "n / fade_clients (a row's pairs across the clusters, and so the residue their "
        "small late gains leave below the threshold, grow as n, and that residue falls as "
        "1 / fade: the share of a row's weight the residue holds stays as it is at this "
        "many clients; 0: the same fade at every n)" + _by_rule("fade_clients"),
    )
    closure: float | None = _share(
        "box domain, with pull_threshold: each round each present client with a "
        "collaborator the pull reads proposes, with this probability, one client two such "
        "steps away (a collaborator's collaborator, each step uniform among the pulled "
        "pairs), and that pair is sampled too where the pull does not read it yet: a "
        "cluster's pairs whose few early samples scored low are measured again while "
        "scores still tell (at most one extra pair per client a round; 0: off)"
        + _by_rule("closure"),
    )
    hold: float | None = _share(
        "box domain: the score of a pair the pull reads is raised by this in "
        "Eq. (1) (hysteresis: a collaborator is dropped on evidence that it is not aligned, "
        "not on re-samples whose scores lie about 0; null: 0)",
    )
    weights: Literal["auto", "dense", "sparse"] = Field(
        default="auto",
        description="W storage: dense n x n, or (box) W^0 + the sampled entries; auto: sparse "
        "above 2,048 clients",
    )
    sampling_c: float = Field(default=2.0, gt=0, description="constant: p = c/n")
    time_c: float = Field(default=1.0, gt=0, description="time: p_t = min(1, c/t)")
    mixed_switch: Annotated[float, Field(ge=0, le=1)] | SwitchAfter | None = Field(
        default=None,
        description="mixed, mixed_sqrt: the constant phase, a share of the rounds or "
        "{samples: K} (until each pair has had K samples in expectation, whatever the run's "
        "length)" + _by_rule("mixed_switch"),
    )
    sampling_samples: float | None = Field(
        default=None,
        ge=0,
        description="where the sampling strategy samples a pair fewer than this many times "
        "over the run (S, in expectation: many clients, a short run), its p_t are all "
        "multiplied by this / S, at most sampling_scale_max (0: the strategy's rates)"
        + _by_rule("sampling_samples"),
    )
    sampling_start: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="the first share of the rounds samples no pair (W stays W^0, and no "
        "recheck draws), so the models move apart from x^0 before any pair is scored; "
        "the strategy's rates, its samples S and the W step's decay count the rounds "
        "after it (measured on the regime matrix, it loses: a cluster's own pairs also "
        "score high only early)" + _by_rule("sampling_start"),
    )
    sampling_scale_max: float | None = Field(
        default=None,
        ge=1,
        description="with sampling_samples: the most its factor raises the strategy's "
        "rates, so that a round's pairs stay O(n)" + _by_rule("sampling_scale_max"),
    )
    # the authors' code (github epfml/CoBo, personalized-vision-models) where it differs
    # from Algorithm 1; the defaults are the paper's
    momentum: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="beta of the model step's gradient average m <- beta m + (1-beta) g "
        "(the authors' code: 0.9; paper: 0)",
    )
    init: Literal["shared", "independent"] = Field(
        default="shared",
        description="x_i^0: one shared x^0 (paper) or each client its own (authors' code)",
    )
    order: Literal["weights_first", "models_first"] = Field(
        default="weights_first",
        description="W from x^t then x^{t+1} with it (Algorithm 1), or the model step "
        "first and W at the new models' midpoints (authors' code)",
    )

    @field_validator(
        "cosine_floor",
        "pull_threshold",
        "initial_weight",
        "pull_strength",
        "recheck",
        "recheck_unsettled",
        "recheck_decay",
        "recheck_samples",
        "hold",
        "entry_samples",
        "fade",
        "fade_decay",
        "fade_clients",
        "closure",
    )
    @classmethod
    def _applies(cls, value: float | None, info: ValidationInfo) -> float | None:
        """A key of ``ONLY_WITH`` set where it would do nothing is refused."""
        if value is None:
            return value
        unmet = unmet_condition(info.field_name, info.data, info.data.get("rule", "raycobo"))
        if unmet is not None:
            field, wanted, have = unmet
            raise ValueError(
                f"applies to {field}: {wanted}, not {have} (it would do nothing): drop it"
                + (f", or set algorithm.{field}={wanted}" if field != "domain" else "")
            )
        if info.field_name in ("recheck_unsettled", "recheck_decay", "recheck_samples"):
            _needs_positive(info, "recheck")
        if info.field_name == "entry_samples" and value > 1:
            _needs_positive(info, "pull_threshold")
        if info.field_name in ("fade", "closure") and value > 0:
            _needs_positive(info, "pull_threshold")
        if info.field_name == "closure" and value > 0:
            _needs_skipped_pairs(info)
        if info.field_name == "fade_decay" or (info.field_name == "fade_clients" and value):
            _needs_positive(info, "fade")
        return value

    @field_validator("sampling_samples", "sampling_scale_max")
    @classmethod
    def _raises_sampling(cls, value: float | None, info: ValidationInfo) -> float | None:
        """sampling_samples with every pair sampled every round, or its cap without it,
        would do nothing: refused."""
        if value is None:
            return value
        if info.field_name == "sampling_samples":
            if value:
                _needs_skipped_pairs(info)
            return value
        _needs_positive(info, "sampling_samples")
        return value

    def effective(self) -> dict:
        """The settings with the rule's values where a key is null (a key of one
        alignment or domain only with that alignment or domain)."""
        out = self.model_dump(mode="json")
        for key, value in RULES[self.rule].items():
            if out[key] is None:
                out[key] = value
        for key, conditions in ONLY_WITH.items():
            if any(out[field] != value for field, value in conditions.items()):
                out[key] = None
        if not out["recheck"]:  # re-check rates' settings, without re-checks
            out["recheck_samples"] = None
        if out["sampling"] == "full":  # every pair every round: nothing to scale
            out["sampling_samples"] = None
        if not out["sampling_samples"]:  # the factor's cap, without the factor
            out["sampling_scale_max"] = None
        if not out["pull_threshold"]:  # nothing below a threshold of 0 to fade or close
            out["fade"] = None
            out["closure"] = None
        if out["sampling"] == "full":  # every pair every round: nothing to propose
            out["closure"] = None
        if not out["fade"]:  # the fade's schedule and growth, without a fade
            out["fade_decay"] = None
            out["fade_clients"] = None
        return out

    def collaboration_cut(self) -> float | None:
        """The box domain's ``pull_threshold`` (the rule's where null): Eq. (3) leaves W's
        entries below it out of the pull. None: no threshold (or the simplex domain)."""
        return pull_cut(RuleView(self))


def pull_cut(view: CoBoConfig | RuleView) -> float | None:
    """The pull's threshold on w_ij as ``view`` gives the settings (None: none)."""
    cut = float(view.pull_threshold or 0.0) if view.domain == "box" else 0.0
    return cut or None


class RuleView:
    """The settings as CoBo reads them: a null key of ``RULES`` takes its rule's value."""

    def __init__(self, cfg: CoBoConfig):
        object.__setattr__(self, "_cfg", cfg)

    def __getattr__(self, key: str):
        if key.startswith("_"):  # _cfg before it is set (unpickling), dunder look-ups
            raise AttributeError(key)
        value = getattr(self._cfg, key)
        if value is None and key in RULES["paper"]:
            return RULES[self._cfg.rule][key]
        return value


DENSE_EXPORT_LIMIT = 4096
# rho auto = AUTO_RHO_SCALE / (lr n) at large n: 1.0 (a one-step contraction) left W
# within clusters fading on the cross-device twin; 0.4 kept it (FIDELITY.md)
AUTO_RHO_SCALE = 0.4


@dataclass
class RoundPlan:
    edges: torch.Tensor  # (E, 2) sampled pairs, i < j
    align_clients: torch.Tensor  # (2E,) i-endpoints then j-endpoints
    # (2E, d) their midpoints z_ij [then (m, d) the members' x_i], or SharedPoints
    points: torch.Tensor | SharedPoints
    align_salts: torch.Tensor  # (2E,)
    members: torch.Tensor  # (n_present,) clients taking the model step
    # the alignment rows pair by pair (i, j for each minibatch: ``SharedPoints``' order)
    # instead of all i-endpoints, then all j, for each minibatch
    by_pair: bool = False

    @property
    def align_points(self) -> torch.Tensor:
        return self.points[: self.align_clients.numel()]


@dataclass
class CoBoState:
    X: torch.Tensor  # (n, d) personal models x_i
    W: torch.Tensor | SparseBoxWeights  # (n, n) collaboration weights w_ij
    active: torch.Tensor | None = None  # (n,) bool: clients in the system (None: all)
    M: torch.Tensor | None = None  # (n, d) the model step's gradient average (momentum)
    # alignment bounded: the mean squared norm of the clients' gradients at x^0, ()
    scale: torch.Tensor | None = None
    # (n,) int64: the round before which each client last joined (0: from the start;
    # None: no client has joined since) -- each pair's own clock (``PairClock``)
    joined: torch.Tensor | None = None


def initial_weights(
    n: int, domain: str, device: torch.device | None = None, value: float = 1.0
) -> torch.Tensor:
    """W^0. box: ``value`` between clients (Algorithm 1's Input: 1), 1 on the diagonal;
    simplex: each row uniform over the other clients."""
    if domain == "box":
        W = torch.full((n, n), float(value), device=device)
        return W.fill_diagonal_(1.0)
    W = torch.full((n, n), 1.0 / max(n - 1, 1), device=device)  # uniform over the others
    W.fill_diagonal_(0.0)
    return W


def _decay(k: torch.Tensor | float, kind: str):
    """gamma_decay's divisor after k expected samples: sqrt(1 + k) or 1 + k."""
    if kind == "sqrt":
        return torch.sqrt(1.0 + k) if isinstance(k, torch.Tensor) else math.sqrt(1.0 + k)
    return 1.0 + k


@dataclass(frozen=True)
class PairClock:
    """gamma_decay counted on each pair's own clock where clients joined late: a pair's
    k_t is the expected samples it has had since the later of its two clients (last)
    joined, so a newcomer's pairs step as a pair does at the start of a run (the round's
    gamma, from the run's k_t, times ``boost``), not with the small gamma of a pair
    sampled for hundreds of rounds. The recheck's pulled-pair step is raised by the same
    ratio."""

    now: float  # k_t: the expected samples before this round since the run started
    born: torch.Tensor  # (n,) the expected samples before each client's (last) join
    kind: str  # gamma_decay: "sqrt" or "linear"

    def boost(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """(E,) the pairs (i, j)'s gamma over the round's: decay(k_t) / decay(k_t - b),
        b the pair's expected samples before its later client joined (1 for a pair
        present from the start)."""
        born = self.born.to(i.device)
        since = (self.now - torch.maximum(born[i], born[j])).clamp_min(0.0)
        return _decay(self.now, self.kind) / _decay(since, self.kind)


@dataclass(frozen=True)
class WStep:
    """Eq. (1)'s step in one round: ``gamma``, and ``pulled`` for the pairs the pull
    reads (w_ij >= ``cut``; > 0 with no cut), which ``recheck`` samples more often than
    the sampler does (``CoBo.w_step``), their scores raised by ``hold``; ``pulled``
    None: ``gamma`` for every pair. ``rise``: the most a pair below ``cut`` gains in one
    step (``entry_samples``; None: no limit). ``clock``: pairs whose clients joined late
    step on their own clock (``PairClock``; None: every pair on the run's)."""

    gamma: float
    pulled: float | None = None
    cut: float = 0.0
    hold: float = 0.0
    rise: float | None = None
    clock: PairClock | None = None

    def move(
        self, current: torch.Tensor, scores: torch.Tensor, i: torch.Tensor, j: torch.Tensor
    ) -> torch.Tensor:
        """Each sampled pair (i, j)'s change before the projection, from its weight
        before the step and its score."""
        if self.pulled is None:
            move = self.gamma * scores
        else:
            read = current.ge(self.cut) if self.cut > 0 else current.gt(0)
            step = torch.where(
                read, current.new_tensor(self.pulled), current.new_tensor(self.gamma)
            )
            if self.hold:
                scores = torch.where(read, scores + self.hold, scores)
            move = step * scores
        if self.clock is not None:
            move = move * self.clock.boost(i, j).to(move.dtype)
        if self.rise is None:
            return move
        return torch.where(current.lt(self.cut), move.clamp_max(self.rise), move)


def update_weights(
    W: torch.Tensor, edges: torch.Tensor, scores: torch.Tensor, gamma: float | WStep, domain: str
) -> torch.Tensor:
    """Projected gradient ascent step on the sampled entries (Eq. 1).

    W: (n, n); edges: (E, 2) with i < j; scores: (E,) = <g_i(z_ij), g_j(z_ij)>."""
    if edges.numel() == 0:
        return W
    if isinstance(W, SparseBoxWeights):
        i, j = edges[:, 0], edges[:, 1]
        current = W.get(i, j)
        move = _w_step(gamma).move(current, scores.to(W.vals.dtype), i, j)
        return W.update(i, j, project_box(current + move))
    rows = torch.arange(W.shape[0], device=W.device)
    return update_weight_rows(W, rows, edges, scores, gamma, domain)


def update_weight_rows(
    W_rows: torch.Tensor,
    row_ids: torch.Tensor,
    edges: torch.Tensor,
    scores: torch.Tensor,
    gamma: float | WStep,
    domain: str,
) -> torch.Tensor:
    """Eq. (1) on some rows of W: ``W_rows`` (r, n) are the rows ``row_ids`` (r,), as a
    host holding those clients keeps them. Every row gets the numbers that updating the
    whole W would give it (``update_weights`` is this with all rows). Edges that touch
    none of the rows are ignored."""
    gamma = _w_step(gamma)
    n = W_rows.shape[1]
    pos = torch.full((n,), -1, dtype=torch.int64, device=W_rows.device)
    pos[row_ids] = torch.arange(row_ids.numel(), device=W_rows.device)
    i, j = edges[:, 0].to(W_rows.device), edges[:, 1].to(W_rows.device)
    pi, pj = pos[i], pos[j]
    a, b = pi >= 0, pj >= 0  # the edge's row w_i. / w_j. is held here
    scores = scores.to(W_rows.device, W_rows.dtype)  # (E,)
    W = W_rows.clone()
    if domain == "box":  # W stays symmetric: w_ij = w_ji, updated together
        current = torch.where(a, W[pi.clamp_min(0), j], W[pj.clamp_min(0), i])
        w = project_box(current + gamma.move(current, scores, i, j))
        W[pi[a], j[a]] = w[a]
        W[pj[b], i[b]] = w[b]
        return W
    step = gamma.gamma * scores  # the simplex domain has no pulled-pair step
    if gamma.clock is not None:
        step = step * gamma.clock.boost(i, j).to(step.dtype)
    W[pi[a], j[a]] += step[a]
    W[pj[b], i[b]] += step[b]
    touched = torch.unique(torch.cat([pi[a], pj[b]]))
    mask = torch.ones(touched.numel(), n, dtype=torch.bool, device=W.device)
    mask[torch.arange(touched.numel(), device=W.device), row_ids[touched]] = False  # w_ii
    W[touched] = project_simplex(W[touched], mask)
    return W


def _w_step(gamma: float | WStep) -> WStep:
    return gamma if isinstance(gamma, WStep) else WStep(float(gamma))


def penalty(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """sum_k w_ik (x_i - x_k) for every i: (diag(W 1) - W) X. X: (n, d), W: (n, n)."""
    return W.sum(dim=1, keepdim=True) * X - W @ X


def mean_rows(W: torch.Tensor) -> torch.Tensor:
    """W's rows divided by max(1, their sum): the pull toward the W-weighted mean of x_i
    and its collaborators (``pull: mean``; the box domain's w_ii = 1 counts, so a client
    whose collaborators' weights have faded is pulled little); rows of mass below 1
    (the simplex domain's) are left as they are."""
    return W / W.sum(dim=1, keepdim=True).clamp_min(1.0)


def pull_weights(W: torch.Tensor, pull: str, threshold: float = 0.0) -> torch.Tensor:
    """The weights Eq. (3) pulls with: W's entries below ``threshold`` set to 0 (the
    box domain's weak edges), then, for ``pull='mean'``, its rows divided by max(1, their
    sum). W: dense rows (m, n) or SparseBoxWeights (sparse: the thresholding only; the
    mean pull's scaling is applied by ``penalized_step``)."""
    if threshold > 0:
        if isinstance(W, SparseBoxWeights):
            return W.thresholded(threshold)
        W = torch.where(W.ge(threshold), W, torch.zeros((), dtype=W.dtype, device=W.device))
    if pull == "mean" and not isinstance(W, SparseBoxWeights):
        return mean_rows(W)
    return W


def weights_at(W: torch.Tensor | SparseBoxWeights, i: torch.Tensor, j: torch.Tensor):
    """w_ij for each pair (i[p], j[p]) of a dense or sparse W, on the CPU."""
    return (W.get(i, j) if isinstance(W, SparseBoxWeights) else W[i, j]).cpu()


def fade_weights(W: torch.Tensor | SparseBoxWeights, cut: float, amount: float):
    """W (dense rows, or sparse) with every entry in (0, ``cut``) lowered by ``amount``,
    at least 0 (``fade``: the weights the pull does not read decay; those at or above the
    cut, the diagonal among them, and those at 0 stay)."""
    if amount <= 0 or cut <= 0:
        return W
    if isinstance(W, SparseBoxWeights):
        return W.faded(cut, amount)
    return fade_below(W, cut, amount)


def pulled_pairs(
    W: torch.Tensor | SparseBoxWeights, threshold: float, active: torch.Tensor | None = None
) -> torch.Tensor:
    """The pairs (P, 2), i < j, sorted, that Eq. (3)'s pull reads (the nonzero entries of
    ``pull_weights``: w_ij >= ``threshold``, > 0 with none), both clients present
    (``active``)."""
    read = pull_weights(W, "sum", threshold)
    if not isinstance(read, SparseBoxWeights):
        pairs = torch.nonzero(torch.triu(read, diagonal=1))
    elif read.base == 0:
        pairs = read.nonzero_pairs()
    else:  # every pair never sampled is pulled too
        raise ConfigError(
            f"invalid config key 'algorithm.recheck': with a sparse W every pair at W^0 "
            f"({read.base:g}) is pulled, so all n^2 / 2 would be re-sampled; set "
            "algorithm.initial_weight below algorithm.pull_threshold, or recheck: 0 "
            "(and closure: 0)"
        )
    if active is not None:
        present = active.to(pairs.device)
        pairs = pairs[present[pairs[:, 0]] & present[pairs[:, 1]]]
    return pairs


def stepped_models(X: torch.Tensor, G: torch.Tensor, lr: float) -> torch.Tensor:
    """y = x - lr g: the models the pull acts on with ``pull_at: stepped``."""
    return torch.add(X, G, alpha=-lr)


def penalized_step(
    X: torch.Tensor,
    G: torch.Tensor,
    W: torch.Tensor,
    lr: float,
    rho: float,
    pull: str = "sum",
    threshold: float = 0.0,
    at: str = "current",
) -> torch.Tensor:
    """Eq. (3) in three passes over (n, d):
    X - lr (G + rho (diag(W 1) - W) X) = (1 - lr rho deg) X + lr rho W X - lr G.
    ``pull='mean'``: the same with W's rows divided by max(1, their sum); ``threshold``:
    W's entries below it count as 0 (``pull_weights``); ``at='stepped'``: the pull acts
    on Y = X - lr G instead of X (adapt then combine): (1 - lr rho deg) Y + lr rho W Y."""
    W = pull_weights(W, pull, threshold)
    if at == "stepped":
        X, G = stepped_models(X, G, lr), None
    if isinstance(W, SparseBoxWeights):
        deg = W.degree()[:, None].to(X.dtype)
        scale = 1.0 / deg.clamp_min(1.0) if pull == "mean" else torch.ones_like(deg)
        keep = 1.0 - lr * rho * deg * scale
        out = (X * keep).add_(W.matmul(X) * scale, alpha=lr * rho)
        return out if G is None else out.add_(G, alpha=-lr)
    return penalized_rows(X, X, G, W, lr, rho)


def penalized_rows(
    X_rows: torch.Tensor,
    X_all: torch.Tensor,
    G: torch.Tensor | None,
    W_rows: torch.Tensor,
    lr: float,
    rho: float,
) -> torch.Tensor:
    """Eq. (3) for some clients: X_rows (m, d) with their W rows (m, n) over all models
    X_all (n, d) -- what a host holding those clients computes (G None: the pull alone,
    of models already stepped)."""
    return penalized_rows_blocks(X_rows, G, W_rows, [(slice(None), X_all)], lr, rho)


def penalized_rows_blocks(
    X_rows: torch.Tensor,
    G: torch.Tensor | None,
    W_rows: torch.Tensor,
    blocks: list[tuple[torch.Tensor | slice, torch.Tensor]],
    lr: float,
    rho: float,
) -> torch.Tensor:
    """Eq. (3) for some clients when the other models come in blocks (cols, X_block):
    x_i (1 - lr rho sum_k w_ik) + lr rho sum_k w_ik x_k - lr g_i, the sum over the
    blocks' columns only (a resident host reads just the hosts its clients weigh; the
    columns left out must have w_ik = 0 there; G None: no gradient term)."""
    keep = 1.0 - lr * rho * W_rows.sum(dim=1, keepdim=True)  # (m, 1)
    out = X_rows * keep
    for cols, Xb in blocks:
        add_weighted(out, W_rows[:, cols].to(Xb.dtype), Xb, lr * rho)
    return out if G is None else out.add_(G, alpha=-lr)


# a block of pull weights with at most this share of nonzero entries is multiplied as a
# sparse matrix: with W^0 = 0 and the threshold a row holds about its cluster's clients
SPARSE_PULL_SHARE = 0.1


def add_weighted(out: torch.Tensor, W: torch.Tensor, X: torch.Tensor, alpha: float) -> None:
    """out += alpha * W @ X, W (m, k) dense; as a sparse product where at most
    ``SPARSE_PULL_SHARE`` of W's entries are nonzero (the product's cost then follows the
    nonzeros, not m * k), skipped where none are."""
    nonzero = int(torch.count_nonzero(W))
    if nonzero == 0:
        return
    if nonzero > SPARSE_PULL_SHARE * W.numel() or W.device.type != "cpu":
        out.addmm_(W, X, alpha=alpha)
        return
    out.add_(torch.sparse.mm(W.to_sparse(), X), alpha=alpha)


def alignment_scores(
    G_i: torch.Tensor, G_j: torch.Tensor, kind: str = "inner", floor: float = 0.0
) -> torch.Tensor:
    """The inner problem's signal for each sampled pair: <g_i(z_ij), g_j(z_ij)> (Eq. 1),
    or with ``kind='cosine'`` that product over ||g_i|| ||g_j|| (in [-1, 1]: every pair
    moves by at most gamma, whatever the gradients' scale), or with ``kind='bounded'``
    over max(||g_i|| ||g_j||, floor) (also in [-1, 1]; below the floor it is the inner
    product in units of the floor). G_i, G_j: (E, d) -> (E,)"""
    dot = torch.linalg.vecdot(G_i, G_j)
    if kind in ("cosine", "bounded"):
        norms = torch.linalg.vector_norm(G_i, dim=1) * torch.linalg.vector_norm(G_j, dim=1)
        return dot / norms.clamp_min(max(floor, 1e-12))
    return dot


def midpoints(
    X: torch.Tensor, i: torch.Tensor, j: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """z_ij = (x_i + x_j) / 2 for each sampled pair, (E, d) (into ``out`` if given)."""
    mid = torch.index_select(X, 0, i, out=out) if out is not None else X.index_select(0, i)
    return mid.add_(X.index_select(0, j)).mul_(0.5)


def pair_requests(
    X: torch.Tensor, edges: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The alignment requests of ``edges`` (E, 2) as shared points: their midpoints (E,
    d), each asked 2k times pair by pair (i then j, for each of the k minibatches), with
    those rows' clients and salts (2kE,) (each end's draw salted by its partner)."""
    i, j = edges[:, 0], edges[:, 1]
    ends = torch.stack([i, j], dim=1)  # (E, 2)
    clients = ends.repeat(1, k).flatten()  # (E 2k,): i, j, i, j, ...
    salts = batch_salts(ends.flip(1).flatten(), k).view(k, -1, 2).transpose(0, 1).flatten()
    return midpoints(X, i, j), clients, salts


def pair_parts(E: int, per: int) -> list[tuple[int, int]]:
    """[a, b) ranges over E pairs of ``per`` pairs each (at least 2), the last taking a
    single leftover pair: no part but a lone pair's own has one pair (a reduction over
    one row splits its sum between threads, over several it does not)."""
    per = max(2, per)
    bounds = list(range(0, E, per)) + [E]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def batch_salts(salts: torch.Tensor, k: int) -> torch.Tensor:
    """The salts of ``k`` minibatches per alignment gradient (``alignment_batches``):
    batch 0 keeps the pair's own salt (k = 1 draws what Algorithm 1's round draws), batch
    b adds b * ALIGN_SALT_STRIDE. (m,) -> (k m,), batch-major."""
    if k == 1:
        return salts
    if salts.numel() and int(salts.max()) >= ALIGN_SALT_STRIDE:
        raise ValueError(
            f"algorithm.alignment_batches > 1 supports fewer than {ALIGN_SALT_STRIDE:,} clients"
        )
    return torch.cat([salts + b * ALIGN_SALT_STRIDE for b in range(k)])


def mean_of_batches(G: torch.Tensor, k: int) -> torch.Tensor:
    """The alignment gradients of ``k`` batch-major minibatch groups, averaged: (k m, d)
    -> (m, d) (``G`` itself for k = 1)."""
    if k == 1:
        return G
    return mean_over(G.view(k, G.shape[0] // k, G.shape[1]), 0)


def mean_over(G: torch.Tensor, dim: int) -> torch.Tensor:
    """``G.mean(dim)``, its floats; over two entries one addition and a halving: torch's
    mean sums from 0 (0 + a + b is the float a + b, but for the sign of an exact zero)
    and divides by the count, so this is its value without its output's zero fill and
    strided reduction (a pass over the alignment gradients, tested)."""
    if G.shape[dim] != 2:
        return G.mean(dim=dim)
    return torch.add(G.select(dim, 0), G.select(dim, 1)).div_(2)


@dataclass(frozen=True)
class RowStep:
    """Round t's CoBo on some clients' rows: what a host that keeps its clients' models
    and W rows computes (the Ray engine's resident hosts), from the gradients and the
    other hosts' models it reads. Built by ``CoBo.row_step``; the equations are those
    of ``CoBo.round``, restricted to rows."""

    lr: float
    rho: float
    w_step: WStep  # Eq. (1)'s step this round
    domain: str
    alignment: str
    floor: float  # the bounded cosine's least denominator
    pull: str
    threshold: float  # the pull's threshold on w_ij
    at: str  # where the pull acts: "current" models x^t or "stepped" x^t - lr g
    batches: int = 1  # the minibatches each alignment gradient averages
    fade: float = 0.0  # what each weight below the threshold loses this round (``fade``)

    @staticmethod
    def midpoints(X_own: torch.Tensor, X_partners: torch.Tensor) -> torch.Tensor:
        """z_ij = (x_i + x_j) / 2, where the pair's alignment gradients are taken."""
        return 0.5 * (X_own + X_partners)

    def align_requests(
        self, clients: torch.Tensor, Z: torch.Tensor, salts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows of a gradient request for these alignment gradients: each repeated
        for every minibatch it averages (``mean_of_batches`` of the answer)."""
        k = self.batches
        if k == 1:
            return clients, Z, salts
        return clients.repeat(k), Z.repeat(k, 1), batch_salts(salts, k)

    def align_mean(self, G: torch.Tensor) -> torch.Tensor:
        """The answer to ``align_requests``' rows: one gradient per alignment row."""
        return mean_of_batches(G, self.batches)

    def stepped(
        self, X: torch.Tensor, members: torch.Tensor, G: torch.Tensor
    ) -> torch.Tensor | None:
        """The models the pull acts on where it acts on the stepped ones (x - lr g for
        the clients stepping, x for the others; None: it acts on x^t)."""
        if self.at != "stepped":
            return None
        Y = X.clone()
        Y[members] = stepped_models(X[members], G, self.lr)
        return Y

    def faded(self, W_rows: torch.Tensor) -> torch.Tensor:
        """The rows after the round's fade (``CoBo.faded``), before Eq. (1)."""
        return fade_weights(W_rows, self.threshold, self.fade)

    def update_w(
        self, W_rows: torch.Tensor, ids: torch.Tensor, edges, G_i, G_j
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. (1) on the rows ``ids`` from the pairs' alignment gradients. -> (the new
        rows, the pairs' scores)"""
        scores = alignment_scores(G_i, G_j, self.alignment, self.floor)
        return update_weight_rows(W_rows, ids, edges, scores, self.w_step, self.domain), scores

    def step(self, X_rows, G, Y_rows, W_rows, blocks) -> torch.Tensor:
        """Eq. (3) for some clients with their W rows over the models in ``blocks``
        ((cols, models) of the hosts read: x^t, or the stepped models ``Y_rows`` and
        the other hosts' where the pull acts on those)."""
        W_rows = pull_weights(W_rows, self.pull, self.threshold)
        if Y_rows is not None:  # the pull alone, on the stepped models
            return penalized_rows_blocks(Y_rows, None, W_rows, blocks, self.lr, self.rho)
        return penalized_rows_blocks(X_rows, G, W_rows, blocks, self.lr, self.rho)


class CoBo:
    name = "cobo"

    def __init__(self, cfg: CoBoConfig, rounds: int, seed: int):
        self.cfg = RuleView(cfg)
        self.rounds = rounds
        self.seed = seed

    def penalty(self, n: int) -> float:
        """rho for n clients. Eq. (2) sums rho * w_ij (x_i - x_j) over all j, and with the
        box domain's W^0 = 1 the penalty step alone is x <- (I - lr rho L) x with L the
        complete graph's Laplacian (eigenvalue n): it diverges once lr * rho * n >= 2.
        ``auto`` keeps the paper's rho = 0.3 for small n and lowers it to 0.4 / (lr n) (a
        contraction to 60 % per step, without oscillation) as n grows; the simplex
        domain's rows sum to 1, so there rho needs no scaling. An explicit rho beyond the
        bound is refused."""
        c = self.cfg
        if c.domain == "simplex":
            return 0.3 if c.rho == "auto" else float(c.rho)
        if c.pull == "mean":  # rows of mass >= 1 sum to 1: the step contracts by lr rho
            if c.rho == "auto":
                return c.pull_strength / c.lr
            if c.lr * c.rho >= 1.0:
                raise ConfigError(
                    f"invalid config key 'algorithm.rho': algorithm.lr * algorithm.rho = "
                    f"{c.lr * c.rho:.3g} >= 1 overshoots the collaborators' mean "
                    "(pull: mean); lower them, or use rho: auto"
                )
            return float(c.rho)
        if c.rho == "auto":
            return min(0.3, AUTO_RHO_SCALE / (c.lr * max(n, 1)))
        if c.lr * c.rho * n >= 2.0:
            raise ConfigError(
                f"invalid config key 'algorithm.rho': algorithm.lr * algorithm.rho * n = "
                f"{c.lr:g} * {c.rho:g} * {n} = {c.lr * c.rho * n:.3g} >= 2, so the penalty "
                "step diverges while W = 1 (box domain); lower them, or use rho: auto "
                f"(here {min(0.3, AUTO_RHO_SCALE / (c.lr * n)):.3g})"
            )
        return float(c.rho)

    def gamma_at(self, t: int, n: int, floor: float | tuple[float, int] = 0.0) -> float:
        """Round t's W step: gamma, divided by sqrt(1 + k_t) or 1 + k_t (gamma_decay;
        k_t = the samples a pair has had in expectation before round t among n present
        clients, counting a sampling rate of at least ``floor``), so that W is learned
        early and its late samples, noisy once the models fit their data, move it
        little."""
        c = self.cfg
        if c.gamma_decay == "none":
            return c.gamma
        return c.gamma / _decay(self.sampler(n).expected_samples(t, floor), c.gamma_decay)

    def w_step(self, t: int, n: int) -> WStep:
        """Round t's Eq. (1) step: ``gamma_at``, and where ``recheck`` samples the pairs
        the pull reads more often than the sampler, their decay counts those samples
        too (k_t = sum over tau < t of max(p_tau, recheck), as if pulled all along), so
        that the late re-samples of a cluster's pairs, whose scores are then about 0,
        move their weights as little as a pair sampled that often should."""
        c = self.cfg
        gamma = self.gamma_at(t, n)
        hold = float(c.hold or 0.0)
        cut, rise = self.threshold(), self.entry_rise()
        if c.gamma_decay == "none" or c.domain != "box" or not c.recheck:
            if hold:
                return WStep(gamma, gamma, cut, hold, rise)
            return WStep(gamma, cut=cut, rise=rise)  # the cut acts only with a rise
        pulled = min(gamma, self.gamma_at(t, n, self.recheck_floor(n)))
        # where the sampler's rate was never below recheck, the same step
        if pulled >= gamma and not hold:
            return WStep(gamma, cut=cut, rise=rise)  # the cut acts only with a rise
        return WStep(gamma, pulled, cut, hold, rise)

    def pair_clock(self, state: CoBoState, t: int) -> PairClock | None:
        """Round t's clocks of the pairs whose later client joined after the start
        (``PairClock``); None where every pair's is the run's (no late joiner, or gamma
        not decayed)."""
        c = self.cfg
        if state.joined is None or c.gamma_decay == "none" or not bool(state.joined.gt(0).any()):
            return None
        sampler = self.sampler(self.present(state))
        rounds = state.joined.cpu()
        born = torch.zeros(rounds.shape, dtype=torch.float64)
        for r in torch.unique(rounds).tolist():  # the few rounds clients joined at
            born[rounds == r] = sampler.expected_samples(int(r))
        return PairClock(sampler.expected_samples(t), born, c.gamma_decay)

    def step_in(self, state: CoBoState, t: int) -> WStep:
        """Round t's Eq. (1) step for ``state``'s pairs: ``w_step`` on each pair's clock."""
        step = self.w_step(t, self.present(state))
        clock = self.pair_clock(state, t)
        return step if clock is None else replace(step, clock=clock)

    def entry_rise(self) -> float | None:
        """``entry_samples`` k > 1 as the most a pair below the pull's threshold gains in
        one W step: just above threshold / k, so that k steps at it reach the threshold
        in float32 (None: no limit)."""
        k = int(self.cfg.entry_samples or 1)
        cut = self.threshold()
        if k <= 1 or cut <= 0:
            return None
        return cut / k * (1.0 + 1e-5)

    def fade_at(self, t: int, n: int) -> float:
        """What each weight below the pull's threshold loses in round t among n present
        clients: ``fade`` * threshold * p_t (0 without fade or threshold). With
        ``fade_decay: none`` (rule raycobo's) the same all run long: a pair below the
        threshold climbs where its mean score exceeds fade * threshold / gamma_t, more as
        gamma_t shrinks, so what early samples left there returns to 0 within the run
        (a late joiner's pairs step with their own clock's gamma, ``PairClock``); with
        ``gamma``, decayed as the W step is (``gamma_at`` / gamma): the same bar, fade *
        threshold / gamma, all run long. Past ``fade_clients`` present clients the fade
        grows as n / fade_clients (a row's pairs across the clusters grow as n)."""
        c = self.cfg
        fade, cut = float(c.fade or 0.0), self.threshold()
        if not fade or cut <= 0 or c.domain != "box":
            return 0.0
        if c.fade_clients and n > c.fade_clients:
            fade *= n / c.fade_clients
        decay = 1.0 if c.fade_decay == "none" else self.gamma_at(t, n) / c.gamma
        return fade * cut * self.sampler(n).probability(t) * decay

    def faded(self, state: CoBoState, t: int) -> CoBoState:
        """W^t after round t's fade, which comes first in the round's W step (Eq. 1
        then acts on the faded weights), whether or not the round samples a pair."""
        amount = self.fade_at(t, self.present(state))
        if not amount:
            return state
        return replace(state, W=fade_weights(state.W, self.threshold(), amount))

    def rows_refusal(self) -> str | None:
        """Why these settings cannot step in rows on hosts (None: they can): a host
        keeps dense W rows, steps without momentum from one shared x^0, W first."""
        c = self.cfg
        plain = (
            c.weights != "sparse"
            and c.momentum == 0
            and c.init == "shared"
            and c.order == "weights_first"
        )
        if plain:
            return None
        return (
            "host-resident models run cobo with a dense W (algorithm.weights), no "
            "momentum, init shared and order weights_first"
        )

    def row_step(self, t: int, state: CoBoState) -> RowStep:
        """Round t's settings for hosts that each keep some clients' rows."""
        c = self.cfg
        return RowStep(
            c.lr,
            self.penalty(state.X.shape[0]),
            self.step_in(state, t),
            c.domain,
            c.alignment,
            self.floor(state),
            c.pull,
            self.threshold(),
            c.pull_at,
            int(c.alignment_batches),
            self.fade_at(t, self.present(state)),
        )

    def rows_start(self, ops: ClientOps) -> tuple[torch.Tensor, dict]:
        """W^0 for hosts that keep the rows (dense), and the bounded cosine's unit."""
        self.penalty(ops.n_clients)  # an unstable explicit rho stops here
        X0 = ops.initial_params().expand(ops.n_clients, -1)
        W = initial_weights(ops.n_clients, self.cfg.domain, value=self.cfg.initial_weight)
        return W, {"scale": self.initial_scale(ops, X0)}

    def rows_state(self, W: torch.Tensor, active: torch.Tensor | None, extras: dict) -> CoBoState:
        """W and membership as a CoBoState (the models stay in the hosts)."""
        return CoBoState(
            torch.empty(W.shape[0], 0),
            W,
            active,
            scale=extras.get("scale"),
            joined=extras.get("joined"),
        )

    @staticmethod
    def rows_extras(state: CoBoState) -> dict:
        """The extras of ``rows_state`` that ``state`` holds (after a join: the pairs'
        clocks)."""
        out = {"scale": state.scale}
        if state.joined is not None:
            out["joined"] = state.joined
        return out

    def rows_read(self, W: torch.Tensor) -> torch.Tensor:
        """The entries Eq. (3) reads: w_ij > 0 and at least the pull's threshold."""
        return pull_weights(W, "sum", self.threshold()).gt(0)

    def updates_whole_rows(self) -> bool:
        return self.cfg.domain == "simplex"  # a projected row can turn any entry > 0

    def sampler(self, n: int) -> EdgeSampler:
        return EdgeSampler.for_cobo(self.cfg, n, self.rounds, self.seed)

    def init(self, ops: ClientOps) -> CoBoState:
        n, c = ops.n_clients, self.cfg
        if c.init == "independent":  # the authors' code: every client its own model
            X = torch.stack([ops.random_params(salt=i) for i in range(n)])
        else:
            X = ops.initial_params().expand(n, -1).clone()  # x_i^0 = x^0 (Algorithm 1)
        self.penalty(n)  # an explicit rho beyond the stability bound stops here
        sparse = self.sparse_w(n)
        if sparse and c.domain != "box":
            raise ConfigError(
                "invalid config key 'algorithm.weights': sparse W needs algorithm.domain=box "
                "(a simplex projection rewrites whole rows)"
            )
        return CoBoState(X, self.initial_w(n, X.device), scale=self.initial_scale(ops, X))

    def initial_w(self, n: int, device: torch.device | None = None):
        """W^0 for n clients: dense, or sparse where ``weights`` asks for it."""
        c = self.cfg
        if self.sparse_w(n):
            return SparseBoxWeights.initial(n, c.initial_weight, device)
        return initial_weights(n, c.domain, device, c.initial_weight)

    def state_bytes(self, n: int, d: int) -> dict[str, int]:
        """x_i, their gradients and the next x_i (and the momentum's average), and a dense
        W (n x n) where ``weights`` makes one."""
        c = self.cfg
        out = {MODELS: 4 * n * d * 3}
        if c.momentum > 0:
            out["the momentum's averages (algorithm.momentum=0)"] = 4 * n * d
        if not self.sparse_w(n):
            out["a dense W (algorithm.weights=sparse)"] = 4 * n * n * 2
        return out

    def sparse_w(self, n: int) -> bool:
        """Whether W is kept sparse for n clients (``weights``; auto: above 2,048, box)."""
        c = self.cfg
        return c.weights == "sparse" or (c.weights == "auto" and n > 2048 and c.domain == "box")

    def initial_scale(self, ops: ClientOps, X: torch.Tensor) -> torch.Tensor | None:
        """alignment bounded: the clients' mean squared gradient norm at x^0 (one
        gradient each, on a minibatch of stream INIT), the unit of the cosine's floor."""
        if self.cfg.alignment != "bounded":
            return None
        G, _ = ops.grads(torch.arange(X.shape[0], device=X.device), X, 0, rng.INIT, 0)
        return G.square().sum(dim=1).mean().detach()

    def sample_edges(
        self, active: torch.Tensor | None, t: int, n_clients: int, device=None, W=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Round t's sampled pairs among the present clients (global ids, i < j, sorted),
        and the present clients (who take the model step); with ``W`` (W^t) and
        ``recheck``, the pairs the pull reads are re-sampled too (``with_rechecks``).
        -> (edges (E, 2), members (m,))"""
        ids = None if active is None else torch.nonzero(active).flatten()
        n = n_clients if ids is None else ids.numel()  # clients in the system
        edges = self.sampler(n).sample(t).to(device)  # (E, 2), among the present
        members = torch.arange(n_clients, device=device) if ids is None else ids.to(device)
        if ids is not None:
            edges = members[edges]  # global ids, still i < j
        if W is not None:
            edges = self.with_rechecks(edges, W, active, t, n)
        return edges, members

    def recheck_rate(self, t: int, n: int, unsettled: bool = False) -> float:
        """The probability that a pulled pair is drawn again in round t besides the
        sampler's own draw (p_t among n present clients): (r - p_t) / (1 - p_t), so that
        it is sampled with probability r = ``recheck`` in all (``recheck_unsettled`` for
        a pair whose w_ij is below 1, where set); 0 where p_t is already at least r,
        and without recheck (or off the box domain)."""
        c, sampler = self.cfg, self.sampler(n)
        if c.domain != "box" or not c.recheck or t < sampler.start_round():
            return 0.0
        r = c.recheck_unsettled if unsettled and c.recheck_unsettled is not None else c.recheck
        r = self.recheck_at(self.scaled_recheck(float(r), n), t)
        p = sampler.probability(t)
        return max(0.0, (r - p) / (1.0 - p)) if p < 1 else 0.0

    def recheck_at(self, rate: float, t: int) -> float:
        """A recheck rate at round t: as set, or with ``recheck_decay: sqrt`` raised to
        rate * sqrt(rounds / (t + 1)), at most 1."""
        if self.cfg.recheck_decay != "sqrt":
            return rate
        return floor_at((rate, self.rounds), t)

    def recheck_scale(self, n: int) -> float:
        """``recheck_samples`` K over S, the samples of a pair the sampling strategy
        alone expects in the run among n clients (its own rates, before
        ``sampling_samples`` scales them), where S < K (1 elsewhere, and without the key)."""
        return self.sampler(n).strategy().shortfall(float(self.cfg.recheck_samples or 0.0))

    def scaled_recheck(self, rate: float, n: int) -> float:
        """A re-check rate among n clients raised by ``recheck_scale``, at most 1."""
        return min(1.0, rate * self.recheck_scale(n))

    def recheck_floor(self, n: int) -> float | tuple[float, int]:
        """The sampling rate a pulled pair has at least among n clients, for the W step's
        k_t: recheck (scaled by ``recheck_scale``), or (that, rounds) where it decays
        (``samplers.expected_samples``)."""
        rate = self.scaled_recheck(float(self.cfg.recheck), n)
        return (rate, self.rounds) if self.cfg.recheck_decay == "sqrt" else rate

    def samples_from_w(self, t: int, n: int) -> bool:
        """Whether round t's pairs among n present clients depend on W^t (``recheck``
        above the sampler's own rate, or ``closure``): an engine must then sample round t only once
        round t - 1's W is known."""
        rechecks = max(self.recheck_rate(t, n), self.recheck_rate(t, n, unsettled=True))
        return rechecks > 0 or self.closure_rate(t, n) > 0

    def closure_rate(self, t: int, n: int) -> float:
        """The probability that a present client proposes a collaborator's collaborator
        in round t (``closure``; 0 off the box domain, without a threshold, with every
        pair sampled every round, or before the sampler's first round)."""
        c = self.cfg
        if c.domain != "box" or not c.closure or not self.threshold() or c.sampling == "full":
            return 0.0
        return 0.0 if t < self.sampler(n).start_round() else float(c.closure)

    def closure_pairs(self, W, pairs: torch.Tensor, t: int, n: int) -> torch.Tensor:
        """Round t's ``closure`` proposals: each client i with a pulled pair (``pairs``,
        the pairs the pull reads among the present clients, on the CPU), with
        probability ``closure_rate``, picks a pulled partner j uniformly, then j's
        pulled partner k uniformly (draws seeded by (seed, round), one triple per
        client of W whoever is present); the pair (i, k) is kept where k != i and the
        pull does not read it yet. -> (C, 2), i < j (possibly repeated)"""
        rate = self.closure_rate(t, n)
        if rate <= 0 or pairs.numel() == 0:
            return pairs.new_zeros((0, 2))
        size = W.shape[0]
        src = torch.cat([pairs[:, 0], pairs[:, 1]])
        dst = torch.cat([pairs[:, 1], pairs[:, 0]])
        order = torch.argsort(src * size + dst)  # each client's partners, ascending
        src, dst = src[order], dst[order]
        degree = torch.bincount(src, minlength=size)
        first = torch.cumsum(degree, 0) - degree
        draw = torch.rand(size, 3, generator=rng.generator(self.seed, rng.CLOSURE, t))
        who = torch.nonzero(draw[:, 0].lt(rate) & degree.gt(0)).flatten()

        def partner(of: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            d = degree[of]
            return dst[first[of] + (u * d).long().clamp_max(d - 1)]

        mid = partner(who, draw[who, 1])
        far = partner(mid, draw[who, 2])
        keep = far.ne(who)
        i, k = who[keep], far[keep]
        unread = weights_at(W, i, k).lt(self.threshold())
        i, k = i[unread], k[unread]
        return torch.stack([torch.minimum(i, k), torch.maximum(i, k)], dim=1)

    def with_rechecks(
        self, edges: torch.Tensor, W, active: torch.Tensor | None, t: int, n: int
    ) -> torch.Tensor:
        """``edges`` and, each with probability ``recheck_rate`` (seeded by (seed,
        round)), the pairs the pull reads in W^t: a pair that one early sample (say,
        while the models still shared x^0) made a collaborator is measured again, and
        Eq. (1) takes it back out if it is not aligned; with ``closure``, the pairs two
        pulled steps apart that ``closure_pairs`` proposes. -> (E', 2), i < j, sorted,
        distinct"""
        rate = self.recheck_rate(t, n)
        loose = self.recheck_rate(t, n, unsettled=True)
        if max(rate, loose) <= 0 and self.closure_rate(t, n) <= 0:
            return edges
        size = W.shape[0]
        pairs = pulled_pairs(W, self.threshold(), active).cpu()
        if pairs.numel() == 0:
            return edges
        chosen = self.closure_pairs(W, pairs, t, n)
        if max(rate, loose) > 0:  # the re-checks' own draw (closure alone: none)
            draw = torch.rand(pairs.shape[0], generator=rng.generator(self.seed, rng.RECHECK, t))
            rates = rate
            if loose != rate:  # the pairs whose weight is still inside the box
                rates = torch.where(weights_at(W, pairs[:, 0], pairs[:, 1]) < 1, loose, rate)
            chosen = torch.cat([pairs[draw < rates], chosen])
        keys = torch.cat(
            [
                edges[:, 0] * size + edges[:, 1],
                (chosen[:, 0] * size + chosen[:, 1]).to(edges.device),
            ]
        )
        keys = torch.unique(keys)  # sorted: the order of the sampler's own edges
        return torch.stack([keys // size, keys % size], dim=1)

    def plan(
        self, state: CoBoState, t: int, ops: ClientOps, with_models: bool = False
    ) -> RoundPlan:
        """The requests of round t: the sampled edges (among the present clients) with
        their midpoints, and the clients that take the model step. ``with_models``: the
        members' models follow the midpoints in ``points`` (one request for the round),
        written into one buffer instead of gathered and concatenated; for ops that set
        ``shares_points``, as ``SharedPoints`` instead (``_shared_plan``)."""
        X = state.X
        edges, members = self.sample_edges(state.active, t, ops.n_clients, X.device, state.W)
        i, j = edges[:, 0], edges[:, 1]
        E, k = i.numel(), int(self.cfg.alignment_batches)
        if with_models and getattr(ops, "shares_points", False):
            return self._shared_plan(state, edges, members)
        A = 2 * E * k  # alignment rows: k minibatches of both endpoints
        Z = X.new_empty(A + (members.numel() if with_models else 0), X.shape[1])
        mid = midpoints(X, i, j, out=Z[:E])
        # both endpoints' gradients at z_ij, each on a fresh batch of its own client's
        # data (salted by the partner, so the pair's draws differ from the step's)
        Z[E : 2 * E].copy_(mid)
        for b in range(1, k):  # the further minibatches of alignment_batches
            Z[2 * E * b : 2 * E * (b + 1)].copy_(Z[: 2 * E])
        if with_models and state.active is None:
            Z[A:].copy_(X)
        elif with_models:
            torch.index_select(X, 0, members, out=Z[A:])
        salts = batch_salts(torch.cat([j, i]), k)
        return RoundPlan(edges, torch.cat([i, j]).repeat(k), Z, salts, members)

    def _shared_plan(self, state: CoBoState, edges, members) -> RoundPlan:
        """``plan(with_models=True)`` for ops that take ``SharedPoints``: each midpoint once,
        asked 2k times pair by pair (i then j, for each of the k minibatches), then the
        members' models once each; the rows draw what ``plan``'s rows draw (the same
        clients, streams and salts, in another order)."""
        k = int(self.cfg.alignment_batches)
        mid, clients, salts = pair_requests(state.X, edges, k)
        models = state.X if state.active is None else state.X.index_select(0, members)
        points = SharedPoints(((mid, 2 * k), (models, 1)))
        return RoundPlan(edges, clients, points, salts, members, by_pair=True)

    def _round_in_parts(
        self, state: CoBoState, t: int, ops: ClientOps, edges, members
    ) -> tuple[CoBoState, dict]:
        """``round`` for ops that take ``SharedPoints`` when its one request would exceed
        ``ops.request_rows`` rows: the alignment gradients asked for a part of
        the pairs at a time, each part reduced to its pairs' scores before the next
        (memory: one part's gradients, not the round's 2kE rows of d floats), then the
        model step's. The same numbers as one request: each row's gradient and each
        pair's score do not depend on the rows beside it (parts of at least two pairs,
        the layout of a reduction over several rows; tested)."""
        X, k = state.X, int(self.cfg.alignment_batches)
        state = self.faded(state, t)
        scores = []
        for a, b in pair_parts(edges.shape[0], ops.request_rows // (2 * k)):
            mid, clients, salts = pair_requests(X, edges[a:b], k)
            G, _ = ops.grads(clients, SharedPoints(((mid, 2 * k),)), t, rng.ALIGN, salts)
            scores.append(self.pair_scores(state, G, b - a, by_pair=True))
            del G, mid
        if scores:  # Eq. (1)
            state = self.apply_scores(state, edges, torch.cat(scores), t)
        models = X if state.active is None else X.index_select(0, members)
        G, L = ops.grads(members, SharedPoints(((models, 1),)), t, rng.STEP, 0)
        state = self.step(state, members, G)  # Eq. (3), W^{t+1} and x^t
        return state, self.stats(L, edges.shape[0], members, state, X.shape[1])

    def apply_alignment(
        self, state: CoBoState, edges, G_align: torch.Tensor, t: int, by_pair: bool = False
    ) -> CoBoState:
        """Eq. (1) from round t's alignment gradients (rows: all i-endpoints, then all j;
        with ``alignment_batches`` k, k such groups, averaged here; ``by_pair``: the rows
        of ``SharedPoints``' order, i and j pair by pair for each minibatch)."""
        E = edges.shape[0]
        if E == 0:
            return state
        return self.apply_scores(state, edges, self.pair_scores(state, G_align, E, by_pair), t)

    def pair_scores(
        self, state: CoBoState, G_align: torch.Tensor, E: int, by_pair: bool = False
    ) -> torch.Tensor:
        """The E pairs' alignment scores from their gradient rows (``apply_alignment``'s
        layouts), (E,)."""
        k = int(self.cfg.alignment_batches)
        if by_pair:  # (E, k, 2, d): the minibatches' mean of each end, as mean_of_batches
            G = G_align.view(E, k, 2, -1)
            G = G[:, 0] if k == 1 else mean_over(G, 1)  # (E, 2, d)
            G_i, G_j = G[:, 0], G[:, 1]
        else:
            G_align = mean_of_batches(G_align, k)
            G_i, G_j = G_align[:E], G_align[E:]
        return alignment_scores(G_i, G_j, self.cfg.alignment, self.floor(state))

    def apply_scores(self, state: CoBoState, edges, scores: torch.Tensor, t: int) -> CoBoState:
        """Eq. (1) from round t's scores of the sampled pairs."""
        step = self.step_in(state, t)
        return replace(state, W=update_weights(state.W, edges, scores, step, self.cfg.domain))

    def step(self, state: CoBoState, members: torch.Tensor, G: torch.Tensor) -> CoBoState:
        """Eq. (3) for the present clients, with the current W and x^t (``pull_at``
        stepped: the pull acts on x^t - lr g, after the gradient step). With
        ``momentum`` beta > 0 (the authors' code) the gradient is replaced by its running
        average m <- beta m + (1 - beta) g (m = g at the first step); the penalty is not
        averaged."""
        c = self.cfg
        X, W, M = state.X, state.W, state.M
        rho = self.penalty(state.X.shape[0])
        if c.momentum > 0:
            if M is None:
                M = torch.zeros_like(X)
                M[members] = G
            else:
                M = M.clone()
                M[members] = c.momentum * M[members] + (1 - c.momentum) * G
            G = M[members]
        cut = self.threshold()
        if state.active is None:
            X = penalized_step(X, G, W, c.lr, rho, c.pull, cut, c.pull_at)
        else:  # only the present clients step, pulled only toward each other
            X = X.clone()
            sub = W[members][:, members]
            X[members] = penalized_step(X[members], G, sub, c.lr, rho, c.pull, cut, c.pull_at)
        return replace(state, X=X, W=W, M=M)

    def pull_reads(self, state: CoBoState, members: torch.Tensor) -> int:
        """The collaborators Eq. (3) reads with ``state``'s W: ordered pairs (i, j), i a
        present client and j another (present) one, whose w_ij is not 0 and clears the
        pull's threshold -- each one model sent to i."""
        cut = pull_cut(self.cfg)
        W = state.W
        if isinstance(W, SparseBoxWeights):
            return int(W.read_per_row(cut)[members].sum())
        ok = W.ne(0) & W.ge(cut) if cut is not None else W.ne(0)
        ok = ok & ~torch.eye(W.shape[0], dtype=torch.bool, device=W.device)
        rows = ok.index_select(0, members)
        if state.active is not None:  # pulled only toward each other
            rows = rows.index_select(1, members)
        return int(rows.sum())

    def threshold(self) -> float:
        """The pull's threshold on w_ij (box domain; 0: every collaborator counts)."""
        return pull_cut(self.cfg) or 0.0

    def floor(self, state: CoBoState) -> float:
        """alignment bounded: the least denominator of the cosine (0 otherwise)."""
        if self.cfg.alignment != "bounded" or state.scale is None:
            return 0.0
        return self.cfg.cosine_floor * float(state.scale)

    @staticmethod
    def present(state: CoBoState) -> int:
        return state.X.shape[0] if state.active is None else int(state.active.sum())

    def round(self, state: CoBoState, t: int, ops: ClientOps) -> tuple[CoBoState, dict]:
        if self.cfg.order == "models_first":
            return self._models_first(state, t, ops)
        if getattr(ops, "shares_points", False) and getattr(ops, "request_rows", None):
            X, k = state.X, int(self.cfg.alignment_batches)
            edges, members = self.sample_edges(state.active, t, ops.n_clients, X.device, state.W)
            if 2 * k * edges.shape[0] + members.numel() > ops.request_rows:
                return self._round_in_parts(state, t, ops, edges, members)
            p = self._shared_plan(state, edges, members)
        else:
            p = self.plan(state, t, ops, with_models=True)
        E, n, A = p.edges.shape[0], p.members.numel(), p.align_clients.numel()
        # One engine request for the whole round (fewer round trips on remote engines):
        # rows [0, A) are the alignment gradients (A = 2E, times alignment_batches), rows
        # [A, A + n) are g_i at x_i^t.
        dev = state.X.device
        clients = torch.cat([p.align_clients, p.members])
        salts = torch.cat([p.align_salts, torch.zeros(n, dtype=torch.int64, device=dev)])
        streams = torch.cat([torch.full((A,), rng.ALIGN), torch.full((n,), rng.STEP)])
        G_all, L_all = ops.grads(clients, p.points, t, streams.to(dev), salts)
        state = self.faded(state, t)
        state = self.apply_alignment(state, p.edges, G_all[:A], t, p.by_pair)  # Eq. (1)
        state = self.step(state, p.members, G_all[A:])  # Eq. (3), W^{t+1} and x^t
        return state, self.stats(L_all[A:], E, p.members, state, state.X.shape[1])

    def _models_first(self, state: CoBoState, t: int, ops: ClientOps) -> tuple[CoBoState, dict]:
        """The authors' order: x^{t+1} from x^t with W^t (Eq. 3), then W^{t+1} from the
        gradients at the midpoints of the new models (Eq. 1); two engine requests."""
        members = self.sample_edges(state.active, t, ops.n_clients, state.X.device)[1]
        G, L = ops.grads(members, state.X[members], t, rng.STEP, 0)
        stepped = self.step(state, members, G)
        state = self.faded(stepped, t)
        p = self.plan(state, t, ops)  # the same edges: sampling depends on (seed, t) only
        E = p.edges.shape[0]
        if E:
            G_align, _ = ops.grads(p.align_clients, p.align_points, t, rng.ALIGN, p.align_salts)
            state = self.apply_alignment(state, p.edges, G_align, t)
        return state, self.stats(L, E, members, stepped, state.X.shape[1])

    # -- the round as plan -> apply (PlansRounds: alignment results may arrive late) -----
    def plan_refusal(self) -> str | None:
        if self.cfg.order == "weights_first":
            return None
        return (
            "late alignment results need algorithm.order=weights_first (the models_first "
            "order waits for each round's W)"
        )

    def plan_round(self, state: CoBoState, t: int, ops: ClientOps) -> Plan:
        """Round t's requests: the alignment gradients ahead (Eq. 1 may take them late),
        the model step's gradients at x^t now."""
        p = self.plan(state, t, ops)
        ahead = None
        if p.edges.shape[0]:
            ahead = Gradients(p.align_clients, p.align_points, rng.ALIGN, p.align_salts)
        now = Gradients(p.members, state.X[p.members], rng.STEP, 0)
        return Plan(t, ahead, now, {"edges": p.edges, "members": p.members})

    def apply_round(
        self,
        state: CoBoState,
        plan: Plan,
        now: Answer | None,
        arrived: list[tuple[Plan, Answer]],
    ) -> tuple[CoBoState, dict]:
        """This round's fade, Eq. (1) from each arrived round's alignment gradients (at
        its own round's gamma), then Eq. (3) with this round's model-step gradients."""
        state = self.faded(state, plan.round)
        applied = 0
        for p, (G_align, _) in arrived:
            state = self.apply_alignment(state, p.keep["edges"], G_align, p.round)
            applied += p.keep["edges"].shape[0]
        assert now is not None
        members = plan.keep["members"]
        state = self.step(state, members, now[0])
        E, d = plan.keep["edges"].shape[0], state.X.shape[1]
        stats = self.stats(now[1], E, members, state, d)
        stats["alignments_applied"] = float(applied)
        return state, stats

    def stats(
        self, step_loss: torch.Tensor, E: int, members: torch.Tensor, read: CoBoState, d: int
    ) -> dict[str, float]:
        """A round's statistics; ``read``: the state whose W the round's pull read. Its
        communication (float32 numbers of d-dimensional models): for each of the E scored
        pairs the two models to form the midpoint, one end's midpoint gradient to the
        other and the score back, 3d + 1; for the pull, one model per collaborator read
        (:meth:`pull_reads`)."""
        reads = self.pull_reads(read, members)
        return {
            "train_loss": float(step_loss.mean()),
            "edges": float(E),
            "alignment_grads": float(2 * E * self.cfg.alignment_batches),
            "clients": float(members.numel()),
            "pull_reads": float(reads),
            "bytes_sent": float(FLOAT * (E * (3 * d + 1) + reads * d)),
        }

    # -- elasticity (CoBo Section 2: clients join and leave between rounds) ---------------
    def _check_elastic(self, state: CoBoState) -> None:
        if isinstance(state.W, SparseBoxWeights):
            raise ConfigError(
                "invalid config key 'algorithm.weights': clients joining or leaving need a "
                "dense W (set algorithm.weights=dense)"
            )

    def leave(self, state: CoBoState, clients: list[int]) -> CoBoState:
        """Clients leave: they stop training and collaborating; their models and W
        entries are kept (a returning client resumes its model; with ``fade`` its weights
        below the pull's threshold fade while it is away, as every other's do)."""
        self._check_elastic(state)
        active = _active(state.active, state.X.shape[0], state.X.device)
        active[torch.as_tensor(clients, device=active.device)] = False
        return replace(state, active=active)

    def join(self, state: CoBoState, clients: list[int], t: int) -> CoBoState:
        """Clients join before round t: their W row and column restart at W^0 (box:
        ``initial_weight``, w_ii = 1; simplex: uniform over the present others, and the
        others' rows give them weight 0 until sampled), and their pairs' W step restarts
        its decay (``PairClock``: a newcomer's pairs are learned as the first rounds'
        are)."""
        self._check_elastic(state)
        n = state.X.shape[0]
        active = _active(state.active, n, state.X.device)
        new = torch.as_tensor(clients, device=active.device)
        active[new] = True
        joined = state.joined
        joined = torch.zeros(n, dtype=torch.int64) if joined is None else joined.clone()
        joined[new.cpu()] = int(t)
        W = state.W.clone()
        if self.cfg.domain == "box":
            W[new, :] = self.cfg.initial_weight
            W[:, new] = self.cfg.initial_weight
            W[new, new] = 1.0
        else:
            others = active.clone()
            W[new, :] = 0.0
            W[:, new] = 0.0
            for k in new.tolist():
                others[k] = False
                W[k, others] = 1.0 / max(int(others.sum()), 1)
                others[k] = True
        return replace(state, W=W, active=active, joined=joined)

    def eval_params(self, state: CoBoState) -> torch.Tensor:
        return state.X

    def collaboration(self, state: CoBoState) -> torch.Tensor | None:
        W = state.W
        if isinstance(W, SparseBoxWeights):
            return W.to_dense() if W.n <= DENSE_EXPORT_LIMIT else None
        if state.active is not None:  # W over the present clients; absent ones are 0
            present = state.active.to(W.dtype)
            return W * present[:, None] * present[None, :]
        return W

    def cluster_agreement(self, state: CoBoState, clusters: list[int | None]) -> dict | None:
        """W against the true clusters (``base.cluster_agreement``'s figures; a sparse W
        without forming it) and, with a pull threshold, ``mass_pulled_inside``: the same
        share of each row's mass inside its cluster among the weights Eq. (3) reads (the
        entries at or above the threshold)."""
        sparse = isinstance(state.W, SparseBoxWeights)
        W = state.W if sparse else self.collaboration(state)

        def agree(M) -> dict[str, float]:
            return M.cluster_agreement(clusters) if sparse else cluster_agreement(M, clusters)

        out = agree(W)
        cut = self.threshold()
        if out and cut > 0:
            read = agree(pull_weights(W, "sum", cut))
            if "mass_inside" in read:
                out["mass_pulled_inside"] = read["mass_inside"]
        return out

    def artifacts(self, state: CoBoState) -> dict:
        """A sparse W is saved as its stored entries (collaboration_sparse.pt)."""
        if isinstance(state.W, SparseBoxWeights):
            return {"collaboration_sparse": state.W.export()}
        return {}


def _active(active: torch.Tensor | None, n: int, device) -> torch.Tensor:
    return torch.ones(n, dtype=torch.bool, device=device) if active is None else active.clone()
