"""SQL views over a store: commit_log, consume_queue and messages (dispatched messages with bodies)."""

from __future__ import annotations

from typing import Any

import pytest
from chispa import assert_df_equality

from engine import InvalidArgumentError, Message, Producer, SendResult, Store, SysFlag
from engine.broker.dispatch import dispatch_pending
from engine.spark import register_views
from engine.spark.views import VIEWS
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.stamping import PendingMessage

pytestmark = pytest.mark.spark

MESSAGE_SCHEMA = (
    "topic string, queue_id int, queue_offset long, physical_offset long, msg_id string, "
    "offset_msg_id string, tags string, body binary"
)


def _send(store: Store, topic: str) -> list[tuple[Message, SendResult]]:
    messages = [Message(topic, f"body-{i}".encode(), tags="TagA" if i % 2 else "TagB") for i in range(6)]
    with Producer(store) as p:
        return [(m, p.send(m)) for m in messages]


def test_messages_view_has_every_dispatched_message_with_its_body(
    spark: Any, store: Store, topic: str
) -> None:
    sent = _send(store, topic)
    dispatch_pending(store)
    assert register_views(spark, store) == list(VIEWS)
    actual = spark.sql(
        "SELECT topic, queue_id, queue_offset, physical_offset, msg_id, offset_msg_id, tags, body "
        "FROM messages"
    )
    expected = spark.createDataFrame(
        [
            (
                r.topic,
                r.queue_id,
                r.queue_offset,
                r.physical_offset,
                r.msg_id,  # the id send returned, as mq send prints it
                r.offset_msg_id,
                m.tags,
                m.body,
            )
            for m, r in sent
        ],
        MESSAGE_SCHEMA,
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_messages_view_columns_and_store_timestamp(spark: Any, store: Store, topic: str) -> None:
    _send(store, topic)
    dispatch_pending(store)
    register_views(spark, store, ["messages"])
    df = spark.table("messages")
    where = ["topic", "queue_id", "queue_offset", "physical_offset"]
    what = ["msg_id", "offset_msg_id", "tags", "keys", "properties", "body"]
    when = ["born_ts_ms", "store_ts_ms", "reconsume_times"]
    assert df.columns == [*where, *what, *when, "store_ts"]  # the message columns, then the view's own
    assert dict(df.dtypes)["store_ts"] == "timestamp"
    mismatched = (
        spark.sql("SELECT count(*) AS n FROM messages WHERE unix_millis(store_ts) != store_ts_ms")
        .collect()[0]
        .n
    )
    assert mismatched == 0
    by_tag = {
        r.tags: r.n for r in spark.sql("SELECT tags, count(*) AS n FROM messages GROUP BY tags").collect()
    }
    assert by_tag == {"TagA": 3, "TagB": 3}


def test_views_follow_the_tables_and_skip_undispatched_messages(spark: Any, store: Store, topic: str) -> None:
    register_views(spark, store)
    assert spark.sql("SELECT count(*) AS n FROM messages").collect()[0].n == 0
    _send(store, topic)
    CommitLogWriter(store).append(
        [PendingMessage(topic, 0, b"half", "U-HALF", sys_flag=int(SysFlag.PREPARED))]
    )
    # Not dispatched yet: in the commit log, not in the consume queue nor in messages.
    counts = spark.sql(
        "SELECT (SELECT count(*) FROM commit_log) AS log, (SELECT count(*) FROM consume_queue) AS cq, "
        "(SELECT count(*) FROM messages) AS msgs"
    ).collect()[0]
    assert (counts.log, counts.cq, counts.msgs) == (7, 0, 0)
    dispatch_pending(store)
    counts = spark.sql(
        "SELECT (SELECT count(*) FROM commit_log) AS log, (SELECT count(*) FROM consume_queue) AS cq, "
        "(SELECT count(*) FROM messages) AS msgs"
    ).collect()[0]
    assert (counts.log, counts.cq, counts.msgs) == (7, 6, 6)
    assert spark.table(schemas.CONSUME_QUEUE).columns == schemas.CONSUME_QUEUE_SCHEMA.names


def test_unknown_view_name_is_rejected(spark: Any, store: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown views"):
        register_views(spark, store, ["nope"])
