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


def test_a_key_of_another_engine_is_refused_and_switching_engines_drops_it():
    """engine.* keys that only the Ray engine reads (engine_keys: its hosts, failures,
    schedule) set on a local run would do nothing: refused with one line naming the key
    and the engine that reads it. Switching engine.kind by an override (a Ray YAML run
    locally) drops the old engine's own keys, as switching algorithm.name drops the old
    method's; the Ray instance's keys (address, num_cpus, ...) stay, since a parallel
    compare or a sweep on a local engine reads them too."""
    from raycobo.config import engine_keys, unread_engine_keys

    with pytest.raises(ConfigError, match=r"'engine.clients_per_actor'.*engine.kind=ray.*local"):
        load_config(None, ["engine.clients_per_actor=4"])
    with pytest.raises(ConfigError, match=r"'engine.max_restarts'.*engine.kind=loop"):
        load_config(None, ["engine.kind=loop", "engine.max_restarts=1"])
    with pytest.raises(ConfigError, match=r"'engine.rounds'"):
        load_config(None, ["engine.rounds=resident"])
    assert load_config(None, ["engine.num_cpus=2", "engine.timeout_s=5"]).engine.num_cpus == 2
    ray_cfg = load_config(
        None, ["engine.kind=ray", "engine.clients_per_actor=4", "engine.rounds=stale"]
    )
    local = with_overrides(ray_cfg, {"engine.kind": "local"})
    assert local.engine.clients_per_actor == "auto" and local.engine.rounds == "sync"
    assert unread_engine_keys(local.engine) == []
    with pytest.raises(ConfigError, match="engine.clients_per_actor"):  # given with the switch
        with_overrides(ray_cfg, {"engine.kind": "local", "engine.clients_per_actor": 2})
    assert "rounds" in engine_keys("ray") and "threads" not in engine_keys("ray")
