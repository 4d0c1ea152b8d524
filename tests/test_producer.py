"""Producer: sends, batches, async micro-batches, queue selection, validation."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from engine import (
    Admin,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidTopicError,
    LocalTransactionState,
    Message,
    MessageQueue,
    Producer,
    ProducerClosedError,
    SendResult,
    SendStatus,
    Store,
    TopicNotFoundError,
)
from engine.config import load_config
from engine.errors import StoreError
from engine.protocol import SCHEDULE_TOPIC, TRANS_HALF_TOPIC, parse_msg_id, record_size, select_queue_by_hash
from engine.store.commit_log.writer import CommitLogWriter
from engine.store.delta.log import read_versions
from engine.store.schemas import COMMIT_LOG, COMMIT_LOG_SCHEMA
from tests.helpers import commit_log_rows, versions


def test_send_returns_offsets_and_ids(store: Store, topic: str) -> None:
    with Producer(store) as p:
        r = p.send(Message(topic, b"hello", tags="TagA", keys=("k1",), properties={"a": "b"}))
    assert r.status is SendStatus.SEND_OK
    assert (r.topic, r.queue_offset, r.physical_offset) == (topic, 0, 0)
    assert parse_msg_id(r.offset_msg_id) == (store.store_id, 0)
    assert len(r.uniq_key) == 32
    [row] = commit_log_rows(store)
    assert row["body"] == b"hello" and row["tags"] == "TagA" and row["keys"] == ["k1"]
    assert dict(row["properties"])["a"] == "b"  # type: ignore[call-overload]
    assert dict(row["properties"])["KEYS"] == "k1"  # type: ignore[call-overload]
    assert row["msg_id"] == r.offset_msg_id and row["uniq_key"] == r.msg_id == r.uniq_key
    assert r.store_ts_ms == row["store_ts_ms"] > 0


def test_async_and_batch_results_carry_their_commits_store_time(store: Store, topic: str) -> None:
    with Producer(store) as p:
        single = p.send_async(Message(topic, b"a")).result(timeout=30)
        batch = p.send_batch([Message(topic, b"b"), Message(topic, b"c")], queue_id=1)
    stored = {row["msg_id"]: row["store_ts_ms"] for row in commit_log_rows(store)}
    assert all(r.store_ts_ms == stored[r.offset_msg_id] > 0 for r in (single, *batch))


def test_round_robin_spreads_over_queues(store: Store, topic: str) -> None:
    with Producer(store) as p:
        queues = [p.send(Message(topic, b"x")).queue_id for _ in range(8)]
    assert queues == [0, 1, 2, 3, 0, 1, 2, 3]


def test_explicit_queue_and_sharding_key(store: Store, topic: str) -> None:
    with Producer(store) as p:
        assert p.send(Message(topic, b"x"), queue_id=2).queue_id == 2
        expected = select_queue_by_hash("order-7", 4)
        got = {p.send(Message(topic, b"x"), sharding_key="order-7").queue_id for _ in range(5)}
    assert got == {expected}


def test_physical_offsets_advance_by_record_size(store: Store, topic: str) -> None:
    with Producer(store) as p:
        a = p.send(Message(topic, b"a" * 10), queue_id=0)
        b = p.send(Message(topic, b"b"), queue_id=0)
    rows = commit_log_rows(store)
    assert b.physical_offset == a.physical_offset + int(rows[0]["size"])  # type: ignore[call-overload]
    assert (a.queue_offset, b.queue_offset) == (0, 1)


def test_send_batch_is_one_commit_with_results_in_order(store: Store, topic: str) -> None:
    before = store.version("commit_log")
    with Producer(store) as p:
        results = p.send_batch([Message(topic, f"m{i}".encode()) for i in range(20)], queue_id=1)
    assert store.version("commit_log") == before + 1
    assert [r.queue_offset for r in results] == list(range(20))
    assert [r.physical_offset for r in results] == sorted(r.physical_offset for r in results)
    bodies = [row["body"] for row in commit_log_rows(store)]
    assert bodies == [f"m{i}".encode() for i in range(20)]


def test_send_batch_rejects_mixed_topics_and_writes_nothing(store: Store, admin: Admin, topic: str) -> None:
    admin.create_topic("Other", 1)
    before = versions(store)
    with Producer(store) as p, pytest.raises(InvalidMessageError):
        p.send_batch([Message(topic, b"a"), Message("Other", b"b")])
    assert versions(store) == before


def test_send_batch_rejects_oversized_batch(store: Store, topic: str) -> None:
    big = b"x" * (1024 * 1024)
    with Producer(store) as p, pytest.raises(InvalidMessageError, match="at most"):
        p.send_batch([Message(topic, big) for _ in range(5)])


def test_send_async_groups_into_micro_batches(store: Store, topic: str) -> None:
    before = store.version("commit_log")
    with Producer(store, linger_ms=200, batch_size=1000) as p:
        futures = [p.send_async(Message(topic, f"{i}".encode()), queue_id=0) for i in range(300)]
        p.flush()
        results = [f.result() for f in futures]
    assert [r.queue_offset for r in results] == list(range(300))
    assert store.version("commit_log") - before < 300 / 10  # grouped, not one commit each


def test_close_flushes_and_then_refuses(store: Store, topic: str) -> None:
    p = Producer(store, linger_ms=50)
    fut = p.send_async(Message(topic, b"x"))
    p.close()
    assert fut.done() and fut.result().status is SendStatus.SEND_OK
    with pytest.raises(ProducerClosedError):
        p.send(Message(topic, b"y"))


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("Nope", b"x"), TopicNotFoundError),
        (Message("T", b""), InvalidMessageError),
        (Message("T", b"x" * (4 * 1024 * 1024 + 1)), InvalidMessageError),
        (Message("T", b"x", tags="A||B"), InvalidMessageError),
        (Message("T", b"x", properties={"a": 1}), InvalidMessageError),  # type: ignore[dict-item]
        (Message("bad topic", b"x"), InvalidTopicError),
        (Message("SCHEDULE_TOPIC_XXXX", b"x"), InvalidMessageError),
    ],
)
def test_bad_input_raises_typed_error_and_commits_nothing(
    store: Store, topic: str, message: Message, error: type[Exception]
) -> None:
    before = versions(store)
    with Producer(store) as p:
        with pytest.raises(error):
            p.send(message)
        with pytest.raises(error):
            p.send_async(message)
    assert versions(store) == before


@pytest.mark.parametrize("queue_id", [-1, 4, True, "1"])
def test_bad_queue_id_raises(store: Store, topic: str, queue_id: object) -> None:
    before = versions(store)
    with Producer(store) as p, pytest.raises(InvalidArgumentError):
        p.send(Message(topic, b"x"), queue_id=queue_id)  # type: ignore[arg-type]
    assert versions(store) == before


def test_not_a_message_raises(store: Store, topic: str) -> None:
    with Producer(store) as p, pytest.raises(InvalidMessageError):
        p.send("hello")  # type: ignore[arg-type]


def test_batch_results_are_ordinary_frozen_send_results(store: Store, topic: str) -> None:
    with Producer(store) as p:
        results = p.send_batch([Message(topic, f"m{i}".encode(), tags="A") for i in range(3)], queue_id=2)
    rows: list[dict[str, Any]] = commit_log_rows(store)
    expected = [
        SendResult(
            SendStatus.SEND_OK,
            r["uniq_key"],
            r["msg_id"],
            topic,
            2,
            r["queue_offset"],
            r["physical_offset"],
            r["store_ts_ms"],
        )
        for r in rows
    ]
    assert results == expected
    assert [hash(r) for r in results] == [hash(e) for e in expected]
    assert repr(results[0]) == repr(expected[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        results[0].queue_offset = 7  # type: ignore[misc]


def test_batch_with_keys_and_properties_stores_them_per_message(store: Store, topic: str) -> None:
    messages = [
        Message(topic, b"plain", tags="A"),
        Message(topic, b"keyed", keys=("k1", "k2")),
        Message(topic, b"props", properties={"p": "v"}),
    ]
    with Producer(store) as p:
        results = p.send_batch(messages, queue_id=0)
    rows = commit_log_rows(store)
    assert [r["body"] for r in rows] == [b"plain", b"keyed", b"props"]
    assert [r["keys"] for r in rows] == [[], ["k1", "k2"], []]
    assert [dict(r["properties"]) for r in rows] == [{}, {"KEYS": "k1 k2"}, {"p": "v"}]  # type: ignore[call-overload]
    assert [r["size"] for r in rows] == [
        record_size(topic, 5, {}),
        record_size(topic, 5, {"KEYS": "k1 k2"}),
        record_size(topic, 5, {"p": "v"}),
    ]
    assert [r.physical_offset for r in results] == [0, rows[0]["size"], rows[0]["size"] + rows[1]["size"]]  # type: ignore[operator]
    assert [r.queue_offset for r in results] == [0, 1, 2]


def test_async_results_match_the_stored_rows(store: Store, topic: str) -> None:
    with Producer(store, linger_ms=50, batch_size=64) as p:
        futures = [
            p.send_async(Message(topic, f"{i}".encode(), tags="T"), queue_id=i % 2) for i in range(100)
        ]
        p.flush()
    by_uniq = {r["uniq_key"]: r for r in commit_log_rows(store)}
    for i, f in enumerate(futures):
        r = f.result()
        row = by_uniq[r.uniq_key]
        assert (row["body"], row["queue_id"], row["msg_id"]) == (f"{i}".encode(), i % 2, r.offset_msg_id)
        assert (row["queue_offset"], row["physical_offset"]) == (r.queue_offset, r.physical_offset)


def test_async_micro_batches_hold_at_most_max_batch_bytes(store: Store, topic: str) -> None:
    small = Store.open(store.root, config=store.config.replace(max_batch_bytes=1000))
    before = small.version("commit_log")
    with Producer(small, linger_ms=200, batch_size=1000) as p:
        futures = [p.send_async(Message(topic, bytes([i]) * 300), queue_id=0) for i in range(10)]
        p.flush()
    assert [f.result().queue_offset for f in futures] == list(range(10))
    rows = read_versions(small.uri("commit_log"), before + 1, small.version("commit_log"), COMMIT_LOG_SCHEMA)
    per_commit = Counter(rows["_version"].to_pylist())
    assert max(per_commit.values()) == 3  # 3 bodies of 300 bytes fit in 1000, a 4th does not
    assert [r["body"] for r in commit_log_rows(small)] == [bytes([i]) * 300 for i in range(10)]


# ----------------------------------------------------------------------------- RocketMQ's limits
@pytest.mark.parametrize(
    "name",
    ["PGROUP", "MIN_OFFSET", "KEYS", "MAX_RECONSUME_TIMES", "ORIGIN_MESSAGE_ID", "TIMER_OUT_MS", "TRACE_ON"],
)
def test_reserved_property_names_are_refused_and_nothing_is_written(
    store: Store, topic: str, name: str
) -> None:
    before = versions(store)
    with Producer(store) as p:
        with pytest.raises(InvalidMessageError, match="reserved"):
            p.send(Message(topic, b"x", properties={name: "1"}))
        with pytest.raises(InvalidMessageError, match="reserved"):
            p.send_batch([Message(topic, b"x", properties={name: "1"})])
    assert versions(store) == before


def test_properties_over_32767_bytes_are_refused_and_nothing_is_written(store: Store, topic: str) -> None:
    before = versions(store)
    with Producer(store) as p:
        with pytest.raises(InvalidMessageError, match="32767"):
            p.send(Message(topic, b"x", properties={"big": "v" * 32_767}))
        with pytest.raises(InvalidMessageError, match="32767"):
            p.send(Message(topic, b"x", properties={"a": "v" * 20_000, "b": "v" * 20_000}))
        assert versions(store) == before
        p.send(Message(topic, b"x", properties={"big": "v" * 32_000}))  # just under: accepted


def test_send_batch_counts_properties_tags_and_keys_towards_the_batch_limit(store: Store, topic: str) -> None:
    small = Store.open(store.root, config=store.config.replace(max_batch_bytes=1_000))
    before = versions(store)
    with Producer(small) as p:
        with pytest.raises(InvalidMessageError, match="batch takes"):
            p.send_batch([Message(topic, b"x" * 100, properties={"p": "v" * 200}) for _ in range(4)])
        with pytest.raises(InvalidMessageError, match="batch takes"):
            p.send_batch([Message(topic, b"x" * 100, tags="T" * 200) for _ in range(4)])
        with pytest.raises(InvalidMessageError, match="batch takes"):
            p.send_batch([Message(topic, b"x" * 100, keys=("k" * 200,)) for _ in range(4)])
        assert versions(store) == before
        assert len(p.send_batch([Message(topic, b"x" * 100, tags="T") for _ in range(4)])) == 4


def test_send_batch_refuses_timer_properties(store: Store, topic: str) -> None:
    before = versions(store)
    with Producer(store) as p, pytest.raises(InvalidMessageError, match="timer"):
        p.send_batch([Message(topic, b"x", properties={"TIMER_DELAY_SEC": "10"})])
    assert versions(store) == before


@pytest.mark.parametrize("length", [256, 300])
def test_group_names_over_255_characters_are_refused(store: Store, length: int) -> None:
    with pytest.raises(InvalidArgumentError, match="255"):
        Producer(store, "g" * length)


# ----------------------------------------------------------------------------- prepare, then append
def test_prepare_checks_and_chooses_the_queue_but_writes_nothing(store: Store, topic: str) -> None:
    before = versions(store)
    with Producer(store) as p:
        first, second = p.prepare(Message(topic, b"a", tags="A")), p.prepare(Message(topic, b"b"))
        with pytest.raises(TopicNotFoundError):
            p.prepare(Message("Nope", b"x"))
        assert versions(store) == before
        assert (first.pending.topic, first.pending.queue_id, first.pending.body) == (topic, 0, b"a")
        assert (first.pending.tags, second.pending.queue_id, first.destination) == ("A", 1, None)
        assert first.pending.uniq_key != second.pending.uniq_key
        assert p.prepare(Message(topic, b"k"), sharding_key="order-7").pending.queue_id == (
            select_queue_by_hash("order-7", 4)
        )


def test_append_commits_a_prepared_send_as_send_would(store: Store, topic: str) -> None:
    with Producer(store) as p:
        prepared = p.prepare(Message(topic, b"x", keys=("k",)), queue_id=2, uniq_key="U" * 32)
        result = p.append(prepared)
    assert (result.topic, result.queue_id, result.queue_offset, result.msg_id) == (topic, 2, 0, "U" * 32)
    [row] = commit_log_rows(store)
    assert (row["uniq_key"], row["keys"], row["msg_id"]) == ("U" * 32, ["k"], result.offset_msg_id)


def test_a_prepared_delayed_send_keeps_its_real_destination_for_the_result(store: Store, topic: str) -> None:
    with Producer(store) as p:
        prepared = p.prepare(Message(topic, b"later"), queue_id=3, delay_level=2)
        assert (prepared.pending.topic, prepared.pending.queue_id) == (SCHEDULE_TOPIC, 1)
        assert prepared.destination == MessageQueue(topic, 3)
        result = p.append(prepared)
    assert (result.topic, result.queue_id, result.queue_offset) == (topic, 3, 0)
    [row] = commit_log_rows(store)
    assert (row["topic"], row["queue_id"], row["msg_id"]) == (SCHEDULE_TOPIC, 1, result.offset_msg_id)


def test_append_batch_is_one_commit_with_results_in_input_order(store: Store, topic: str) -> None:
    before = store.version(COMMIT_LOG)
    with Producer(store) as p:
        assert p.append_batch([]) == []
        prepared = [
            p.prepare(Message(topic, b"a"), queue_id=1),
            p.prepare(Message(topic, b"b"), queue_id=1, delay_level=1),
            p.prepare(Message(topic, b"c"), queue_id=0),
        ]
        results = p.append_batch(prepared)
    assert store.version(COMMIT_LOG) == before + 1
    assert [(r.topic, r.queue_id, r.queue_offset) for r in results] == [
        (topic, 1, 0),
        (topic, 1, 0),
        (topic, 0, 0),
    ]
    assert [r.msg_id for r in results] == [s.pending.uniq_key for s in prepared]


def test_append_async_resolves_once_committed(store: Store, topic: str) -> None:
    with Producer(store, linger_ms=0) as p:
        future = p.append_async(p.prepare(Message(topic, b"x"), queue_id=1, delay_level=3))
        result = future.result(30)
    assert (result.topic, result.queue_id) == (topic, 1)
    [row] = commit_log_rows(store)
    assert (row["topic"], row["msg_id"]) == (SCHEDULE_TOPIC, result.offset_msg_id)


def test_append_batch_async_keeps_a_batch_whole_and_shares_the_commit_with_other_sends(
    store: Store, topic: str
) -> None:
    before = store.version(COMMIT_LOG)
    with Producer(store, linger_ms=500, batch_size=100) as p:
        single = p.append_async(p.prepare(Message(topic, b"single"), queue_id=0))
        batch = [p.prepare(Message(topic, f"b{i}".encode()), queue_id=1) for i in range(3)]
        grouped = p.append_batch_async(batch)
        other = p.append_batch_async([p.prepare(Message(topic, b"c"), queue_id=1)])
        results = grouped.result(30)
        assert [r.msg_id for r in results] == [s.pending.uniq_key for s in batch]
        assert [(r.queue_id, r.queue_offset) for r in results] == [(1, 0), (1, 1), (1, 2)]
        assert (single.result(30).queue_id, single.result(30).queue_offset) == (0, 0)
        [after] = other.result(30)
        assert (after.queue_id, after.queue_offset) == (1, 3)
    assert store.version(COMMIT_LOG) == before + 1  # one group commit held all three
    rows = sorted(commit_log_rows(store), key=lambda r: r["physical_offset"])
    assert [bytes(r["body"]) for r in rows] == [b"single", b"b0", b"b1", b"b2", b"c"]


def test_a_cancelled_async_send_fails_none_of_the_others_in_its_commit(store: Store, topic: str) -> None:
    # A door cancels the future of a send whose client hung up; the message is in the commit all the
    # same, and the others of that commit are stored and must be told so, not failed.
    before = store.version(COMMIT_LOG)
    with Producer(store, linger_ms=500, batch_size=100) as p:
        first = p.append_async(p.prepare(Message(topic, b"a"), queue_id=0))
        gone = p.append_async(p.prepare(Message(topic, b"b"), queue_id=0))
        assert gone.cancel()
        batch = p.append_batch_async([p.prepare(Message(topic, b"c"), queue_id=0)])
        last = p.append_async(p.prepare(Message(topic, b"d"), queue_id=0))
        assert first.result(30).queue_offset == 0
        assert [r.queue_offset for r in batch.result(30)] == [2]
        assert last.result(30).queue_offset == 3
        p.flush(30)
    assert store.version(COMMIT_LOG) == before + 1
    assert sorted(bytes(r["body"]) for r in commit_log_rows(store)) == [b"a", b"b", b"c", b"d"]


def test_regroup_gathers_the_senders_of_the_last_commit_into_the_next(store: Store, topic: str) -> None:
    # Two synchronous senders acknowledged by one commit: the first to send again waits (past
    # linger_ms) for the other, and both land in one commit, as two threads of a Java client do.
    with Producer(store, linger_ms=200, regroup_ms=60_000) as p:
        first = [p.append_async(p.prepare(Message(topic, n), queue_id=0)) for n in (b"a1", b"b1")]
        assert [f.result(30).queue_offset for f in first] == [0, 1]  # one group, by linger_ms
        after_first = store.version(COMMIT_LOG)
        a2 = p.append_async(p.prepare(Message(topic, b"a2"), queue_id=0))
        time.sleep(0.5)  # past linger_ms: without regrouping a2 would be committed alone by now
        assert not a2.done()
        b2 = p.append_async(p.prepare(Message(topic, b"b2"), queue_id=0))
        assert (a2.result(30).queue_offset, b2.result(30).queue_offset) == (2, 3)
        assert store.version(COMMIT_LOG) == after_first + 1


def test_regroup_never_holds_up_a_single_synchronous_sender(store: Store, topic: str) -> None:
    # Alone, a sender is all its last commit carried: it never waits for anyone (a wait would
    # outlast the 30 s result timeout).
    with Producer(store, linger_ms=0, regroup_ms=600_000) as p:
        offsets = [p.append_async(p.prepare(Message(topic, b"x"), queue_id=0)).result(30) for _ in range(3)]
        assert [r.queue_offset for r in offsets] == [0, 1, 2]
    with pytest.raises(InvalidArgumentError, match="regroup_ms"):
        Producer(store, regroup_ms=-1)


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), "1", True, None])
def test_a_bad_lock_wait_is_a_typed_error(store: Store, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="lock_wait_s"):
        Producer(store, lock_wait_s=bad)  # type: ignore[arg-type]


def test_the_lock_wait_reaches_every_shards_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.store.commit_log.writer as writer_module

    made: dict[str, float | None] = {}
    real = writer_module.writers_host_lock

    def spy(store: Store, table: str, **options: Any) -> Any:
        lock = real(store, table, **options)
        made[table] = None if lock is None else lock.wait_s
        return lock

    monkeypatch.setattr(writer_module, "writers_host_lock", spy)
    store = Store.open(tmp_path / "sharded", config=load_config(commit_log_shards=2))
    Admin(store).create_topic("Sharded", 4)
    with Producer(store, lock_wait_s=0.25) as p:
        for queue_id in range(4):  # queues of both shards
            p.send(Message("Sharded", b"x"), queue_id=queue_id)
    assert made == {"commit_log": 0.25, "commit_log_1": 0.25}


def test_commit_groups_commits_every_group_in_one_commit_and_answers_each_in_order(
    store: Store, topic: str
) -> None:
    before = store.version(COMMIT_LOG)
    with Producer(store) as p:
        one = [p.prepare(Message(topic, b"one"), queue_id=1)]
        batch = [p.prepare(Message(topic, f"b{i}".encode()), queue_id=1) for i in range(3)]
        delayed = [p.prepare(Message(topic, b"later"), queue_id=0, delay_level=2)]
        outcomes = p.commit_groups([one, batch, delayed])
        assert p.commit_groups([]) == []
    assert store.version(COMMIT_LOG) == before + 1
    first, second, third = outcomes
    assert isinstance(first, list) and isinstance(second, list) and isinstance(third, list)
    assert [(r.queue_id, r.queue_offset) for r in first + second] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert [r.msg_id for r in second] == [s.pending.uniq_key for s in batch]
    # a delayed send is stored in the schedule topic and answered with the queue it was sent to
    assert (third[0].topic, third[0].queue_id) == (topic, 0)


def test_commit_groups_answers_a_failed_commit_with_its_error_and_a_closed_producer_raises(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = Producer(store)
    groups = [[p.prepare(Message(topic, b"x"), queue_id=0)], [p.prepare(Message(topic, b"y"), queue_id=1)]]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("disk full")

    with monkeypatch.context() as m:
        m.setattr(CommitLogWriter, "append_batch", refuse)
        outcomes = p.commit_groups(groups)
    assert [type(o) for o in outcomes] == [StoreError, StoreError] and "disk full" in str(outcomes[0])
    p.close()
    with pytest.raises(ProducerClosedError):
        p.commit_groups(groups)
    assert commit_log_rows(store) == []


def test_append_batch_async_is_never_split_by_the_group_commit_size(store: Store, topic: str) -> None:
    before = store.version(COMMIT_LOG)
    with Producer(store, linger_ms=0, batch_size=2) as p:
        batch = [p.prepare(Message(topic, f"{i}".encode()), queue_id=0) for i in range(5)]
        results = p.append_batch_async(batch).result(30)
    assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
    assert store.version(COMMIT_LOG) == before + 1


def test_append_batch_async_reports_a_failed_commit_on_its_future(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Producer(store, linger_ms=0) as p:
        batch = [p.prepare(Message(topic, b"x"), queue_id=0)]

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("disk full")

        monkeypatch.setattr(CommitLogWriter, "append_batch", refuse)
        future = p.append_batch_async(batch)
        with pytest.raises(StoreError, match="disk full"):
            future.result(30)
    assert commit_log_rows(store) == []


def test_prepare_refuses_a_uniq_key_that_is_not_a_string(store: Store, topic: str) -> None:
    with Producer(store) as p, pytest.raises(InvalidArgumentError, match="uniq_key"):
        p.prepare(Message(topic, b"x"), uniq_key=7)  # type: ignore[arg-type]


def test_only_a_resend_may_carry_the_resend_properties(store: Store, topic: str) -> None:
    lineage = Message(topic, b"x", properties={"ORIGIN_MESSAGE_ID": "M1"})
    with Producer(store) as p:
        with pytest.raises(InvalidMessageError, match="reserved"):
            p.prepare(lineage)
        with pytest.raises(InvalidMessageError, match="reserved"):
            p.prepare(Message(topic, b"x", properties={"PGROUP": "g"}), resend=True)
        p.append(p.prepare(lineage, resend=True))
    [row] = commit_log_rows(store)
    assert dict(row["properties"])["ORIGIN_MESSAGE_ID"] == "M1"  # type: ignore[call-overload]


def test_a_half_is_invisible_until_its_transaction_is_committed(store: Store, topic: str) -> None:
    with Producer(store) as p:
        half = p.append_half(p.prepare(Message(topic, b"tx"), queue_id=2), "TxGroup")
        assert (half.topic, half.queue_id, half.producer_group) == (topic, 2, "TxGroup")
        assert [r["topic"] for r in commit_log_rows(store)] == [TRANS_HALF_TOPIC]
        decision = p.end_transaction(half, LocalTransactionState.COMMIT, reason="local")
        again = p.end_transaction(half, LocalTransactionState.ROLLBACK, reason="check", check_times=1)
    assert decision.won and decision.state is LocalTransactionState.COMMIT
    assert not again.won and again.state is LocalTransactionState.COMMIT  # decided once
    assert decision.committed is not None
    assert (decision.committed.topic, decision.committed.queue_id) == (topic, 2)
    committed = [r for r in commit_log_rows(store) if r["topic"] == topic]
    assert [(r["body"], r["queue_id"]) for r in committed] == [(b"tx", 2)]


def test_a_delayed_send_cannot_be_a_half(store: Store, topic: str) -> None:
    before = versions(store)
    with Producer(store) as p, pytest.raises(InvalidMessageError, match="delayed"):
        p.append_half(p.prepare(Message(topic, b"x"), delay_level=1), "TxGroup")
    assert versions(store) == before


def test_a_closed_producer_refuses_every_step_of_the_seam(store: Store, topic: str) -> None:
    p = Producer(store)
    prepared = p.prepare(Message(topic, b"x"))
    p.close()
    for step in (
        lambda: p.prepare(Message(topic, b"y")),
        lambda: p.append(prepared),
        lambda: p.append_batch([prepared]),
        lambda: p.append_async(prepared),
        lambda: p.append_batch_async([prepared]),
        lambda: p.append_half(prepared, "TxGroup"),
    ):
        with pytest.raises(ProducerClosedError):
            step()
    assert commit_log_rows(store) == []


@pytest.mark.parametrize(
    "step",
    [
        "append-message",
        "append-none",
        "append_batch-str",
        "append_batch-messages",
        "append_async-tuple",
        "append_batch_async-empty",
        "append_batch_async-messages",
        "append_half-message",
        "append_half-bad-group",
        "commit_groups-empty-group",
        "commit_groups-str",
        "commit_groups-messages",
    ],
)
def test_the_seam_refuses_what_prepare_did_not_make_and_writes_nothing(
    store: Store, topic: str, step: str
) -> None:
    with Producer(store) as p:
        message = Message(topic, b"x")
        prepared = p.prepare(message)
        calls = {
            "append-message": lambda: p.append(message),  # type: ignore[arg-type]
            "append-none": lambda: p.append(None),  # type: ignore[arg-type]
            "append_batch-str": lambda: p.append_batch("xy"),  # type: ignore[arg-type]
            "append_batch-messages": lambda: p.append_batch([prepared, message]),  # type: ignore[list-item]
            "append_async-tuple": lambda: p.append_async((message, None)),  # type: ignore[arg-type]
            "append_batch_async-empty": lambda: p.append_batch_async([]),
            "append_batch_async-messages": lambda: p.append_batch_async([prepared, message]),  # type: ignore[list-item]
            "append_half-message": lambda: p.append_half(message, "TxGroup"),  # type: ignore[arg-type]
            "append_half-bad-group": lambda: p.append_half(prepared, "bad group!"),
            "commit_groups-empty-group": lambda: p.commit_groups([[prepared], []]),
            "commit_groups-str": lambda: p.commit_groups(["xy"]),  # type: ignore[list-item]
            "commit_groups-messages": lambda: p.commit_groups([[prepared], [message]]),  # type: ignore[list-item]
        }
        before = versions(store)
        with pytest.raises(InvalidArgumentError):
            calls[step]()
        assert versions(store) == before


def test_prepare_batch_prepares_as_prepare_does_for_one_topic_and_queue(store: Store, topic: str) -> None:
    messages = [
        Message(topic, b"a"),
        Message(topic, b"b", tags="T", keys=("k1", "k2"), properties={"p": "1"}),
        Message(topic, bytearray(b"c")),
    ]
    born = {"__BORNHOST": "127.0.0.1:5555"}
    with Producer(store) as p:
        batch = p.prepare_batch(
            messages, 2, uniq_keys=["U1", None, "U3"], born_ts_ms=123, broker_properties=[born, {}, born]
        )
        one_by_one = [
            p.prepare(m, 2, uniq_key=u, born_ts_ms=123, broker_properties=b)
            for m, u, b in zip(messages, ["U1", "U2", "U3"], [born, {}, born], strict=True)
        ]
        results = p.append_batch(batch)
    assert [s.pending._replace(uniq_key="") for s in batch] == [
        s.pending._replace(uniq_key="", properties=dict(s.pending.properties)) for s in one_by_one
    ]
    assert batch[0].pending.uniq_key == "U1" and batch[2].pending.uniq_key == "U3"
    assert len(batch[1].pending.uniq_key) == 32  # none given: a new one
    assert all(s.destination is None for s in batch)
    assert [(r.queue_id, r.queue_offset) for r in results] == [(2, 0), (2, 1), (2, 2)]
    rows = commit_log_rows(store)
    assert [r["body"] for r in rows] == [b"a", b"b", b"c"]
    assert dict(rows[1]["properties"]) == {"p": "1", "KEYS": "k1 k2"}  # type: ignore[call-overload]
    assert dict(rows[0]["properties"]) == born  # type: ignore[call-overload]
    assert {r["born_ts_ms"] for r in rows} == {123}


def test_prepare_batch_without_a_queue_chooses_one_for_all(store: Store, topic: str) -> None:
    with Producer(store) as p:
        first = p.prepare_batch([Message(topic, b"a"), Message(topic, b"b")])
        second = p.prepare_batch([Message(topic, b"c")])
    assert len({s.pending.queue_id for s in first}) == 1
    assert first[0].pending.queue_id != second[0].pending.queue_id  # round robin, a batch a turn
    assert all(s.pending.born_ts_ms > 0 for s in (*first, *second))


@pytest.mark.parametrize(
    ("messages", "kwargs", "error"),
    [
        ([], {}, InvalidMessageError),
        (["not a message"], {}, InvalidMessageError),
        ([Message("{topic}", b"a"), Message("other", b"b")], {}, InvalidMessageError),
        ([Message("{topic}", b"a", deliver_at_ms=1)], {}, InvalidMessageError),
        ([Message("{topic}", b"a", properties={"TIMER_DELAY_SEC": "5"})], {}, InvalidMessageError),
        ([Message("{topic}", b"a", properties={"UNIQ_KEY": "x"})], {}, InvalidMessageError),
        ([Message("{topic}", b"")], {}, InvalidMessageError),
        ([Message("{topic}", b"a")], {"uniq_keys": []}, InvalidArgumentError),
        ([Message("{topic}", b"a")], {"broker_properties": []}, InvalidArgumentError),
        ([Message("{topic}", b"a")], {"uniq_keys": [7]}, InvalidArgumentError),
        ([Message("{topic}", b"a")], {"queue_id": 99}, InvalidArgumentError),
        ([Message("no-such-topic", b"a")], {}, TopicNotFoundError),
    ],
)
def test_prepare_batch_refuses_bad_input_with_a_typed_error(
    store: Store, topic: str, messages: list[Any], kwargs: dict[str, Any], error: type[Exception]
) -> None:
    messages = [
        dataclasses.replace(m, topic=m.topic.format(topic=topic)) if isinstance(m, Message) else m
        for m in messages
    ]
    with Producer(store) as p, pytest.raises(error):
        p.prepare_batch(messages, **kwargs)


def test_prepare_batch_on_a_closed_producer_raises(store: Store, topic: str) -> None:
    p = Producer(store)
    p.close()
    with pytest.raises(ProducerClosedError):
        p.prepare_batch([Message(topic, b"a")])
