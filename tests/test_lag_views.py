"""Consumer lag (store level, ``mq lag``, the ``lag`` view) and the operational SQL views."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from engine import Admin, InvalidArgumentError, Store, TopicConfig
from engine.broker.dispatch import dispatch_pending
from engine.cli import main
from engine.client.admin_offsets import QueueLag, lag_rows
from engine.spark import register_views
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log import writer as commit_log
from engine.store.commit_log.stamping import PendingMessage
from engine.store.consumer_offset import OffsetStore

LAG_COLUMNS = "group string, consumer_id string, topic string, queue_id int, max_offset long, "
LAG_COLUMNS += "committed_offset long, lag long"


def _put(store: Store, topic: str, queue_id: int, n: int, ts: int | None = None) -> None:
    messages = [
        PendingMessage(topic, queue_id, f"{topic}-{queue_id}-{i}".encode(), f"U{i}") for i in range(n)
    ]
    if ts is None:
        CommitLogWriter(store).append(messages)
    else:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(commit_log, "now_ms", lambda: ts)
            CommitLogWriter(store).append(messages)


@pytest.fixture
def behind(store: Store, admin: Admin) -> Store:
    """Topic T: queue 0 holds 5 messages (store time 1000), queue 1 holds 3 (2000).

    Group g committed queue 0 at 2 (and never queue 1); group done is caught up; the broadcasting
    instance c1 of group b is at 1 on queue 1.
    """
    admin.create_topic("T", 2)
    _put(store, "T", 0, 5, ts=1000)
    _put(store, "T", 1, 3, ts=2000)
    dispatch_pending(store)
    OffsetStore(store, "g").commit([("T", 0, 1)])
    OffsetStore(store, "g").commit([("T", 0, 2)])  # the newer row wins
    OffsetStore(store, "done").commit([("T", 0, 5), ("T", 1, 3)])
    OffsetStore(store, "b", consumer_id="c1").commit([("T", 1, 1)])
    return store


HAND_COUNT = [
    ("b", "c1", "T", 0, 5, None, 5),
    ("b", "c1", "T", 1, 3, 1, 2),
    ("done", "", "T", 0, 5, 5, 0),
    ("done", "", "T", 1, 3, 3, 0),
    ("g", "", "T", 0, 5, 2, 3),
    ("g", "", "T", 1, 3, None, 3),
]


def test_lag_rows_match_a_hand_count(behind: Store) -> None:
    rows = lag_rows(behind, now=10_000)
    assert [
        (r.group, r.consumer_id, r.topic, r.queue_id, r.max_offset, r.committed_offset, r.lag) for r in rows
    ] == HAND_COUNT
    ages = {(r.group, r.queue_id): r.oldest_unconsumed_age_ms for r in rows if r.consumer_id == ""}
    assert ages == {("done", 0): None, ("done", 1): None, ("g", 0): 9_000, ("g", 1): 8_000}
    assert lag_rows(behind, "g", now=10_000) == [r for r in rows if r.group == "g"]
    first = Admin(behind).consumer_lag("done")[0]
    assert first == QueueLag("done", "", "T", 0, 5, 5, 0, None, first.last_commit_ts_ms)
    assert first.last_commit_ts_ms is not None


def test_lag_rows_reject_a_bad_group_and_are_empty_without_offsets(store: Store, admin: Admin) -> None:
    with pytest.raises(InvalidArgumentError, match="group"):
        lag_rows(store, "bad group")
    assert lag_rows(store) == []


def test_mq_lag_prints_the_table(
    behind: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MQ_STORE", raising=False)
    assert main(["lag", "--group", "g", "--store", behind.root]) == 0
    out = capsys.readouterr().out
    assert "lag: 6 message(s) behind" in out
    assert "oldest_unconsumed_age_ms" in out and "committed_offset" in out
    assert main(["lag", "--group", "nobody", "--store", behind.root]) == 0
    assert "no committed offsets for group nobody" in capsys.readouterr().out
    assert main(["lag", "--group", "bad group", "--store", behind.root]) == 2
    assert capsys.readouterr().err.startswith("mq: error: group 'bad group'")


# ----------------------------------------------------------------- views (Spark)
@pytest.mark.spark
def test_lag_view_matches_the_hand_count(spark: Any, behind: Store) -> None:
    register_views(spark, behind, ["lag"])
    actual = spark.sql("SELECT * FROM lag")
    expected = spark.createDataFrame(HAND_COUNT, LAG_COLUMNS)
    assert_df_equality(
        actual.drop("oldest_unconsumed_age_ms"), expected, ignore_row_order=True, ignore_nullable=True
    )
    ages = {
        (r.group, r.queue_id): r.oldest_unconsumed_age_ms for r in actual.where("consumer_id = ''").collect()
    }
    assert ages[("done", 0)] is None and ages[("done", 1)] is None
    assert ages[("g", 0)] > ages[("g", 1)] > 0  # queue 0's first unconsumed message is older
    OffsetStore(behind, "g").commit([("T", 1, 3)])  # the view follows the tables
    assert spark.sql("SELECT lag FROM lag WHERE `group` = 'g' AND queue_id = 1").collect()[0].lag == 0


@pytest.mark.spark
def test_consumer_offsets_and_topics_views_keep_the_latest_row(spark: Any, behind: Store) -> None:
    behind.put_topic(TopicConfig("Gone", 1))
    behind.put_topic(TopicConfig("Gone", 0))  # a deletion marker
    register_views(spark, behind, ["consumer_offsets", "topics"])
    offsets = spark.sql("SELECT `group`, topic, queue_id, consumer_id, offset FROM consumer_offsets")
    expected = spark.createDataFrame(
        [("g", "T", 0, "", 2), ("done", "T", 0, "", 5), ("done", "T", 1, "", 3), ("b", "T", 1, "c1", 1)],
        "group string, topic string, queue_id int, consumer_id string, offset long",
    )
    assert_df_equality(offsets, expected, ignore_row_order=True, ignore_nullable=True)
    assert [(r.name, r.queues) for r in spark.sql("SELECT name, queues FROM topics").collect()] == [("T", 2)]


@pytest.mark.spark
def test_dlq_pull_log_and_action_log_views(spark: Any, store: Store, admin: Admin, tmp_path: Path) -> None:
    store.put_topic(TopicConfig("%DLQ%orders", 1))
    admin.create_topic("T", 1)
    _put(store, "%DLQ%orders", 0, 2)
    _put(store, "T", 0, 1)
    dispatch_pending(store)
    row = {
        "group": "g",
        "consumer_id": "c",
        "sequence": 0,
        "action": "PULL",
        "topic": "T",
        "queue_id": 0,
        "queue_offset": 0,
        "physical_offset": 0,
        "msg_id": None,
        "reconsume_times": 0,
        "deadline_ms": None,
        "ts_ms": 1,
    }
    store.append(schemas.ACTION_LOG, pa.Table.from_pylist([row], schema=schemas.ACTION_LOG_SCHEMA))
    register_views(spark, store, ["dlq", "pull_log", "action_log"])
    dlq = spark.sql("SELECT `group`, topic, queue_offset, body FROM dlq")
    expected = spark.createDataFrame(
        [("orders", "%DLQ%orders", i, f"%DLQ%orders-0-{i}".encode()) for i in range(2)],
        "group string, topic string, queue_offset long, body binary",
    )
    assert_df_equality(dlq, expected, ignore_row_order=True, ignore_nullable=True)
    assert spark.table("action_log").count() == 1
    assert spark.table("pull_log").columns == schemas.PULL_LOG_SCHEMA.names
