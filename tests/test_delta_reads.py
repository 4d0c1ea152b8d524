"""Reads through Delta on Spark: native replay and views with data skipping, time travel, history,
the catalog helper; and the statistics the store keeps for skipping."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable

from engine import Admin, InvalidArgumentError, Message, Producer, Store, StoreError
from engine.broker.compaction import compact
from engine.broker.dispatch import dispatch_pending
from engine.spark import register_views, replay
from engine.spark.delta_reads import history, register_tables, table_as_of
from engine.spark.session import DELTA_READS
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log import writer as commit_log
from engine.store.commit_log.stamping import PendingMessage
from engine.store.delta import FileStats
from engine.store.delta import log as log_module
from engine.store.delta.log import last_checkpoint_version, read_versions
from tests.test_native_delta import comparable, require_delta

# Store time -> messages (queue id, body, tag), one commit-log commit (one file) each.
BATCHES: dict[int, list[tuple[int, str, str]]] = {
    1000: [(0, "a0", "A"), (1, "b0", "B"), (0, "a1", "B")],
    2000: [(1, "b1", "A"), (0, "a2", "A")],
    3000: [(0, "a3", "B"), (1, "b2", "A"), (1, "b3", "B")],
}


def _put(store: Store, monkeypatch: pytest.MonkeyPatch, topic: str, ts: int, rows: list[Any]) -> int:
    monkeypatch.setattr(commit_log, "now_ms", lambda: ts)
    stamped = CommitLogWriter(store).append(
        [PendingMessage(topic, q, body.encode(), f"U-{topic}-{body}", tags=tag) for q, body, tag in rows]
    )
    monkeypatch.undo()
    return stamped[0].version


@pytest.fixture
def batches(store: Store, admin: Admin, monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """Topics T (2 queues, BATCHES) and OTHER (1 queue, a file per batch too), all dispatched;
    store time -> T's commit-log version."""
    admin.create_topic("T", 2)
    admin.create_topic("OTHER", 1)
    versions = {}
    for ts, rows in BATCHES.items():
        versions[ts] = _put(store, monkeypatch, "T", ts, rows)
        _put(store, monkeypatch, "OTHER", ts, [(0, f"o{ts}", "A")])
        dispatch_pending(store)
    return versions


def files_read(spark: Any, frame: Any) -> int:
    """Run ``frame`` and return how many data files its scans opened (Spark's scan metrics)."""
    plan = frame._jdf.queryExecution().executedPlan()
    plan.executeCollect()  # this plan instance, so that its metrics are the ones read below
    total = 0
    nodes = plan.collectLeaves()
    for i in range(nodes.size()):
        metrics = nodes.apply(i).metrics()
        if metrics.contains("numFiles"):
            total += int(metrics.apply("numFiles").value())
    return total


