"""Config validation: every rejected case names its key; overrides parse with YAML rules."""

from __future__ import annotations

import pytest

from raycobo.config import ConfigError, load_config, parse_value, with_overrides


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.rho=-1", "algorithm.rho"),
        ("algorithm.lr=0", "algorithm.lr"),
        ("algorithm.gamma=-0.1", "algorithm.gamma"),
        ("algorithm.client_rate=1.5", "algorithm.client_rate"),
        ("data.fraction=1.2", "data.fraction"),
        ("algorithm.sampling=sometimes", "algorithm.sampling"),
        ("algorithm.domain=ball", "algorithm.domain"),
        ("rounds=0", "rounds"),
        ("rounds=abc", "rounds"),
        ("algorithm.typo=1", "algorithm.typo"),
        ("nonsense=1", "nonsense"),
        ("data.partition.clients_per_cluster=[2,0]", "data.partition.clients_per_cluster"),
        ("data.curvature=[2,1]", "data.curvature"),
        ("engine.kind=spark", "engine.kind"),
    ],
)
def test_rejected_values_name_their_key(override, key):
    """Prepare an invalid override; Execute loading; Assert a one-line error naming it."""
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    assert key in msg
    assert "\n" not in msg


def test_overrides_parse_types():
    cfg = load_config(
        None,
        [
            "algorithm.rho=0.25",
            "rounds=7",
            "data.partition.clients_per_cluster=[1,2,3]",
            "tracking.enabled=false",
            "name=my run",
        ],
    )
    assert cfg.algorithm.rho == 0.25
    assert cfg.rounds == 7
    assert cfg.data.partition.cluster_sizes() == [1, 2, 3]
    assert cfg.tracking.enabled is False
    assert cfg.name == "my run"
    assert parse_value("[1, 2]") == [1, 2]
    assert parse_value("1e-3") == 1e-3
    assert parse_value("hello") == "hello"
    assert load_config(None, ["algorithm.lr=1e-3"]).algorithm.lr == 1e-3


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(None, ["rounds"])
    with pytest.raises(ConfigError, match="rounds"):
        load_config(None, ["rounds.x=1"])


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("rounds: [1, 2\n")
    with pytest.raises(ConfigError, match="broken.yaml"):
        load_config(broken)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listy)


def test_yaml_roundtrip(tmp_path):
    cfg = load_config(None, ["algorithm.name=ditto", "algorithm.lam=0.5"])
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    again = load_config(path)
    assert again == cfg
    assert with_overrides(cfg, {"algorithm.lam": 2.0}).algorithm.lam == 2.0


def test_examples_start_with_their_command_and_validate():
    from pathlib import Path

    examples = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
    assert len(examples) >= 10  # found from the repository root, wherever pytest runs
    for path in examples:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# raycobo "), path
        load_config(path)
