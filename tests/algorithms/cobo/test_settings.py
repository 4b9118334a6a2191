"""CoBo's keys and presets: what each preset gives, where a key applies, what a run
records, and which stored configs this version reads."""

from __future__ import annotations

import pytest
import yaml

from raycobo.algorithms.cobo import PRESETS, CoBo, CoBoConfig, register_preset
from raycobo.algorithms.cobo.settings import PRESET_KEYS, WHEN
from raycobo.config import ConfigError, load_config, load_stored_config
from tests.helpers import at_rates


def test_each_preset_declares_every_preset_key_once():
    """Every preset gives a value to every key a preset fills, each key is a null field
    of CoBoConfig (its preset's value unless set), and every conditional key is one."""
    fields = CoBoConfig.model_fields
    for name, values in PRESETS.items():
        assert set(values) == set(PRESET_KEYS), name
    for key in PRESET_KEYS:
        assert fields[key].default is None, key
        assert "null: the preset's" in fields[key].description, key
    assert set(WHEN) <= set(fields)


def test_the_paper_preset_is_algorithm_1_and_a_key_set_wins():
    """paper gives Algorithm 1's score, constant step and summed pull, W^0 = 1 and none
    of raycobo's additions; a key set explicitly wins over its preset."""
    algo = CoBo(CoBoConfig(preset="paper"), rounds=10, seed=0)
    c = algo.cfg
    assert (c.alignment, c.gamma, algo.schedule.decays, c.pull) == ("inner", 0.01, False, "sum")
    parts = (algo.proposals.rechecks.rate, algo.schedule.fade, algo.proposals.closure.rate)
    assert (algo.w0, *parts, c.alignment_batches) == (1, 0, 0, 0, 1)
    assert algo.pull.threshold == 0.0 and algo.pull.at == "current"
    algo = CoBo(CoBoConfig(preset="paper", gamma=0.2, pull="mean"), rounds=10, seed=0)
    assert (algo.cfg.gamma, algo.cfg.pull, algo.cfg.alignment) == (0.2, "mean", "inner")


def test_the_authors_preset_is_their_code():
    """authors: Algorithm 1 with the authors' code's choices (the cosine, momentum 0.9,
    models first, independent initial models, constant then 1/sqrt(t) sampling); it
    cannot take late alignment results or run resident, as its order says."""
    algo = CoBo(CoBoConfig(preset="authors"), rounds=10, seed=0)
    c = algo.cfg
    assert (c.alignment, c.momentum, c.order, c.init, c.sampling) == (
        "cosine",
        0.9,
        "models_first",
        "independent",
        "mixed_sqrt",
    )
    assert (c.gamma, c.pull, algo.w0) == (0.01, "sum", 1.0)
    assert algo.plan_refusal() is not None and algo.rows_refusal() is not None
    pinned = CoBoConfig(preset="authors").pinned()
    assert (pinned.momentum, pinned.order, pinned.preset) == (0.9, "models_first", "authors")


def test_a_registered_preset_runs_and_is_written_out(quad_cfg, tmp_path):
    """A preset registered from another (here raycobo with the plain cosine) is chosen by
    name, and a run records its values."""
    from raycobo.lifecycle.experiment import run_experiment

    register_preset("test-cosine", base="raycobo", alignment="cosine")
    try:
        cfg = quad_cfg("algorithm.preset=test-cosine", "rounds=2", "eval_every=1")
        assert CoBo(cfg.algorithm, 2, 0).cfg.alignment == "cosine"
        run_experiment(cfg, tmp_path / "r")
        stored = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["algorithm"]
        assert (stored["preset"], stored["alignment"], stored["cosine_floor"]) == (
            "test-cosine",
            "cosine",
            None,
        )
    finally:
        del PRESETS["test-cosine"]
    with pytest.raises(ConfigError, match="algorithm.preset.*unknown preset 'nope'"):
        load_config(None, ["algorithm.preset=nope"])


def test_retired_keys_say_what_became_of_them():
    """rule is preset now; the keys no preset used are gone, each refused in one line."""
    with pytest.raises(ConfigError, match="'algorithm.rule': it is algorithm.preset"):
        load_config(None, ["algorithm.rule=paper"])
    for key in ("hold", "recheck_unsettled", "recheck_decay", "entry_samples", "sampling_start"):
        with pytest.raises(ConfigError, match=f"'algorithm.{key}': removed in raycobo 0.3.0"):
            load_config(None, [f"algorithm.{key}=1"])


