"""Offsets by store time (reset by time) and replay of a topic by time, group and past version."""

from __future__ import annotations

import time
from typing import Any

import pytest
from chispa import assert_df_equality

from engine import Admin, InvalidArgumentError, OffsetOutOfRangeError, Store, StoreError, TopicNotFoundError
from engine.broker.dispatch import dispatch_pending
from engine.client.admin_offsets import QueueTimeIndex, offsets_for_time
from engine.spark import replay
from engine.spark.mq_options import ReadOptions
from engine.spark.mq_source import MQStreamReader, spark_message_schema
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log import writer as commit_log
from engine.store.commit_log.stamping import PendingMessage
from engine.store.consumer_offset import OffsetStore

# Store time -> (queue id, body) written at that time, one commit each.
LAYOUT: dict[int, list[tuple[int, str]]] = {
    1000: [(0, "a0"), (0, "a1"), (1, "b0")],
    2000: [(0, "a2"), (1, "b1"), (1, "b2")],
    3000: [(0, "a3"), (0, "a4")],
}
ROW_SCHEMA = "queue_id int, queue_offset long, body binary"


def _put(store: Store, monkeypatch: pytest.MonkeyPatch, ts: int, messages: list[tuple[int, str]]) -> int:
    """Commit messages to topic T with store time ``ts``; returns the commit-log version."""
    monkeypatch.setattr(commit_log, "now_ms", lambda: ts)
    stamped = CommitLogWriter(store).append(
        [PendingMessage("T", q, body.encode(), f"U-{body}") for q, body in messages]
    )
    return stamped[0].version


@pytest.fixture
def laid_out(store: Store, admin: Admin, monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """Topic T (2 queues) holding LAYOUT, one consume-queue file per time; time -> commit-log version."""
    admin.create_topic("T", 2)
    versions = {}
    for ts, messages in LAYOUT.items():
        versions[ts] = _put(store, monkeypatch, ts, messages)
        dispatch_pending(store)
    return versions


def _expected(spark: Any, bodies: set[str]) -> Any:
    rows, offsets = [], {0: 0, 1: 0}
    for messages in LAYOUT.values():
        for qid, body in messages:
            if body in bodies:
                rows.append((qid, offsets[qid], body.encode()))
            offsets[qid] += 1
    return spark.createDataFrame(rows, ROW_SCHEMA)


def _check(df: Any, expected: Any) -> None:
    actual = df.select("queue_id", "queue_offset", "body")
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


# ----------------------------------------------------------------- offsets by time, resets
@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        (0, {0: 0, 1: 0}),  # before every message: the min offsets
        (1000, {0: 0, 1: 0}),
        (1500, {0: 2, 1: 1}),
        (2000, {0: 2, 1: 1}),  # at the time counts
        (2500, {0: 3, 1: 3}),  # queue 1 has nothing later: its max offset
        (3001, {0: 5, 1: 3}),  # after every message: the max offsets
    ],
)
def test_offsets_for_time_are_the_first_stored_at_or_after_it(
    store: Store, laid_out: dict[int, int], ts: int, expected: dict[int, int]
) -> None:
    assert offsets_for_time(store, "T", ts) == expected


def test_a_stream_can_start_at_a_store_time(store: Store, laid_out: dict[int, int]) -> None:
    options = {"store": store.root, "topic": "T", "group": "g", "startingOffsets": "1500"}
    reader = MQStreamReader(ReadOptions.parse(options, streaming=True), spark_message_schema())
    assert reader.initialOffset() == {"q": {"0": 2, "1": 1}}
    assert OffsetStore(store, "g").read("T") == {("T", 0): 2, ("T", 1): 1}


