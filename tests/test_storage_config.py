"""Storage options for object-store roots: engine.toml's [storage], MQ_STORAGE_<KEY>, AWS_*,
``--storage-option``; secrets never shown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine import Store
from engine.config import (
    EngineConfig,
    export_storage_options,
    load_config,
    parse_storage_option,
    redact_storage,
    storage_from_env,
)
from engine.errors import ConfigError


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in list(os.environ):
        if key.startswith(("MQ_", "AWS_")):
            monkeypatch.delenv(key)
    directory = tmp_path / "conf"
    directory.mkdir()
    monkeypatch.setenv("MQ_CONF_DIR", str(directory))
    return directory


def test_storage_table_of_engine_toml_is_read(clean_env: Path) -> None:
    (clean_env / "engine.toml").write_text(
        '[engine]\nstore = "s3://b/s"\n[storage]\nAWS_ENDPOINT_URL = "http://127.0.0.1:1"\nAWS_REGION = "x"\n'
    )
    cfg = load_config()
    assert cfg.store == "s3://b/s"
    assert cfg.storage == {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_REGION": "x"}


def test_environment_overrides_file_and_explicit_overrides_environment(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (clean_env / "engine.toml").write_text('[storage]\nAWS_REGION = "file"\nAWS_ALLOW_HTTP = "false"\n')
    monkeypatch.setenv("AWS_REGION", "aws-env")
    monkeypatch.setenv("MQ_STORAGE_AWS_ALLOW_HTTP", "true")
    assert load_config().storage == {"AWS_REGION": "aws-env", "AWS_ALLOW_HTTP": "true"}
    cfg = load_config(storage={"AWS_REGION": "explicit"})
    assert cfg.storage == {"AWS_REGION": "explicit", "AWS_ALLOW_HTTP": "true"}


def test_mq_storage_prefix_beats_the_aws_variable() -> None:
    env = {
        "AWS_REGION": "a",
        "MQ_STORAGE_AWS_REGION": "b",
        "MQ_STORAGE_": "x",
        "AWS_ALLOW_HTTP": "",
        "AWS_CA_BUNDLE": "/c",
    }
    assert storage_from_env(env) == {"AWS_REGION": "b"}


def test_secrets_are_redacted_in_repr_and_messages(clean_env: Path) -> None:
    cfg = load_config(
        storage={"AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_SESSION_TOKEN": "tok", "AWS_REGION": "r"}
    )
    assert "s3cr3t" not in repr(cfg) and "tok" not in repr(cfg)
    assert "AWS_REGION': 'r'" in repr(cfg)
    assert redact_storage(cfg.storage)["AWS_SECRET_ACCESS_KEY"] == "***"


@pytest.mark.parametrize("bad", [{"K": 1}, {"": "v"}, ["K=V"]])
def test_storage_of_the_wrong_shape_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError):
        EngineConfig(storage=bad)  # type: ignore[arg-type]


def test_storage_table_with_a_non_string_value_is_a_config_error(clean_env: Path) -> None:
    (clean_env / "engine.toml").write_text("[storage]\nAWS_ALLOW_HTTP = true\n")
    with pytest.raises(ConfigError, match=r"\[storage\]"):
        load_config()


@pytest.mark.parametrize("text", ["novalue", "=v", "  =v"])
def test_storage_option_without_key_and_value_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_storage_option(text)


def test_storage_option_value_may_hold_equals_signs() -> None:
    assert parse_storage_option("AWS_SESSION_TOKEN=a=b=") == ("AWS_SESSION_TOKEN", "a=b=")


def test_exported_options_reach_every_config_loaded_after(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_REGION", "AWS_ALLOW_HTTP"):
        monkeypatch.setenv(f"MQ_STORAGE_{key}", "old")  # monkeypatch restores the absence after
    assert export_storage_options(["AWS_REGION=eu", "AWS_ALLOW_HTTP=true"]) == {
        "AWS_REGION": "eu",
        "AWS_ALLOW_HTTP": "true",
    }
    assert load_config().storage == {"AWS_REGION": "eu", "AWS_ALLOW_HTTP": "true"}


def test_local_store_takes_no_storage_options(clean_env: Path, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s", config=load_config(storage={"AWS_REGION": "r"}))
    assert store.storage_options is None


def test_cli_storage_option_reaches_the_store(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from engine.cli import main

    for key in ("AWS_REGION",):
        monkeypatch.setenv(f"MQ_STORAGE_{key}", "")  # restored after the test
    code = main(["--storage-option", "AWS_REGION=cli", "--store", str(tmp_path / "s"), "topic", "list"])
    assert code == 0
    assert load_config().storage["AWS_REGION"] == "cli"


def test_cli_bad_storage_option_is_one_line_error(
    clean_env: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from engine.cli import main

    code = main(["--storage-option", "oops", "--store", str(tmp_path / "s"), "topic", "list"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "KEY=VALUE" in err[0]


def test_cli_warns_once_when_a_secret_is_given_on_the_command_line(
    clean_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from engine.cli import main

    for key in ("AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(f"MQ_STORAGE_{key}", "")  # restored after the test
    argv = ["--storage-option", "AWS_SECRET_ACCESS_KEY=hush", "--storage-option", "AWS_REGION=r"]
    assert main([*argv, "--store", str(tmp_path / "s"), "topic", "list"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "AWS_SECRET_ACCESS_KEY" in err[0] and "MQ_STORAGE_" in err[0]
    assert "hush" not in err[0]
