"""The ``mq`` sink's rows, column-wise: checked as the producer checks a message, batched as the producer
batches one, and given dense queue offsets in input order per queue when stamped."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from engine import Admin, InvalidArgumentError, InvalidMessageError, Store, StoreError
from engine.errors import MQError
from engine.protocol import PROPERTY_KEYS, UniqKeyGenerator, select_queue_by_hash, validate_message_fields
from engine.spark.sink_rows import (
    check_fields,
    choose_queues,
    has_extras,
    normalize_rows,
    pending_batch,
    writable_topics,
)
from engine.store.commit_log.stamping import HighWaterMarks, PendingBatch, PendingMessage, stamp

TYPES = {
    "topic": pa.string(),
    "body": pa.binary(),
    "tags": pa.string(),
    "keys": pa.list_(pa.string()),
    "properties": pa.map_(pa.string(), pa.string()),
    "queue_id": pa.int64(),
    "sharding_key": pa.string(),
}


def _table(columns: dict[str, list[Any]]) -> pa.Table:
    return pa.table({k: pa.array(v, TYPES[k]) for k, v in columns.items()})


def _rows(**columns: list[Any]) -> pa.Table:
    n = len(columns["body"])
    columns.setdefault("topic", ["T"] * n)
    return normalize_rows(_table(columns), 1000)


def _producer_error(row: dict[str, Any]) -> type[MQError] | None:
    try:
        validate_message_fields(
            row.get("topic", "T"),
            row["body"],
            row.get("tags"),
            row.get("keys") or (),
            row.get("properties") or {},
        )
    except MQError as exc:
        return type(exc)
    return None


BAD_ROWS: list[dict[str, Any]] = [
    {"body": b""},
    {"body": b"x" * (4 * 1024 * 1024 + 1)},
    {"body": b"x", "tags": ""},
    {"body": b"x", "tags": "A||B"},
    {"body": b"x", "topic": "bad topic"},
    {"body": b"x", "keys": ["has space"]},
    {"body": b"x", "keys": [""]},
    {"body": b"x", "properties": [("UNIQ_KEY", "mine")]},
    {"body": b"x", "properties": [("a\x01", "b")]},
]


@pytest.mark.parametrize("bad", BAD_ROWS, ids=lambda r: repr(r)[:40])
def test_a_bad_row_among_good_ones_is_refused_as_the_producer_refuses_it(bad: dict[str, Any]) -> None:
    expected = _producer_error({**bad, "properties": dict(bad.get("properties") or {})})
    assert expected is not None
    good = {"topic": "T", "body": b"ok", "tags": "A", "keys": None, "properties": None}
    rows = [good] * 5 + [{**good, **bad}] + [good] * 5
    table = _table({k: [r[k] for r in rows] for k in good})
    with pytest.raises(expected):
        normalize_rows(table, 1)


def test_good_rows_pass_whatever_they_carry() -> None:
    rows = _rows(
        body=[b"a", b"b", b"c"],
        tags=[None, "TagA", "T|B"],
        keys=[None, ["k1", "k2"], []],
        properties=[None, [("color", "red")], []],
    )
    check_fields(rows)
    assert has_extras(rows).tolist() == [False, True, False]
    assert rows["born_ts_ms"].to_pylist() == [1000] * 3


def test_a_null_body_is_refused() -> None:
    with pytest.raises(InvalidMessageError, match="body must be bytes"):
        normalize_rows(pa.table({"topic": ["T", "T"], "body": pa.array([b"x", None], pa.binary())}), 1)


def test_writable_topics_gives_queue_counts_and_refuses_missing_system_and_read_only_topics(
    store: Store, admin: Admin
) -> None:
    from engine import TopicNotFoundError

    admin.create_topic("A", 3)
    admin.create_topic("R", 2, perm=4)  # read only
    assert writable_topics(store, ["A"]) == {"A": 3}
    with pytest.raises(TopicNotFoundError):
        writable_topics(store, ["A", "NOPE"])
    with pytest.raises(InvalidMessageError, match="system topic"):
        writable_topics(store, ["SCHEDULE_TOPIC_XXXX"])
    with pytest.raises(InvalidMessageError, match="not writable"):
        writable_topics(store, ["R"])


def test_queues_come_from_the_queue_id_then_the_sharding_key_then_round_robin_per_topic() -> None:
    rows = _rows(
        topic=["A"] * 3 + ["B"] * 9,
        body=[b"x"] * 12,
        queue_id=[2, None, None] + [None] * 9,
        sharding_key=[None, "order-7", None] + [None] * 9,
    )
    qids = choose_queues(rows, {"A": 4, "B": 3}).tolist()
    assert qids[0] == 2
    assert qids[1] == select_queue_by_hash("order-7", 4)
    assert 0 <= qids[2] < 4
    assert sorted(qids[3:]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # B's 9 rows spread evenly over 3 queues
    assert [(qids[i + 1] - qids[i]) % 3 for i in range(3, 11)] == [1] * 8  # in turn


def test_a_plain_batch_has_the_same_columns_as_the_producers_row_by_row_batch(
    store: Store, admin: Admin
) -> None:
    admin.create_topic("A", 2)
    admin.create_topic("LongerTopicName", 3)
    rows = _rows(
        topic=["A", "LongerTopicName", "A", "LongerTopicName"],
        body=[b"one", b"two!", b"3", b"four"],
        tags=[None, "TagA", "TagB", "TagA"],
        queue_id=[1, 2, 0, 0],
    )
    batch = pending_batch(store, rows)
    messages = [
        PendingMessage(t, q, b, u, tags=g, born_ts_ms=1000)
        for t, q, b, u, g in zip(
            rows["topic"].to_pylist(),
            [1, 2, 0, 0],
            rows["body"].to_pylist(),
            batch.uniq_keys,
            rows["tags"].to_pylist(),
            strict=True,
        )
    ]
    expected = PendingBatch.of(messages)
    assert batch.columns.equals(expected.columns)
    assert (batch.topics, batch.queue_ids, batch.dispatched) == (
        expected.topics,
        expected.queue_ids,
        expected.dispatched,
    )
    assert len(set(batch.uniq_keys)) == 4


def test_rows_with_keys_or_properties_are_batched_with_keys_as_a_property(store: Store, topic: str) -> None:
    rows = _rows(
        body=[b"a", b"b"], keys=[["k1", "k2"], None], properties=[None, [("p", "v")]], queue_id=[0, 1]
    )
    batch = pending_batch(store, rows, UniqKeyGenerator())
    assert batch.columns["keys"].to_pylist() == [["k1", "k2"], []]
    assert [dict(p) for p in batch.columns["properties"].to_pylist()] == [
        {PROPERTY_KEYS: "k1 k2"},
        {"p": "v"},
    ]
    assert batch.queue_ids == [0, 1]


def test_pending_batch_checks_destinations(store: Store, topic: str) -> None:
    with pytest.raises(InvalidArgumentError, match="queue_id 4 is out of range"):
        pending_batch(store, _rows(body=[b"x"], queue_id=[4]))


def test_from_columns_gives_back_the_batch_and_refuses_other_tables(store: Store, topic: str) -> None:
    batch = pending_batch(store, _rows(body=[b"a", b"b", b"c"]))
    again = PendingBatch.from_columns(batch.columns)
    assert again == batch
    with pytest.raises(StoreError, match="offset-free schema"):
        PendingBatch.from_columns(_rows(body=[b"a"]))


def test_a_multi_queue_batch_gets_dense_offsets_in_input_order_per_queue() -> None:
    topics = ["A", "B", "A", "A", "B", "A"]
    qids = [0, 0, 1, 0, 0, 3]
    batch = PendingBatch.plain(
        pa.array(topics),
        np.array(qids),
        pa.array([b"x"] * 6, pa.binary()),
        [f"u{i}" for i in range(6)],
        pa.nulls(6, pa.string()),
        pa.array([5] * 6, pa.int64()),
    )
    hwm = HighWaterMarks(queues={"A": [10, 20], "B": [7]})
    table, results, after = stamp(batch, hwm, "S", 100)
    assert results.queue_offsets == [10, 7, 20, 11, 8, 0]
    assert table["queue_offset"].to_pylist() == [10, 7, 20, 11, 8, 0]
    assert after.queues == {"A": {0: 12, 1: 21, 3: 1}, "B": {0: 9}}  # the queues the batch moved on
    assert hwm.queues == {"A": [10, 20], "B": [7]}  # the marks read are left as they were
    hwm.apply(after)
    assert hwm.queues == {"A": [12, 21, 0, 1], "B": [9]}
