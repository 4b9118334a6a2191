"""Each method owns its settings: the ``algorithm`` section holds exactly the keys the
chosen method reads, a key of another method is refused naming the methods that have
it, and switching the method (compare entries, sweeps, overrides) keeps what is shared."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from raycobo.algorithms import ALGORITHMS, METHODS, evaluate
from raycobo.cli import app
from raycobo.comparison import entry_config
from raycobo.config import ConfigError, load_config, with_overrides
from tests.helpers import CHARACTERISTIC, build, run_rounds

# the branches that read every key: CoBo's mixed sampling reads all three constants, its
# bounded alignment the cosine's floor
EXTRA = {
    **CHARACTERISTIC,
    "cobo": ["algorithm.sampling=mixed", "algorithm.alignment=bounded"],
}


class ReadLog:
    """The settings object as the algorithm sees it, logging the keys it reads."""

    def __init__(self, settings):
        object.__setattr__(self, "_settings", settings)
        object.__setattr__(self, "read", set())

    def __getattr__(self, key):
        self.read.add(key)
        return getattr(self._settings, key)


# a method whose keys belong to one of its rules each: every rule's run together reads all
RULES = {
    "fedamp": [["algorithm.attention=distance"], ["algorithm.attention=cosine"]],
    "apple": [[], ["algorithm.downloads=1"]],  # the download draw's keys act in its mode
}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_setting_of_a_method_is_read_by_it(digits_cfg, name):
    """A declared key that the method never reads would be a setting that does nothing."""
    read: set[str] = set()
    for rule in RULES.get(name, [[]]):
        cfg = digits_cfg(f"algorithm.name={name}", *EXTRA.get(name, []), *rule)
        _, ops, _ = build(cfg)
        log = ReadLog(cfg.algorithm)
        algo = ALGORITHMS[name](log, cfg.rounds, cfg.seed)
        evaluate(algo, run_rounds(algo, ops, 4), ops)
        read |= log.read
    declared = set(METHODS[name].settings.model_fields) - {"name"}
    assert declared - read == set(), f"{name} never reads {sorted(declared - read)}"


@pytest.mark.parametrize(
    ("overrides", "key", "owners"),
    [
        (["algorithm.lam=5"], "lam", "ditto"),  # the example: Ditto's lambda on CoBo
        (["algorithm.epsilon=0.3"], "epsilon", "federico"),
        (["algorithm.name=ditto", "algorithm.rho=0.1"], "rho", "cobo"),
        (["algorithm.name=l2c", "algorithm.encoder_out=3"], "encoder_out", "meta_l2c"),
        (["algorithm.name=local", "algorithm.client_rate=0.5"], "client_rate", "fedavg"),
        (["algorithm.name=fedsep", "algorithm.topk_fraction=0.1"], "topk_fraction", "topk_ef"),
        (["algorithm.name=fedavg", "algorithm.ft_steps=3"], "ft_steps", "fedavg_ft"),
    ],
)
def test_a_key_of_another_method_is_refused_naming_who_has_it(overrides, key, owners):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    msg = str(err.value)
    assert msg.startswith(f"invalid config key 'algorithm.{key}': ") and owners in msg
    assert "\n" not in msg


def test_the_cli_refuses_it_with_exit_2():
    res = CliRunner().invoke(app, ["run", "examples/quickstart.yaml", "algorithm.lam=5"])
    assert res.exit_code == 2
    assert "algorithm.lam" in res.stderr and "ditto" in res.stderr


def test_switching_the_method_keeps_what_the_methods_share(tmp_path):
    cobo = load_config(None, ["algorithm.lr=0.05", "algorithm.rho=0.2", "algorithm.gamma=1"])
    ditto = with_overrides(cobo, {"algorithm.name": "ditto", "algorithm.lam": 0.5})
    assert ditto.algorithm.model_dump() == {
        "name": "ditto",
        "lr": 0.05,
        "client_rate": 1.0,
        "local_steps": 1,
        "lam": 0.5,
    }
    spec = tmp_path / "c.yaml"
    spec.write_text(cobo.to_yaml())
    assert load_config(spec, ["algorithm.name=local"]).algorithm.model_dump() == {
        "name": "local",
        "lr": 0.05,
        "local_steps": 1,
    }
    # a file that names a method and another method's key is refused as it is
    tree = yaml.safe_load(spec.read_text())
    tree["algorithm"]["name"] = "local"
    spec.write_text(yaml.safe_dump(tree))
    with pytest.raises(
        ConfigError, match=r"local has no setting '\w+' \(it is a setting of cobo\)"
    ):
        load_config(spec)


def test_compare_entries_drop_the_base_methods_keys_but_check_their_own():
    cfg = load_config(
        None,
        [
            "algorithm.rho=0.2",
            "compare.algorithms=[local,ditto,cobo]",
            "compare.overrides={ditto: {algorithm.lam: 0.1}}",
        ],
    )
    assert entry_config(cfg, "ditto").algorithm.lam == 0.1
    assert not hasattr(entry_config(cfg, "local").algorithm, "rho")
    assert entry_config(cfg, "cobo").algorithm.rho == 0.2
    bad = with_overrides(cfg, {"compare.overrides": {"local": {"algorithm.lam": 0.1}}})
    with pytest.raises(ConfigError, match="'algorithm.lam': local has no setting"):
        entry_config(bad, "local")


def test_a_sweep_over_a_key_one_swept_method_lacks_is_refused(tmp_path):
    from raycobo.tune.space import load_sweep

    spec = {
        "base": {"data": {"name": "quadratic"}, "tracking": {"enabled": False}},
        "space": {
            "algorithm.name": {"grid": ["ditto", "cobo"]},
            "algorithm.lam": {"grid": [0.1, 1.0]},
        },
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=r"space.algorithm.lam.*cobo has no setting 'lam'"):
        load_sweep(path)
    spec["space"]["algorithm.name"] = {"grid": ["ditto", "fedavg_ft"]}
    spec["space"]["algorithm.lr"] = spec["space"].pop("algorithm.lam")
    path.write_text(yaml.safe_dump(spec))
    assert load_sweep(path)[0].space["algorithm.lr"] == {"grid": [0.1, 1.0]}


def test_help_config_lists_a_methods_keys_and_defaults():
    res = CliRunner().invoke(app, ["run", "--help-config", "ditto"])
    assert res.exit_code == 0, res.output
    rows = {ln.split("│")[1].strip(): ln for ln in res.output.splitlines() if "algorithm." in ln}
    assert set(rows) == {f"algorithm.{k}" for k in ("lr", "client_rate", "local_steps", "lam")}
    assert "1.0" in rows["algorithm.lam"] and "lambda" in rows["algorithm.lam"]
    cobo = CliRunner().invoke(app, ["run", "--help-config", "cobo"])
    assert "algorithm.rho" in cobo.output and "'auto'" in cobo.output
    assert "algorithm.lam" not in cobo.output
    bad = CliRunner().invoke(app, ["run", "--help-config", "sgd"])
    assert bad.exit_code == 2 and "unknown method 'sgd'" in bad.stderr


def test_optional_capabilities_are_declared_not_probed(digits_cfg):
    """What a method can do besides the four required calls, as the run sees it."""
    from raycobo.algorithms import base

    caps = {
        "Elastic": base.Elastic,
        "EvaluatesItself": base.EvaluatesItself,
        "ExportsArtifacts": base.ExportsArtifacts,
        "KeepsOwnAgreement": base.KeepsOwnAgreement,
        "PlansRounds": base.PlansRounds,
        "StepsInRows": base.StepsInRows,
        "SizesItsState": base.SizesItsState,
    }
    expected = {
        "cobo": {
            "Elastic",
            "ExportsArtifacts",
            "KeepsOwnAgreement",
            "PlansRounds",
            "SizesItsState",
            "StepsInRows",
        },
        "fedavg": {"PlansRounds"},
        "fedavg_ft": {"PlansRounds"},
        "ditto": {"PlansRounds"},
        "oracle": {"PlansRounds"},
        "federico": {"EvaluatesItself"},
        "l2c": {"ExportsArtifacts"},
        "meta_l2c": {"ExportsArtifacts"},
    }
    for name, method in METHODS.items():
        cfg = digits_cfg(f"algorithm.name={name}")
        algo = method.build(cfg.algorithm, 1000, 0)
        assert isinstance(algo, base.Algorithm), name
        found = {k for k, proto in caps.items() if isinstance(algo, proto)}
        assert found == expected.get(name, set()), name