def test_the_commit_log_keeps_statistics_on_offsets_topic_and_both_times(store: Store, topic: str) -> None:
    with Producer(store) as p:
        p.send_batch([Message(topic, b"x" * 10, tags="A", properties={"k": "v"}) for _ in range(3)])
    dispatch_pending(store)
    for _ in range(2):
        with Producer(store) as p:
            p.send(Message(topic, b"y"))
        dispatch_pending(store)
    compact(store, schemas.COMMIT_LOG, min_files=2)  # the engine's own rewrite keeps the same stats
    raw = [
        json.loads(line)["add"]["stats"]
        for f in sorted((Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log").glob("*.json"))
        for line in f.read_text().splitlines()
        if '"add"' in line
    ]
    assert len(raw) >= 4  # three appends and a compaction
    for text in raw:
        mins = json.loads(text)["minValues"]
        assert {"topic", "queue_id", "queue_offset", "physical_offset", "store_ts_ms", "born_ts_ms"} <= set(
            mins
        )
        assert not {"body", "keys", "properties", "sys_flag"} & set(mins)


@pytest.mark.spark
def test_native_replay_equals_the_mq_source_row_for_row(spark: Any, store: Store, batches: Any) -> None:
    require_delta(spark)
    cases = [dict(), dict(start=1500), dict(start=1500, end=3000, expression="A"), dict(expression="B || A")]
    for case in cases:
        native = replay(spark, store, "T", **case)
        spark.conf.set(DELTA_READS, "false")
        try:
            ours = replay(spark, store, "T", **case)
            assert "mq" in str(ours._jdf.queryExecution().analyzed().toString()).lower()
            assert_df_equality(
                comparable(native), comparable(ours), ignore_row_order=True, ignore_nullable=True
            )
        finally:
            spark.conf.set(DELTA_READS, "true")
        assert native.schema == ours.schema or [f.name for f in native.schema] == [
            f.name for f in ours.schema
        ]


@pytest.mark.spark
def test_replay_of_a_window_opens_only_the_files_stored_in_it(spark: Any, store: Store, batches: Any) -> None:
    require_delta(spark)
    window = replay(spark, store, "T", start=2000, end=3000)
    assert sorted(r.body.decode() for r in window.collect()) == ["a2", "b1"]
    assert files_read(spark, window) == 1  # of T's 3 files and OTHER's 3


@pytest.mark.spark
def test_a_topic_filter_on_the_messages_view_skips_other_topics_files(
    spark: Any, store: Store, batches: Any
) -> None:
    require_delta(spark)
    register_views(spark, store, ["messages"])
    other = spark.sql("SELECT body FROM messages WHERE topic = 'OTHER' AND store_ts_ms >= 2000")
    assert sorted(r.body.decode() for r in other.collect()) == ["o2000", "o3000"]
    # 2 commit-log files (OTHER's of 2000 and 3000) and the consume queue's files of those times
    # (3 dispatches of both topics: the filter inferred across the join skips the first one).
    assert files_read(spark, other) <= 4


@pytest.mark.spark
def test_every_table_travels_in_time_by_version_and_timestamp(
    spark: Any, store: Store, batches: dict[int, int]
) -> None:
    require_delta(spark)
    first = batches[1000]
    old = table_as_of(spark, store, schemas.COMMIT_LOG, version=first)
    assert sorted(r.body.decode() for r in old.collect()) == ["a0", "a1", "b0"]
    sql = spark.sql(
        f"SELECT count(*) AS n FROM delta.`{store.uri(schemas.COMMIT_LOG)}` VERSION AS OF {first}"
    )
    assert sql.collect()[0].n == 3
    for name in schemas.SCHEMAS:
        rows = history(spark, store, name).collect()
        latest = store.version(name)
        assert [r.version for r in rows] == list(range(latest, -1, -1)), name
        assert rows[-1].operation == "CREATE TABLE"
        now = rows[0].timestamp.strftime("%Y-%m-%d %H:%M:%S.%f")
        assert (
            table_as_of(spark, store, name, timestamp=now).count()
            == table_as_of(spark, store, name, version=latest).count()
        )


def test_time_travel_arguments_are_checked(store: Store) -> None:
    spark: Any = None  # checked before the session is touched
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        table_as_of(spark, store, schemas.COMMIT_LOG)
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        table_as_of(spark, store, schemas.COMMIT_LOG, version=1, timestamp="2026-01-01")
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        table_as_of(spark, store, schemas.COMMIT_LOG, version=-1)
    with pytest.raises(InvalidArgumentError, match="unknown table"):
        table_as_of(spark, store, "nope", version=0)
    with pytest.raises(InvalidArgumentError, match="unknown table"):
        history(spark, store, "nope")


@pytest.mark.spark
def test_registered_tables_read_the_store_in_a_catalog_database(
    spark: Any, store: Store, batches: Any, tmp_path: Path
) -> None:
    require_delta(spark)
    database = f"lakemq_{tmp_path.name.replace('-', '_')}"[:100]
    assert register_tables(spark, store, database, [schemas.COMMIT_LOG, schemas.TOPICS]) == [
        f"{database}.commit_log",
        f"{database}.topics",
    ]
    assert spark.table(f"{database}.commit_log").count() == 8 + 3
    with Producer(store) as p:
        p.send(Message("T", b"later"))
    assert spark.table(f"{database}.commit_log").count() == 12  # it follows the table
    # Registering again leaves the entries as they are.
    assert register_tables(spark, store, database, [schemas.COMMIT_LOG]) == [f"{database}.commit_log"]
    spark.sql(f"DROP DATABASE {database} CASCADE")
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).version() == store.version(schemas.COMMIT_LOG)


def test_register_tables_rejects_a_bad_database_or_table(store: Store) -> None:
    spark: Any = None
    with pytest.raises(InvalidArgumentError, match="identifier"):
        register_tables(spark, store, "bad-name; DROP")
    with pytest.raises(InvalidArgumentError, match="unknown table"):
        register_tables(spark, store, "ok", ["nope"])


@pytest.mark.spark
def test_delta_only_reads_refuse_a_session_without_delta(spark: Any, store: Store) -> None:
    spark.conf.set(DELTA_READS, "false")
    try:
        with pytest.raises(StoreError, match="needs Delta on Spark"):
            history(spark, store, schemas.COMMIT_LOG)
        with pytest.raises(StoreError, match="needs Delta on Spark"):
            register_tables(spark, store)
    finally:
        spark.conf.set(DELTA_READS, "true")


def test_the_checkpoint_hint_is_read_again_once_it_changes(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    assert last_checkpoint_version(str(tmp_path)) is None
    (log / "_last_checkpoint").write_text('{"version": 10, "size": 3}')
    assert last_checkpoint_version(str(tmp_path)) == 10
    assert last_checkpoint_version(str(tmp_path)) == 10  # unchanged: kept
    replacement = log / "_last_checkpoint.tmp"
    replacement.write_text('{"version": 2000, "size": 3}')
    replacement.replace(log / "_last_checkpoint")  # as a checkpoint writes it
    assert last_checkpoint_version(str(tmp_path)) == 2000
    (log / "_last_checkpoint").unlink()
    assert last_checkpoint_version(str(tmp_path)) is None


def test_a_read_of_some_columns_of_the_versions_is_the_same_rows_as_a_whole_read(store: Store) -> None:
    Admin(store).create_topic("Cols", 2)
    with Producer(store) as producer:
        for i in range(5):
            producer.send(Message("Cols", b"b%d" % i, tags="A", keys=[f"k{i}"]), queue_id=i % 2)
    uri = store.uri(schemas.COMMIT_LOG)
    latest = store.version(schemas.COMMIT_LOG)
    names = ["queue_offset", "topic", "keys"]  # in another order than the file's
    some = pa.schema([schemas.COMMIT_LOG_SCHEMA.field(n) for n in names])
    whole = read_versions(uri, 0, latest, schemas.COMMIT_LOG_SCHEMA)
    part = read_versions(uri, 0, latest, some)
    assert part.schema.names == [*names, "_version"]
    assert part.to_pylist() == whole.select([*names, "_version"]).to_pylist()


def test_versions_read_come_in_one_chunk_unless_they_are_big(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Readers filter, take and sort what they read; each of those costs per chunk.
    Admin(store).create_topic("Chunks", 1)
    with Producer(store) as producer:
        for i in range(5):
            producer.send(Message("Chunks", b"b%d" % i))
    uri, latest = store.uri(schemas.COMMIT_LOG), store.version(schemas.COMMIT_LOG)
    rows = read_versions(uri, 0, latest, schemas.COMMIT_LOG_SCHEMA)
    assert rows["body"].to_pylist() == [b"b%d" % i for i in range(5)]
    assert {rows[c].num_chunks for c in rows.column_names} == {1}
    monkeypatch.setattr(log_module, "ONE_CHUNK_BYTES", 0)  # bigger than that: left as read
    chunked = read_versions(uri, 0, latest, schemas.COMMIT_LOG_SCHEMA)
    assert chunked["body"].num_chunks == 5 and chunked.equals(rows)


def test_file_statistics_name_only_the_files_whose_range_holds_a_wanted_offset() -> None:
    # Four files of one physical-offset line; a queue's messages lie in the first and third.
    stats = FileStats(
        3,
        ["a", "b", "c", "d", "unknown"],
        {
            "min.physical_offset": np.array([0, 32, 64, 96, np.iinfo(np.int64).min]),
            "max.physical_offset": np.array([31, 63, 95, 127, np.iinfo(np.int64).max]),
        },
    )
    wanted = np.array([5, 6, 70, 71])
    assert stats.holding("physical_offset", wanted) == ["a", "c", "unknown"]
    assert stats.overlapping("physical_offset", 5, 71) == ["a", "b", "c", "unknown"]
    assert stats.holding("physical_offset", np.array([200])) == ["unknown"]
    assert FileStats(3, ["a"]).holding("physical_offset", wanted) == ["a"]  # no statistics: kept


def test_versions_of_a_local_table_made_again_under_the_same_path_are_read_anew(tmp_path: Path) -> None:
    bodies = []
    for body in (b"first life", b"second life"):
        store = Store.open(tmp_path / "again")
        Admin(store).create_topic("Again", 1)
        with Producer(store) as producer:
            producer.send(Message("Again", body), queue_id=0)
        uri = store.uri(schemas.COMMIT_LOG)
        rows = read_versions(uri, 0, store.version(schemas.COMMIT_LOG), schemas.COMMIT_LOG_SCHEMA)
        bodies.append(rows["body"].to_pylist())
        shutil.rmtree(tmp_path / "again")
    assert bodies == [[b"first life"], [b"second life"]]
