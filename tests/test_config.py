"""Configuration: explicit argument > MQ_* environment > conf/engine.toml > defaults, validated on load."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from engine.config import PROJECT_ROOT, EngineConfig, config_file, load_config
from engine.errors import ConfigError

KEYS = [f.name for f in dataclasses.fields(EngineConfig)]


@pytest.fixture
def conf_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty MQ_CONF_DIR and no MQ_* variables, so only what a test sets is in effect."""
    for key in KEYS:
        monkeypatch.delenv(f"MQ_{key.upper()}", raising=False)
    directory = tmp_path / "conf"
    directory.mkdir()
    monkeypatch.setenv("MQ_CONF_DIR", str(directory))
    return directory


def write_toml(conf_dir: Path, text: str) -> None:
    (conf_dir / "engine.toml").write_text(text)


def test_without_file_or_env_every_value_is_the_default(conf_dir: Path) -> None:
    assert load_config() == EngineConfig()


def test_file_overrides_default(conf_dir: Path) -> None:
    write_toml(conf_dir, '[engine]\ndefault_queues = 8\nstore = "/data/mq"\n')
    config = load_config()
    assert config.default_queues == 8
    assert config.store == "/data/mq"
    assert config.pull_batch_size == EngineConfig().pull_batch_size


def test_file_without_section_is_read_too(conf_dir: Path) -> None:
    write_toml(conf_dir, "producer_linger_ms = 0\n")
    assert load_config().producer_linger_ms == 0


def test_env_overrides_file(conf_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(conf_dir, "[engine]\ndefault_queues = 8\n")
    monkeypatch.setenv("MQ_DEFAULT_QUEUES", "16")
    monkeypatch.setenv("MQ_STORE", "/env/store")
    config = load_config()
    assert config.default_queues == 16
    assert config.store == "/env/store"


def test_explicit_overrides_env_and_file(conf_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(conf_dir, "[engine]\ndefault_queues = 8\n")
    monkeypatch.setenv("MQ_DEFAULT_QUEUES", "16")
    assert load_config(default_queues=2).default_queues == 2


def test_explicit_none_means_not_given(conf_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQ_STORE", "/env/store")
    assert load_config(store=None).store == "/env/store"


def test_empty_env_value_is_ignored(conf_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQ_DEFAULT_QUEUES", "")
    assert load_config().default_queues == EngineConfig().default_queues


def test_explicit_path_replaces_the_conf_dir_file(conf_dir: Path, tmp_path: Path) -> None:
    write_toml(conf_dir, "[engine]\ndefault_queues = 8\n")
    other = tmp_path / "other.toml"
    other.write_text("[engine]\ndefault_queues = 3\n")
    assert load_config(other).default_queues == 3


def test_conf_dir_env_moves_the_file(conf_dir: Path) -> None:
    assert config_file() == conf_dir / "engine.toml"


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        pytest.param("MQ_DEFAULT_QUEUES", "four", "default_queues", id="non-integer-env-value"),
        pytest.param("MQ_PRODUCER_LINGER_MS", "-1", None, id="negative-linger"),
    ],
)
def test_a_bad_env_value_is_a_config_error(
    conf_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str | None
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=says):
        load_config()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param('[engine]\npull_batch_size = "lots"\n', "pull_batch_size", id="wrong-type-in-file"),
        pytest.param(
            "[engine]\ndefault_queue = 4\n", "unknown key 'default_queue'", id="unknown-key-in-file"
        ),
        pytest.param("[engine\n", "not valid TOML", id="invalid-toml"),
    ],
)
def test_a_bad_file_is_a_config_error(conf_dir: Path, text: str, says: str) -> None:
    write_toml(conf_dir, text)
    with pytest.raises(ConfigError, match=says):
        load_config()


@pytest.mark.parametrize(
    ("explicit", "says"),
    [
        pytest.param({"default_queues": 0}, "default_queues", id="out-of-range-value"),
        pytest.param({"queues": 4}, "unknown config key", id="unknown-explicit-key"),
    ],
)
def test_a_bad_explicit_value_is_a_config_error(conf_dir: Path, explicit: dict[str, int], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(**explicit)


def test_bool_is_not_an_integer() -> None:
    with pytest.raises(ConfigError):
        EngineConfig(default_queues=True)


def test_project_engine_toml_lists_every_key_with_its_default() -> None:
    toml = tomllib.loads((PROJECT_ROOT / "conf" / "engine.toml").read_text())
    data = toml["engine"]
    assert sorted(data) == sorted(k for k in KEYS if k != "storage")
    assert toml["storage"] == {}  # its own table, documented, empty by default
    assert EngineConfig(**data) == EngineConfig()


def test_project_engine_toml_comments_every_key() -> None:
    lines = (PROJECT_ROOT / "conf" / "engine.toml").read_text().splitlines()
    for i, line in enumerate(lines):
        if "=" in line and not line.startswith("#"):
            assert lines[i - 1].startswith("# "), f"no comment above {line!r}"
