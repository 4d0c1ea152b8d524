"""Independent readers agree with the engine across maintenance: every table read by delta-spark and by
DuckDB's delta extension (delta-kernel-rs) holds exactly what delta-rs reads, after appends,
compaction, retention, checkpoints and vacuum; time travel to versions before maintenance; and Delta
streams of the commit log and consume queue across maintenance (``skipChangeCommits``)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable

from engine import Admin, Message, Producer, Store
from engine.broker.compaction import compact
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.broker.maintenance import checkpoint, vacuum
from engine.broker.retention import retain
from engine.store import schemas
from engine.store.commit_log import writer as commit_log
from engine.store.consumer_offset import OffsetStore
from tests.test_native_delta import comparable, require_delta

pytestmark = pytest.mark.spark
HOUR_MS = 3_600_000


def duckdb_rows(uri: str) -> list[str]:
    """A table as DuckDB's delta extension (delta-kernel-rs) reads it, rows as sorted JSON text."""
    import duckdb
    import duckdb_ext

    (extension,) = Path(next(iter(duckdb_ext.__path__))).rglob("delta.duckdb_extension")
    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{extension}'")
        table = con.execute(f"SELECT * FROM delta_scan('{uri}')").arrow()
        return as_json(table.read_all() if isinstance(table, pa.RecordBatchReader) else table)
    finally:
        con.close()


def as_json(table: pa.Table) -> list[str]:
    return sorted(json.dumps(row, sort_keys=True, default=repr) for row in table.to_pylist())


def delta_rs_table(uri: str, version: int | None = None) -> pa.Table:
    return DeltaTable(uri, version=version).to_pyarrow_table()


def table_state(uri: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a reader of the table at ``uri`` reads: the files of its Delta log and its data files.
    Two readings of the same state prove nothing the first did not."""
    root = Path(uri)
    log = tuple(sorted(p.name for p in (root / "_delta_log").iterdir()))
    data = tuple(
        sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts)
    )
    return log, data


def as_rows(frame: Any, name: str) -> Any:
    """Each row of one table as (table, its row as JSON text): tables of different schemas compared
    in one go. Maps become JSON objects, which chispa can sort."""
    from pyspark.sql import functions as F

    return frame.select(F.lit(name).alias("table"), F.to_json(F.struct(*frame.columns)).alias("row"))


def assert_readers_agree(spark: Any, store: Store, stage: str, seen: dict[str, Any]) -> int:
    """delta-spark == delta-rs (chispa) and DuckDB == delta-rs for every table of ``store`` whose state
    changed since it was last compared (``seen``: table -> state, updated); returns how many."""
    from functools import reduce

    native_rows, expected_rows = [], []
    for name in schemas.SCHEMAS:
        uri = store.uri(name)
        state = table_state(uri)
        if seen.get(name) == state:
            continue
        seen[name] = state
        expected = delta_rs_table(uri)
        native = spark.read.format("delta").load(uri)
        assert native.columns == expected.column_names, (stage, name)
        reference = spark.createDataFrame(expected) if expected.num_rows else native.limit(0)
        types = [(f.name, f.dataType) for f in native.schema.fields]
        assert types == [(f.name, f.dataType) for f in reference.schema.fields], (stage, name)
        native_rows.append(as_rows(native, name))
        expected_rows.append(as_rows(reference, name))
        assert duckdb_rows(uri) == as_json(expected), (stage, name)
    if native_rows:
        assert_df_equality(
            reduce(lambda a, b: a.unionByName(b), native_rows),
            reduce(lambda a, b: a.unionByName(b), expected_rows),
            ignore_row_order=True,
            ignore_nullable=True,
        )
    return len(native_rows)


def _fill(store: Store, batches: int, old_hours: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if old_hours is not None:
        then = int(time.time() * 1000 - old_hours * HOUR_MS)
        monkeypatch.setattr(commit_log, "now_ms", lambda: then)
    with Producer(store) as p:
        for i in range(batches):
            p.send_batch(
                [
                    Message("T", f"{old_hours}-{i}-{j}".encode(), tags=f"t{j % 2}", keys=(f"k{i}-{j}",))
                    for j in range(6)
                ],
                queue_id=i % 2,
            )
            dispatch_pending(store)
    monkeypatch.undo()
    index_pending(store)


@pytest.fixture(scope="module")
def busy_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Topic T (2 queues): old messages (100 h), a consumer that consumed most of them, new ones.
    Built once per module; each test works on its own copy (:func:`busy`)."""
    root = tmp_path_factory.mktemp("interop") / "mqdata"
    store = Store.open(root)
    Admin(store).create_topic("T", 2)
    with pytest.MonkeyPatch.context() as patch:
        _fill(store, 6, 100, patch)
        _fill(store, 4, None, patch)
    OffsetStore(store, "g").commit([("T", 0, 12), ("T", 1, 9)])
    with Producer(store) as p:
        p.send(Message("T", b"props", properties={"a": "1", "b": "2"}))
    dispatch_pending(store)
    return root


@pytest.fixture
def busy(busy_template: Path, tmp_path: Path) -> Store:
    """A copy of the module's busy store, for this test alone (the tests run maintenance on it)."""
    copy = tmp_path / "mqdata"
    shutil.copytree(busy_template, copy)
    return Store.open(copy)


def test_spark_duckdb_and_delta_rs_read_the_same_rows_through_maintenance(spark: Any, busy: Store) -> None:
    require_delta(spark)
    store = busy
    seen: dict[str, Any] = {}
    assert assert_readers_agree(spark, store, "appended", seen) == len(schemas.SCHEMAS)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("compacted", lambda: compact(store, min_files=2)),
        ("retained", lambda: retain(store)),
        ("checkpointed", lambda: checkpoint(store)),
        ("vacuumed", lambda: vacuum(store, 0)),
    ]
    for stage, step in steps:
        step()
        # Only tables the step changed are read again (each step changes at least the commit log).
        assert assert_readers_agree(spark, store, stage, seen) >= 1, stage
    # Maintenance really happened: retention removed the consumed old messages.
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).to_pyarrow_table().num_rows < 6 * 6 + 4 * 6 + 1