def test_time_search_reads_few_files_not_the_whole_queue(
    store: Store, admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin.create_topic("T", 2)
    for i in range(12):
        _put(store, monkeypatch, 1000 * (i + 1), [(0, f"a{i}"), (1, f"b{i}")])
        dispatch_pending(store)
    index = QueueTimeIndex(store)
    assert index.offsets_for_time("T", 2, 6500) == {0: 6, 1: 6}
    assert index.files_read <= 2 * 2  # of 12 files, at most two per queue are opened


def test_reset_offset_by_time_commits_the_group_offsets(store: Store, laid_out: dict[int, int]) -> None:
    admin = Admin(store)
    OffsetStore(store, "g").commit([("T", 0, 5), ("T", 1, 3)])
    assert admin.reset_offset_by_time("g", "T", 1500) == {0: 2, 1: 1}
    assert OffsetStore(store, "g").read("T") == {("T", 0): 2, ("T", 1): 1}  # the newer rows win
    assert admin.reset_offset_by_time("g", "T", 0) == {0: 0, 1: 0}
    assert admin.reset_offset_by_time("g", "T", 10**13) == {0: 5, 1: 3}
    admin.reset_offset("g", "T", 1, 2)
    assert OffsetStore(store, "g").read("T") == {("T", 0): 5, ("T", 1): 2}


def test_resets_reject_bad_arguments(store: Store, laid_out: dict[int, int]) -> None:
    admin = Admin(store)
    before = store.version(schemas.CONSUMER_OFFSET)
    with pytest.raises(OffsetOutOfRangeError, match=r"holds offsets 0\.\.3"):
        admin.reset_offset("g", "T", 1, 4)
    with pytest.raises(InvalidArgumentError, match="queue_id 2 is out of range"):
        admin.reset_offset("g", "T", 2, 0)
    with pytest.raises(TopicNotFoundError):
        admin.reset_offset_by_time("g", "NOPE", 0)
    with pytest.raises(InvalidArgumentError, match="timestamp_ms"):
        admin.reset_offset_by_time("g", "T", -1)
    with pytest.raises(InvalidArgumentError, match="group"):
        admin.reset_offset_by_time("bad group", "T", 0)
    assert store.version(schemas.CONSUMER_OFFSET) == before


# ----------------------------------------------------------------- replay (Spark)
@pytest.mark.spark
def test_replay_returns_exactly_the_messages_stored_in_the_window(
    spark_reads: Any, store: Store, laid_out: dict[int, int]
) -> None:
    spark = spark_reads
    _check(replay(spark, store, "T", start=1500, end=3000), _expected(spark, {"a2", "b1", "b2"}))
    _check(replay(spark, store, "T", end=2000), _expected(spark, {"a0", "a1", "b0"}))
    everything = replay(spark, store, "T")
    assert everything.count() == 8
    assert dict(everything.dtypes)["store_ts"] == "timestamp"


@pytest.mark.spark
def test_replay_as_of_a_version_ignores_later_messages(
    spark_reads: Any, store: Store, laid_out: dict[int, int]
) -> None:
    spark = spark_reads
    as_of = replay(spark, store, "T", as_of_version=laid_out[2000])
    _check(as_of, _expected(spark, {"a0", "a1", "a2", "b0", "b1", "b2"}))
    _check(
        replay(spark, store, "T", start=1500, as_of_version=laid_out[2000]),
        _expected(spark, {"a2", "b1", "b2"}),
    )


@pytest.mark.spark
def test_replay_with_a_group_returns_only_what_it_consumed_then(
    spark_reads: Any, store: Store, admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark = spark_reads
    admin.create_topic("T", 2)
    first = _put(store, monkeypatch, 1000, LAYOUT[1000])
    OffsetStore(store, "g").commit([("T", 0, 1), ("T", 1, 1)])
    time.sleep(0.02)
    second = _put(store, monkeypatch, 2000, LAYOUT[2000])
    time.sleep(0.02)
    OffsetStore(store, "g").commit([("T", 0, 3)])  # queue 1 stays at 1
    _put(store, monkeypatch, 3000, LAYOUT[3000])
    dispatch_pending(store)
    _check(replay(spark, store, "T", group="g"), _expected(spark, {"a0", "a1", "a2", "b0"}))
    _check(replay(spark, store, "T", group="g", as_of_version=second), _expected(spark, {"a0", "b0"}))
    assert replay(spark, store, "T", group="never", as_of_version=first).count() == 0


def test_replay_arguments_are_checked_before_spark_runs(
    store: Store, laid_out: dict[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    spark: Any = None  # every error is raised before the session is touched
    latest = store.version(schemas.COMMIT_LOG)
    with pytest.raises(InvalidArgumentError, match="after the commit log's latest version"):
        replay(spark, store, "T", as_of_version=latest + 1)
    with pytest.raises(InvalidArgumentError, match="before start"):
        replay(spark, store, "T", start=3000, end=1000)
    with pytest.raises(InvalidArgumentError, match="start"):
        replay(spark, store, "T", start=-5)
    with pytest.raises(InvalidArgumentError, match="as_of_version"):
        replay(spark, store, "T", as_of_version=-1)
    with pytest.raises(TopicNotFoundError):
        replay(spark, store, "NOPE")
    undispatched = _put(store, monkeypatch, 4000, [(0, "late")])
    with pytest.raises(StoreError, match="run the dispatch job first"):
        replay(spark, store, "T", as_of_version=undispatched)
