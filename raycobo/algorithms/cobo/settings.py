"""CoBo's settings: the keys, the presets that fill the ones left null, and when a key
applies.

A preset is one declaration of values (``register_preset``): ``paper`` is Algorithm 1
as printed, ``authors`` the authors' code (github epfml/CoBo) where it differs from it,
``raycobo`` the defaults chosen on the regime matrix (benchmarks/regimes). A key left
null takes its preset's value; a key set wins over it. A key set where it would do
nothing (``WHEN``) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from raycobo.algorithms.pairs import ALIGN_BATCHES_MAX, SCORES
from raycobo.algorithms.samplers import SAMPLINGS
from raycobo.algorithms.settings import MethodConfig
from raycobo.registry import import_object, is_import_path
from raycobo.settings import ConfigError

Sampling = Literal[tuple(SAMPLINGS)]  # the strategies samplers.py registers
Domain = Literal["box", "simplex"]

PRESETS: dict[str, dict[str, Any]] = {}


def register_preset(name: str, base: str | None = None, **values: Any) -> dict[str, Any]:
    """Declare preset ``name``: ``values`` for CoBo's preset keys, the rest from the
    preset ``base`` (every key where there is none). -> its values"""
    own = {**(PRESETS[base] if base else {}), **values}
    PRESETS[name] = own
    return own


# Algorithm 1 as printed: the inner product, a constant gamma (0.01, as measured on the
# cross-device twin, FIDELITY.md), the penalty summed over collaborators, W^0 = 1
register_preset(
    "paper",
    alignment="inner",
    alignment_batches=1,
    cosine_floor=0.3,
    gamma=0.01,
    gamma_decay="none",
    pull="sum",
    pull_strength=0.2,
    pull_threshold=0.0,
    sampling="mixed",
    mixed_switch=0.5,
    start_all_pairs=False,
    sampling_samples=0.0,
    momentum=0.0,
    init="shared",
    order="weights_first",
)
# the authors' code where it differs from Algorithm 1 (FIDELITY.md, cobo-ablation-code):
# the cosine as the score, model-step momentum 0.9 (optim/cobo_optim.py), W updated at
# the stepped models' midpoints (train.py), each client its own x^0 (clients.py), and
# p = 2/n, then 1/sqrt(t) (grouping.py)
register_preset(
    "authors",
    base="paper",
    alignment="cosine",
    sampling="mixed_sqrt",
    momentum=0.9,
    init="independent",
    order="models_first",
)
# chosen on the regime matrix's validation data (benchmarks/regimes,
# docs/explanation/cobo.md; how each value was found: benchmarks/regimes/LOG.md)
register_preset(
    "raycobo",
    base="paper",
    alignment="bounded",
    alignment_batches=2,
    gamma=3.0,
    gamma_decay="sqrt",
    pull="mean",
    pull_strength=0.5,
    pull_threshold=0.5,
    start_all_pairs=True,
    sampling_samples=12.0,
)
PRESET_KEYS = tuple(PRESETS["paper"])


@dataclass(frozen=True)
class Needs:
    """A key applies only where ``key`` is ``value`` (``differs``: is not), or, with
    ``value`` None, is on (not 0); ``only_on``: checked only where the key set is on."""

    key: str
    value: Any = None
    differs: bool = False
    only_on: bool = False

    def holds(self, have: Any) -> bool:
        if self.value is None:
            return bool(have)
        return (have != self.value) if self.differs else (have == self.value)

    def refusal(self, have: Any) -> str:
        if self.value is None:
            return (
                f"applies with algorithm.{self.key} > 0, not 0 (it would do nothing): drop "
                f"it, or set algorithm.{self.key}"
            )
        if self.differs:
            return f"applies to a {self.key} other than {self.value} (it would do nothing): drop it"
        hint = f", or set algorithm.{self.key}={self.value}" if self.key != "domain" else ""
        return (
            f"applies to {self.key}: {self.value}, not {have} (it would do nothing): drop it{hint}"
        )


# The pull's threshold brings the parts that keep the graph it reads current: W^0 = 0 (a
# pair pulls once it has been measured aligned, ``initial_weight``), and these rates
# (what leaving each out cost: docs/explanation/cobo.md, benchmarks/regimes/LOG.md)
FADE = 1.0  # a weight below the threshold loses FADE x threshold x p_t a round
RECHECK = 0.02  # a pair the pull reads is sampled at least this often a round
CLOSURE = 0.1  # each client proposes a collaborator's collaborator this often a round

BOX = Needs("domain", "box")
EVERY_PAIR = Needs("sampling", "full", differs=True, only_on=True)  # full: nothing skipped
# when each conditional key applies, in an order where a key's conditions come first
WHEN: dict[str, tuple[Needs, ...]] = {
    "cosine_floor": (Needs("alignment", "bounded"),),
    "pull_threshold": (BOX,),
    "pull_strength": (Needs("pull", "mean"), Needs("rho", "auto"), BOX),
    "start_all_pairs": (EVERY_PAIR,),
    "sampling_samples": (EVERY_PAIR,),
}


def _by_preset(key: str) -> str:
    return " (null: the preset's: " + ", ".join(f"{p} {v[key]}" for p, v in PRESETS.items()) + ")"


def _key(description: str, key: str, **constraints: Any):
    """A preset key: null by default (its preset's value)."""
    return Field(default=None, description=description + _by_preset(key), **constraints)


def _share(description: str, key: str):
    return _key(description, key, ge=0, le=1)


class CoBoConfig(MethodConfig):
    """CoBo (Algorithm 1; Eq. 1-3)."""

    retired: ClassVar[dict[str, str]] = {
        "rule": "it is algorithm.preset since raycobo 0.3.0 (raycobo, paper, and authors)",
        **{
            key: "removed in raycobo 0.3.0: no preset used it, and no measurement kept it"
            for key in (
                "hold",
                "recheck_unsettled",
                "recheck_decay",
                "entry_samples",
                "sampling_start",
            )
        },
        "recheck_samples": "removed in raycobo 0.5.0: the re-checks scale up where the "
        "sampler's rates do, by algorithm.sampling_samples (0: recheck's own rate)",
        "fade_decay": "removed in raycobo 0.5.0: the fade is never decayed (no preset decayed it)",
        "sampling_scale_max": "removed in raycobo 0.5.0: sampling_samples raises the "
        "sampler's rates at most 4 times (no preset set another bound)",
        "pull_at": "removed in raycobo 0.7.0: pull: mean acts on the stepped models (adapt "
        "then combine), pull: sum on the current ones (Eq. 3); no preset paired them "
        "otherwise",
        "initial_weight": "removed in raycobo 0.7.0: W^0 between clients is 0 where the "
        "pull has a threshold (algorithm.pull_threshold > 0: a pair pulls once measured "
        "aligned) and 1 without one (Algorithm 1); no preset paired them otherwise",
        "fade_clients": "removed in raycobo 0.7.0: the fade grows as n / 160 past 160 "
        "present clients (no preset set another count)",
        **{
            key: f"removed in raycobo 0.8.0: {what} wherever the pull has a threshold "
            "(algorithm.pull_threshold > 0, box domain), and not without one; no preset "
            "paired them otherwise"
            for key, what in (
                ("fade", f"the weights below the threshold fade at {FADE:g} x threshold x p_t"),
                ("recheck", f"the pairs the pull reads are re-sampled at least {RECHECK:g}"),
                ("closure", f"each client proposes a collaborator's collaborator at {CLOSURE:g}"),
            )
        },
    }

    name: Literal["cobo"] = "cobo"
    preset: str = Field(
        default="raycobo",
        description="the values of the keys left null: raycobo (chosen on the regime "
        "matrix), paper (Algorithm 1 as printed), authors (the authors' code), or a "
        "plugin's, module:PRESET (what raycobo.algorithms.cobo.register_preset returned)",
    )
    # penalty strength; auto: pull mean: lr * rho = pull_strength; pull sum: 0.3, lowered
    # as 0.4 / (lr n) where the box domain's W^0 = 1 would make the step unstable (pull.py)
    rho: Annotated[float, Field(ge=0)] | Literal["auto"] = Field(
        default="auto", description="rho: strength of the pull toward collaborators"
    )
    gamma: float | None = _key("gamma: W step size", "gamma", gt=0)
    alignment: str | None = _key(
        "Eq. (1)'s score: inner, the inner product <g_i, g_j> (paper); cosine, its cosine "
        "(scale-free); bounded, the cosine with a floor under its denominator (shrinks as "
        "the gradients do); or one registered with raycobo.algorithms.cobo.register_score",
        "alignment",
    )
    alignment_batches: int | None = _key(
        "Eq. (1)'s gradients g_i(z_ij) and g_j(z_ij) each the mean over this many "
        "minibatches of the client's data (the score's sampling noise shrinks, the "
        "alignment's gradient work grows by the factor)",
        "alignment_batches",
        ge=1,
        le=ALIGN_BATCHES_MAX,
    )
    cosine_floor: float | None = _key(
        "alignment bounded: the cosine's denominator ||g_i|| ||g_j|| is never below this "
        "share of the clients' mean squared gradient norm at x^0",
        "cosine_floor",
        gt=0,
    )
    gamma_decay: Literal["none", "sqrt"] | None = _key(
        "W step schedule: constant gamma (paper), or gamma / sqrt(1 + k_t), k_t the "
        "samples a pair has had in expectation before round t (a pair the pull reads "
        "counts the re-checks': the sum of max(p_tau, their rate))",
        "gamma_decay",
    )
    pull: Literal["sum", "mean"] | None = _key(
        "Eq. (2)'s penalty: rho sum_j w_ij (x_i - x_j) on the current models, beside the "
        "gradient step (paper); or mean, toward the W-weighted mean of x_i and its "
        "collaborators (rows divided by max(1, sum_j w_ij), w_ii = 1 in the box domain) "
        "on the stepped models x - lr g (adapt then combine, as diffusion methods order "
        "it: the pull also averages the step's gradient noise)",
        "pull",
    )
    sampling: Sampling | None = _key("edge sampling strategy", "sampling")
    domain: Domain = Field(default="box", description="W's domain: box [0,1] or simplex rows")
    pull_strength: float | None = _key(
        "pull: mean with rho: auto (box domain): lr * rho, the share of the way to the "
        "collaborators' weighted mean a model moves per step",
        "pull_strength",
        gt=0,
        lt=1,
    )
    pull_threshold: float | None = _share(
        "box domain: collaborators whose w_ij is below this are left out of Eq. (3)'s "
        "pull (many small cross-cluster weights add up to a large share of a row's pull); "
        "with a threshold W^0 between clients is 0, so a pair pulls once it has been "
        "measured aligned, and without one 1, so every pair pulls until it is measured "
        "misaligned (Algorithm 1). A threshold keeps the graph it reads current: the "
        f"weights below it fade back to 0 (by {FADE:g} x threshold x p_t a round, p_t a "
        "pair's sampling rate, grown as n / 160 past 160 present clients), the pairs it "
        f"reads are sampled at least {RECHECK:g} a round (re-checks), and each client "
        f"proposes a collaborator's collaborator with probability {CLOSURE:g} a round "
        "(closure)",
        "pull_threshold",
    )
    weights: Literal["auto", "dense", "sparse"] = Field(
        default="auto",
        description="W storage: dense n x n, or (box) W^0 + the sampled entries; auto: sparse "
        "above 2,048 clients",
    )
    sampling_c: float = Field(default=2.0, gt=0, description="constant: p = c/n")
    time_c: float = Field(default=1.0, gt=0, description="time: p_t = min(1, c/t)")
    mixed_switch: float | None = _share(
        "mixed, mixed_sqrt: the constant phase's share of the rounds", "mixed_switch"
    )
    start_all_pairs: bool | None = _key(
        "round 0 samples every pair, whatever the strategy: with init shared every "
        "pair's midpoint is x^0 there, so its score reads its two clients' data before "
        "either model has fit its own; later rounds as without it (where the strategy "
        "samples a pair S < 1 times in the run, round 0 samples each with probability S: "
        "at most twice the run's pairs)",
        "start_all_pairs",
    )
    sampling_samples: float | None = _key(
        "where the sampling strategy samples a pair fewer than this many times over the "
        "run (S, in expectation: many clients, a short run), its p_t are all multiplied "
        "by this / S, at most 4 (a round's pairs stay O(n)), and the re-checks' rate "
        "(with pull_threshold) by this / S (0: the strategy's and the re-checks' own "
        "rates)",
        "sampling_samples",
        ge=0,
    )
    momentum: float | None = _key(
        "beta of the model step's gradient average m <- beta m + (1-beta) g",
        "momentum",
        ge=0,
        lt=1,
    )
    init: Literal["shared", "independent"] | None = _key(
        "x_i^0: one shared x^0 (Algorithm 1) or each client its own", "init"
    )
    order: Literal["weights_first", "models_first"] | None = _key(
        "W from x^t then x^{t+1} with it (Algorithm 1), or the model step first and W at "
        "the new models' midpoints",
        "order",
    )

    @model_validator(mode="after")
    def _applies(self) -> CoBoConfig:
        """A preset that is not registered, a score that is not, and a key of ``WHEN``
        set where it would do nothing, are refused."""
        if self.preset not in PRESETS:
            _import_preset(self.preset)
        score = self.alignment
        if score is not None and score not in SCORES:
            raise ValueError(f"alignment: unknown score '{score}' (one of {', '.join(SCORES)})")
        for key, needs in WHEN.items():
            value = getattr(self, key)
            if value is None:
                continue
            for need in needs:
                have = self.value(need.key)
                if (value or not need.only_on) and not need.holds(have):
                    raise ValueError(f"{key}: {need.refusal(have)}")
        return self

    def value(self, key: str) -> Any:
        """``key`` as CoBo reads it: set, else its preset's value."""
        return _resolved(self, key)

    def effective(self) -> dict:
        """The settings with the preset's values where a key is null, and the keys that
        do not apply (``WHEN``) null."""
        out = self.model_dump(mode="json")
        for key, value in PRESETS[self.preset].items():
            if out[key] is None:
                out[key] = value
        changed = True
        while changed:  # a key left out may leave out the keys that need it
            changed = False
            for key, needs in WHEN.items():
                if out[key] is not None and not all(n.holds(out[n.key]) for n in needs):
                    out[key], changed = None, True
        return out

    def collaboration_cut(self) -> float | None:
        """The box domain's ``pull_threshold``: Eq. (3) leaves W's entries below it out of
        the pull. None: no threshold (or the simplex domain)."""
        return pull_cut(PresetView(self))


def _import_preset(name: str) -> None:
    """A preset named by import path (``module:PRESET``, the values ``register_preset``
    returned, in a plugin module that may also register the parts it names), added to
    ``PRESETS`` under that name."""
    if not is_import_path(name):
        raise ValueError(f"preset: unknown preset '{name}' (one of {', '.join(PRESETS)})")
    try:
        values = import_object(name, "algorithm.preset")
    except ConfigError as err:  # its message names the key: as this validator's
        raise ValueError("preset:" + str(err).partition(":")[2]) from None
    if not isinstance(values, dict) or set(values) != set(PRESET_KEYS):
        raise ValueError(
            f"preset: '{name}' is not a preset (a mapping of every preset key, as "
            "register_preset returns it)"
        )
    PRESETS[name] = dict(values)


def pull_cut(view: CoBoConfig | PresetView) -> float | None:
    """The pull's threshold on w_ij as ``view`` gives the settings (None: none)."""
    cut = float(view.pull_threshold or 0.0) if view.domain == "box" else 0.0
    return cut or None


def initial_weight(view: CoBoConfig | PresetView) -> float:
    """The box domain's W^0 between clients: 0 where the pull has a threshold (a pair
    pulls once it has been measured aligned), 1 without one (Algorithm 1: every pair
    pulls until it is measured misaligned)."""
    return 0.0 if pull_cut(view) else 1.0


def fade(view: CoBoConfig | PresetView) -> float:
    """The fade: each weight below the pull's threshold loses ``fade`` x threshold x
    p_t a round (``FADE`` where the pull has a threshold, 0 without one)."""
    return FADE if pull_cut(view) else 0.0


def recheck(view: CoBoConfig | PresetView) -> float:
    """The least rate at which a pair the pull reads is sampled a round (``RECHECK``
    where the pull has a threshold, 0 without one)."""
    return RECHECK if pull_cut(view) else 0.0


def closure(view: CoBoConfig | PresetView) -> float:
    """The probability a round that each client with a pulled pair proposes a
    collaborator's collaborator (``CLOSURE`` where the pull has a threshold and the
    sampler leaves pairs out, 0 otherwise)."""
    return CLOSURE if pull_cut(view) and view.sampling != "full" else 0.0


class PresetView:
    """The settings as CoBo reads them: a null key takes its preset's value."""

    def __init__(self, cfg: CoBoConfig):
        object.__setattr__(self, "_cfg", cfg)

    def __getattr__(self, key: str):
        if key.startswith("_"):  # _cfg before it is set (unpickling), dunder look-ups
            raise AttributeError(key)
        return _resolved(self._cfg, key)


def _resolved(cfg: Any, key: str) -> Any:
    """``cfg.key``, or where it is null its preset's value (``cfg``: CoBo's settings, or
    a wrapper that reads them key by key)."""
    have = getattr(cfg, key)
    preset = PRESETS[cfg.preset]
    return preset[key] if have is None and key in preset else have
