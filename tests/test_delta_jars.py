"""The Delta jars: the coordinate matching pyspark and delta-spark, the cache, and a failed fetch."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pyspark
import pytest

from engine import ConfigError
from engine.spark import delta_jars as jars
from engine.spark.session import DELTA_READS, _with_delta


def test_the_coordinate_names_sparks_major_minor_and_delta_sparks_version() -> None:
    assert jars.delta_coordinate("4.2.0", "4.4.0") == "io.delta:delta-spark_4.2_2.13:4.4.0"
    assert jars.delta_coordinate("4.1.3", "4.3.1") == "io.delta:delta-spark_4.1_2.13:4.3.1"


def test_the_default_coordinate_is_the_installed_pair() -> None:
    spark_mm = ".".join(pyspark.__version__.split(".")[:2])
    delta = importlib.metadata.version("delta-spark")
    assert jars.delta_coordinate() == f"io.delta:delta-spark_{spark_mm}_2.13:{delta}"


@pytest.mark.parametrize(
    ("spark_version", "delta_version"), [("4", "4.4.0"), ("x.y", "4.4.0"), ("4.2.0", "")]
)
def test_a_version_without_major_minor_is_a_config_error(spark_version: str, delta_version: str) -> None:
    with pytest.raises(ConfigError, match="cannot derive"):
        jars.delta_coordinate(spark_version, delta_version)


def test_the_cache_is_beside_the_virtualenv_unless_mq_jars_dir_moves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MQ_JARS_DIR", raising=False)
    assert jars.jars_dir().name == "lakemq-jars"
    monkeypatch.setenv("MQ_JARS_DIR", str(tmp_path))
    assert jars.jars_dir() == tmp_path


def test_cached_jars_need_a_manifest_whose_every_jar_exists(tmp_path: Path) -> None:
    coordinate = "io.delta:delta-spark_4.2_2.13:4.4.0"
    assert jars.cached_jars(coordinate, tmp_path) is None
    cache = tmp_path / coordinate.replace(":", "_")
    cache.mkdir()
    a, b = cache / "a.jar", cache / "b.jar"
    a.write_bytes(b"jar")
    (cache / "jars.txt").write_text(f"{a}\n{b}\n")
    assert jars.cached_jars(coordinate, tmp_path) is None  # b.jar is missing: fetch again
    b.write_bytes(b"jar")
    found = jars.cached_jars(coordinate, tmp_path)
    assert found == jars.DeltaJars(coordinate, (a, b))
    assert found.spark_jars == f"{a},{b}"


def test_mq_delta_off_turns_delta_off_without_fetching(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQ_DELTA", "off")
    assert jars.delta_disabled()
    assert jars.delta_jars() is None
    assert _with_delta({"spark.master": "local[1]"}) == {"spark.master": "local[1]", DELTA_READS: "false"}


@pytest.mark.spark
def test_a_failed_fetch_says_so_in_one_line_and_is_not_retried_in_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = "io.delta:no-such-artifact-lakemq_4.2_2.13:0.0.1"
    monkeypatch.setenv("MQ_JARS_DIR", str(tmp_path))
    monkeypatch.delenv("MQ_DELTA", raising=False)
    monkeypatch.setattr(jars, "delta_coordinate", lambda: bogus)
    monkeypatch.setattr(jars, "_failed", {})
    with pytest.raises(ConfigError, match="could not fetch"):
        jars.fetch_jars(bogus, tmp_path, timeout_s=300)
    capsys.readouterr()
    assert jars.delta_jars() is None
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("lakemq: Delta on Spark is off (could not fetch io.delta:no-such-artifact")
    assert len([line for line in lines if "Delta on Spark is off" in line]) == 1
    assert jars.delta_jars() is None  # not fetched again: nothing more said
    assert capsys.readouterr().err == ""
    assert jars.cached_jars(bogus, tmp_path) is None