def test_the_pull_threshold_is_a_box_domain_key():
    """raycobo's threshold applies to the box domain; a simplex row sums to 1, so an
    explicit threshold there is refused."""
    cut = PRESETS["raycobo"]["pull_threshold"]
    assert CoBo(CoBoConfig(), 10, 0).pull.threshold == cut > 0
    assert CoBo(CoBoConfig(preset="paper"), 10, 0).pull.threshold == 0.0
    assert CoBo(CoBoConfig(domain="simplex"), 10, 0).pull.threshold == 0.0
    assert CoBoConfig(domain="simplex").effective()["pull_threshold"] is None
    assert CoBoConfig().pinned().pull_threshold == cut
    with pytest.raises(ConfigError, match="algorithm.pull_threshold.*domain: box"):
        load_config(None, ["algorithm.domain=simplex", "algorithm.pull_threshold=0.2"])


def test_a_run_records_the_values_it_ran(tmp_path):
    """A run's config.yaml pins its preset's values (a later default cannot change it on
    resume), the keys that do not apply left null, and names the version that wrote it."""
    from raycobo.lifecycle.experiment import run_experiment
    from raycobo.version import __version__

    cfg = load_config(None, ["rounds=2", "tracking.enabled=false"])
    assert cfg.algorithm.alignment is None
    run_experiment(cfg, tmp_path / "r")
    text = (tmp_path / "r" / "config.yaml").read_text()
    assert text.splitlines()[0] == f"# written by raycobo {__version__}"
    stored = yaml.safe_load(text)["algorithm"]
    assert (stored["alignment"], stored["cosine_floor"], stored["gamma"]) == ("bounded", 0.3, 3.0)
    assert stored["pull"] == "mean" and stored["pull_threshold"] == 0.5
    assert load_stored_config(tmp_path / "r" / "config.yaml").algorithm.alignment == "bounded"
    plain = load_config(None, ["algorithm.preset=paper", "rounds=2", "tracking.enabled=false"])
    run_experiment(plain, tmp_path / "p")
    paper = yaml.safe_load((tmp_path / "p" / "config.yaml").read_text())["algorithm"]
    assert (paper["alignment"], paper["cosine_floor"], paper["gamma"]) == ("inner", None, 0.01)


def test_configs_of_other_versions_are_refused_naming_both(tmp_path):
    """A stored config with no version line (before 0.3.0: its run's summary names the
    version), or one of a version this one does not read, is refused in one line naming
    both versions; this version's own is read."""
    from raycobo.version import __version__

    body = CoBoConfig().pinned().model_dump(mode="json")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"algorithm": body}))
    with pytest.raises(
        ConfigError, match=f"written by raycobo before 0.3.0.*raycobo {__version__}"
    ):
        load_stored_config(path)
    (tmp_path / "summary.json").write_text('{"provenance": {"raycobo_version": "0.2.0"}}')
    with pytest.raises(ConfigError, match=r"written by raycobo 0\.2\.0, and this is raycobo"):
        load_stored_config(path)
    path.write_text("# written by raycobo 9.0.0\n" + yaml.safe_dump({"algorithm": body}))
    with pytest.raises(ConfigError, match=r"raycobo 9\.0\.0"):
        load_stored_config(path)
    path.write_text(f"# written by raycobo {__version__}\n" + yaml.safe_dump({"algorithm": body}))
    assert load_stored_config(path).algorithm.preset == "raycobo"


def test_pull_strength_applies_where_it_acts():
    """pull_strength is a key of the mean pull with rho auto: elsewhere it would do
    nothing and is refused with one line."""
    algo = CoBo(CoBoConfig(), 10, 0)
    assert algo.cfg.pull_strength == 0.5
    assert CoBo(CoBoConfig(pull_strength=0.3, lr=0.1), 10, 0).pull.rho_for(5) == pytest.approx(3)
    for bad, key, why in [
        (["algorithm.pull=sum", "algorithm.pull_strength=0.3"], "pull_strength", "pull: mean"),
        (["algorithm.preset=paper", "algorithm.pull_strength=0.3"], "pull_strength", "pull: mean"),
        (["algorithm.rho=2", "algorithm.pull_strength=0.3"], "pull_strength", "rho: auto"),
        (["algorithm.pull_strength=1"], "pull_strength", "less than 1"),
    ]:
        with pytest.raises(ConfigError, match=f"algorithm.{key}.*{why}"):
            load_config(None, bad)
    assert CoBoConfig(rho=2.0).effective()["pull_strength"] is None
    assert CoBoConfig().pinned().model_dump(mode="json")["pull_strength"] == 0.5