def test_time_travel_reads_versions_from_before_compaction_and_retention(spark: Any, busy: Store) -> None:
    require_delta(spark)
    store = busy
    uri = store.uri(schemas.COMMIT_LOG)
    before = store.version(schemas.COMMIT_LOG)
    compact(store, min_files=2)
    retain(store)
    checkpoint(store)
    assert store.version(schemas.COMMIT_LOG) > before
    for version in (1, before // 2, before):
        old = spark.read.format("delta").option("versionAsOf", version).load(uri)
        sql = spark.sql(f"SELECT * FROM delta.`{uri}` VERSION AS OF {version}")
        expected = spark.createDataFrame(delta_rs_table(uri, version))
        assert_df_equality(comparable(old), comparable(expected), ignore_row_order=True, ignore_nullable=True)
        assert sql.count() == expected.count()


def _stream(spark: Any, uri: str, checkpoint_dir: Path, **options: str) -> list[int]:
    """One availableNow run of a Delta stream of ``uri`` (resuming from ``checkpoint_dir``); returns the
    physical offsets of the rows it delivered."""
    seen: list[int] = []

    def collect(batch: Any, batch_id: int) -> None:
        seen.extend(int(r.physical_offset) for r in batch.select("physical_offset").collect())

    reader = spark.readStream.format("delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load(uri)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint_dir))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return seen


@pytest.mark.parametrize("table", [schemas.COMMIT_LOG, schemas.CONSUME_QUEUE])
def test_a_delta_stream_reads_every_message_once_across_maintenance(
    spark: Any, busy: Store, table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_delta(spark)
    store = busy
    uri = store.uri(table)
    ckpt = tmp_path / "ckpt"
    first = _stream(spark, uri, ckpt, skipChangeCommits="true")
    compact(store, min_files=2)
    retain(store)
    checkpoint(store)
    _fill(store, 2, None, monkeypatch)  # new messages after maintenance
    second = _stream(spark, uri, ckpt, skipChangeCommits="true")
    offsets = first + second
    assert len(offsets) == len(set(offsets))  # compaction's rewrites (dataChange=false) are not re-read
    assert len(second) == 2 * 6
    everything = {r["physical_offset"] for r in delta_rs_table(uri).to_pylist()}
    assert everything - set(offsets) == set()  # what is still in the table was read exactly once


def test_without_skip_change_commits_a_delta_stream_stops_at_retention(
    spark: Any, busy: Store, tmp_path: Path
) -> None:
    require_delta(spark)
    store = busy
    uri = store.uri(schemas.COMMIT_LOG)
    ckpt = tmp_path / "ckpt"
    _stream(spark, uri, ckpt)
    assert retain(store)["rows_removed"] > 0
    with pytest.raises(Exception, match=r"(?i)delet|remov|update|change"):
        _stream(spark, uri, ckpt)
