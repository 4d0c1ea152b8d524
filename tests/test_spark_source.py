"""The ``deltalog`` data source: snapshots, version ranges and streams over a Delta table's log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

from engine import ConfigError, InvalidArgumentError, Message, Producer, Store
from engine.spark import session
from engine.spark.deltalog import DeltaLogStreamReader, LogOptions, VersionRange, spark_schema, table_schema
from engine.spark.session import read_spark_defaults, spark_settings
from engine.store import schemas

ROW_SCHEMA = "id long, name string, _version long"


def _log_table(tmp_path: Path) -> tuple[str, dict[int, list[tuple[int, str]]]]:
    """A table whose versions 0-2 add rows, 3 is a compaction (dataChange=false), 4 adds rows."""
    uri = str(tmp_path / "t")
    added: dict[int, list[tuple[int, str]]] = {}
    for version, ids in enumerate([[1, 2], [3], [4, 5, 6]]):
        rows = [(i, f"n{i}") for i in ids]
        write_deltalake(
            uri, pa.table({"id": [r[0] for r in rows], "name": [r[1] for r in rows]}), mode="append"
        )
        added[version] = rows
    dt = DeltaTable(uri)
    dt.optimize.compact()
    assert dt.version() == 3
    write_deltalake(uri, pa.table({"id": [7], "name": ["n7"]}), mode="append")
    added[4] = [(7, "n7")]
    return uri, added


def _expected(spark: Any, added: dict[int, list[tuple[int, str]]], versions: range | None = None) -> Any:
    rows = [(i, n, v) for v, rs in added.items() if versions is None or v in versions for i, n in rs]
    return spark.createDataFrame(rows, ROW_SCHEMA)


def _stream_batches(spark: Any, reader: Any, checkpoint: Path) -> list[list[tuple[int, str, int]]]:
    """Run a stream with Trigger.AvailableNow; the rows of each micro-batch, in batch order."""
    batches: list[list[tuple[int, str, int]]] = []

    def collect(df: Any, batch_id: int) -> None:
        batches.append(sorted((r.id, r.name, r._version) for r in df.collect()))

    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return batches


# ----------------------------------------------------------------- without a JVM


def test_options_are_validated() -> None:
    with pytest.raises(InvalidArgumentError, match="path"):
        LogOptions.parse({})
    with pytest.raises(InvalidArgumentError, match="startingVersion"):
        LogOptions.parse({"path": "/x", "startingversion": "one"})
    with pytest.raises(InvalidArgumentError, match="before"):
        LogOptions.parse({"path": "/x", "startingVersion": "5", "endingVersion": "2"})
    with pytest.raises(InvalidArgumentError, match="storageOptions"):
        LogOptions.parse({"path": "/x", "storageOptions": "{nope"})
    opts = LogOptions.parse({"PATH": "/x", "maxVersionsPerTrigger": "3", "columns": "a, b"})
    assert (opts.path, opts.max_versions_per_trigger, opts.columns) == ("/x", 3, ("a", "b"))


def test_stream_offsets_are_versions_capped_by_limit_and_available_now_target(tmp_path: Path) -> None:
    uri, _ = _log_table(tmp_path)
    opts = LogOptions.parse({"path": uri, "maxVersionsPerTrigger": "2"})
    reader = DeltaLogStreamReader(opts, spark_schema(table_schema(opts)), table_schema(opts))
    start = reader.initialOffset()
    assert start == {"version": -1}
    assert reader.getDefaultReadLimit() == ReadMaxFiles(2)
    assert reader.latestOffset(start, ReadMaxFiles(2)) == {"version": 1}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"version": 4}
    assert list(reader.partitions({"version": 1}, {"version": 4})) == [VersionRange(2, 4)]
    assert list(reader.partitions({"version": 4}, {"version": 4})) == []
    reader.prepareForTriggerAvailableNow()
    write_deltalake(uri, pa.table({"id": [8], "name": ["n8"]}), mode="append")
    assert reader.latestOffset({"version": 4}, ReadAllAvailable()) == {"version": 4}


def test_commit_log_schema_is_the_table_schema_plus_version(store: Store) -> None:
    schema = spark_schema(table_schema(LogOptions.parse({"path": store.uri(schemas.COMMIT_LOG)})))
    assert schema.fieldNames() == [*schemas.COMMIT_LOG_SCHEMA.names, "_version"]
    assert schema["body"].dataType.simpleString() == "binary"
    assert schema["properties"].dataType.simpleString() == "map<string,string>"


def test_spark_defaults_file_is_parsed_and_log4j_is_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "spark-defaults.conf").write_text(
        "# comment\n\nspark.master   local[3]\nspark.sql.shuffle.partitions=3\n"
        "spark.driver.extraJavaOptions -Dx=1\n"
    )
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = warn\n")
    monkeypatch.setenv("MQ_CONF_DIR", str(tmp_path))
    settings = spark_settings({"spark.sql.shuffle.partitions": "5"})
    assert settings["spark.master"] == "local[3]"
    assert settings["spark.sql.shuffle.partitions"] == "5"  # explicit conf wins over the file
    assert settings["spark.ui.enabled"] == "false"
    assert settings["spark.driver.extraJavaOptions"] == (
        f"-Dx=1 -Dlog4j2.configurationFile={(tmp_path / 'log4j2.properties').resolve()}"
    )
    (tmp_path / "spark-defaults.conf").write_text("spark.master\n")
    with pytest.raises(ConfigError, match=r"spark-defaults\.conf:1"):
        read_spark_defaults(tmp_path / "spark-defaults.conf")


def test_project_spark_defaults_parse() -> None:
    settings = read_spark_defaults(Path(__file__).resolve().parent.parent / "conf" / "spark-defaults.conf")
    assert settings["spark.master"] == "local[2]"
    assert settings["spark.sql.execution.arrow.pyspark.enabled"] == "true"


def test_session_without_java_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(
        ConfigError, match=r"install Java 17 \(e\.g\. apt-get install openjdk-17-jre-headless\)"
    ):
        session(app_name="no-java")


# ----------------------------------------------------------------- batch


@pytest.mark.spark
def test_batch_version_range_returns_rows_of_each_version_skipping_compaction(
    spark: Any, tmp_path: Path
) -> None:
    uri, added = _log_table(tmp_path)
    df = spark.read.format("deltalog").option("path", uri).option("startingVersion", "0").load()
    assert_df_equality(df, _expected(spark, added), ignore_row_order=True, ignore_nullable=True)
    ranged = (
        spark.read.format("deltalog")
        .option("path", uri)
        .option("startingVersion", "1")
        .option("endingVersion", "3")
        .option("versionsPerPartition", "1")
        .load()
    )
    assert_df_equality(
        ranged, _expected(spark, added, range(1, 4)), ignore_row_order=True, ignore_nullable=True
    )


@pytest.mark.spark
def test_batch_snapshot_returns_current_rows_once(spark: Any, tmp_path: Path) -> None:
    uri, added = _log_table(tmp_path)
    df = spark.read.format("deltalog").option("path", uri).load()
    expected = spark.createDataFrame([(i, n, -1) for rs in added.values() for i, n in rs], ROW_SCHEMA)
    assert_df_equality(df, expected, ignore_row_order=True, ignore_nullable=True)
    only_ids = spark.read.format("deltalog").option("path", uri).option("columns", "id").load()
    assert only_ids.columns == ["id", "_version"]
    assert sorted(r.id for r in only_ids.collect()) == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.spark
def test_commit_log_rows_read_back_with_their_types(spark: Any, store: Store, topic: str) -> None:
    with Producer(store) as p:
        sent = p.send(Message(topic, b"\x00body", tags="A", keys=["k1"], properties={"p": "v"}), queue_id=1)
    row = spark.read.format("deltalog").option("path", store.uri(schemas.COMMIT_LOG)).load().collect()[0]
    assert (row.msg_id, row.queue_id, row.queue_offset, row.physical_offset) == (
        sent.offset_msg_id,
        1,
        0,
        sent.physical_offset,
    )
    assert (bytes(row.body), row.tags, row["keys"], row.properties["p"], row._version) == (
        b"\x00body",
        "A",
        ["k1"],
        "v",
        -1,
    )


# ----------------------------------------------------------------- streaming


@pytest.mark.spark
def test_stream_available_now_returns_each_version_once_with_version(spark: Any, tmp_path: Path) -> None:
    uri, _ = _log_table(tmp_path)
    reader = spark.readStream.format("deltalog").option("path", uri).option("maxVersionsPerTrigger", "2")
    batches = _stream_batches(spark, reader, tmp_path / "cp")
    # Versions 0-1, 2-3 (3 is the compaction: no rows), 4.
    assert batches == [
        [(1, "n1", 0), (2, "n2", 0), (3, "n3", 1)],
        [(4, "n4", 2), (5, "n5", 2), (6, "n6", 2)],
        [(7, "n7", 4)],
    ]
    # Restarted on its checkpoint, the stream reads only what was committed since.
    write_deltalake(uri, pa.table({"id": [8], "name": ["n8"]}), mode="append")
    assert _stream_batches(spark, reader, tmp_path / "cp") == [[(8, "n8", 5)]]


@pytest.mark.spark
def test_stream_starting_version_skips_earlier_versions(spark: Any, tmp_path: Path) -> None:
    uri, _ = _log_table(tmp_path)
    reader = spark.readStream.format("deltalog").option("path", uri).option("startingVersion", "2")
    rows = [r for batch in _stream_batches(spark, reader, tmp_path / "cp") for r in batch]
    assert rows == [(4, "n4", 2), (5, "n5", 2), (6, "n6", 2), (7, "n7", 4)]