def refused_as_removed(version: str, *cases: tuple[str, str]) -> None:
    """Each ``key=value`` of ``cases`` is refused in one line: removed in raycobo
    ``version``, and what became of it (a pattern)."""
    for key, says in cases:
        name = key.split("=")[0]
        with pytest.raises(ConfigError, match=f"{name}': removed in raycobo {version}: {says}"):
            load_config(None, [f"algorithm.{key}"])


def test_w0_and_where_the_pull_acts_follow_the_pull():
    """W^0 between clients is 0 where the pull has a threshold and 1 without one; the
    mean pull acts on the stepped models, the summed one on the current models. The
    keys that set them apart until raycobo 0.7.0 are refused in one line that says so."""
    cases = [
        ({}, 0.0, "stepped"),  # raycobo: threshold 0.5, mean
        ({"pull_threshold": 0.0}, 1.0, "stepped"),
        ({"preset": "paper"}, 1.0, "current"),
        ({"preset": "paper", "pull_threshold": 0.3, "pull": "mean"}, 0.0, "stepped"),
        ({"domain": "simplex"}, 1.0, "stepped"),  # no threshold there (W^0 uniform rows)
    ]
    for keys, w0, at in cases:
        algo = CoBo(CoBoConfig(**keys), 10, 0)
        assert (algo.w0, algo.pull.at) == (w0, at), keys
    refused_as_removed(
        "0.7.0",
        ("pull_at=current", "pull: mean acts on the stepped models"),
        ("initial_weight=1", "W\\^0 between clients is 0 where the pull has a threshold"),
        ("fade_clients=0", "the fade grows as n / 160 past 160"),
    )
    # gamma / (1 + k_t), which no preset used, went with them
    with pytest.raises(ConfigError, match="algorithm.gamma_decay.*'none' or 'sqrt'"):
        load_config(None, ["algorithm.gamma_decay=linear"])


def test_the_threshold_brings_the_fade_rechecks_and_closure():
    """A pull threshold (box domain) brings the parts that keep the graph it reads
    current: the fade (1), re-checks (0.02) and closure (0.1, not under full sampling);
    without one, none. The keys that set them apart until raycobo 0.8.0 are refused in
    one line that says so."""

    def parts(**keys):
        algo = CoBo(CoBoConfig(**keys), 10, 0)
        p = algo.proposals
        return (algo.schedule.fade, p.rechecks.rate, p.closure.rate)

    assert parts() == (1.0, 0.02, 0.1)
    assert parts(pull_threshold=0.2) == (1.0, 0.02, 0.1)
    assert parts(sampling="full") == (1.0, 0.02, 0.0)
    for off in ({"pull_threshold": 0.0}, {"domain": "simplex"}, {"preset": "paper"}):
        assert parts(**off) == (0.0, 0.0, 0.0), off
    assert parts(preset="paper", pull="mean", pull_threshold=0.5) == (1.0, 0.02, 0.1)
    # the re-checks' own rates (no closure, which reads W whatever the rates; round 0
    # as the strategy samples it): W is read where the sampler's p_t is below 0.02
    own = CoBoConfig(sampling_samples=0.0, start_all_pairs=False)

    def reads_w(rounds: int, t: int, n: int) -> bool:
        return at_rates(CoBo(own, rounds, 0), closure=0.0).samples_from_w(t, n)

    # mixed sampling over 10 rounds: p = 2/200 = 0.01 < 0.02 among 200 clients (W is read)
    assert reads_w(10, 0, 200) and not reads_w(10, 0, 50)  # p = 0.04: W not read
    # ... until mixed sampling's second half: p = min(0.04, 1 / (t + 1)) = 0.01 at t = 99
    assert reads_w(100, 99, 50)
    assert not CoBo(CoBoConfig(preset="paper"), 10, 0).samples_from_w(0, 200)
    assert not CoBo(CoBoConfig(domain="simplex"), 10, 0).samples_from_w(0, 200)
    refused_as_removed(
        "0.8.0",
        ("fade=0", "the weights below the threshold fade at 1"),
        ("recheck=0.1", "the pairs the pull reads are re-sampled at least 0.02"),
        ("closure=0", "each client proposes a collaborator's collaborator at 0.1"),
    )
    pinned = CoBoConfig().pinned().model_dump(mode="json")
    assert not {"fade", "recheck", "closure"} & set(pinned) and pinned["gamma_decay"] == "sqrt"
