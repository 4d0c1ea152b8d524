"""Messages are read from the commit-log versions dispatch has not covered yet
(engine.store.queue_entries.QueueTail), with the same entries dispatch then commits: by pulls, long
polls, leases and a store of several shards; never transaction halves; never past a gap or a failed
read; no more than TAIL_MAX_VERSIONS versions ahead of a stopped dispatcher."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

import engine.store.consume_queue as consume_queue
import engine.store.queue_entries as queue_entries
from engine import Admin, Message, Producer, PullConsumer, PullStatus, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.config import load_config
from engine.errors import InvalidArgumentError, StoreError
from engine.protocol.transactions import SysFlag
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.stamping import PendingMessage
from engine.store.consume_queue import QueueIndex, QueueMarks, dispatched_version
from engine.store.delta import VERSION_COLUMN


def _entries(index: QueueIndex, topic: str, queue_id: int) -> list[tuple[int, int]]:
    low, high = index.bounds(topic, queue_id)
    table = index.entries(topic, queue_id, low, high)
    return list(zip(table["queue_offset"].to_pylist(), table["physical_offset"].to_pylist(), strict=True))


def test_the_tail_plans_exactly_the_entries_dispatch_commits(store: Store, topic: str) -> None:
    with Producer(store) as producer:
        for i in range(10):
            producer.send(Message(topic, f"m{i}".encode()), queue_id=i % 2)
        producer.send_batch([Message(topic, f"b{i}".encode()) for i in range(5)], queue_id=1)
    before = QueueIndex(store)
    before.refresh()
    planned = {q: _entries(before, topic, q) for q in range(2)}
    assert [len(planned[q]) for q in range(2)] == [5, 10]
    assert dispatched_version(store) == -1
    dispatch_pending(store)
    after = QueueIndex(store)
    after.refresh()
    assert {q: _entries(after, topic, q) for q in range(2)} == planned
    # the reader that planned them goes over to the consume queue and sees the same
    assert before.refresh() and {q: _entries(before, topic, q) for q in range(2)} == planned


def test_a_long_poll_wakes_for_a_send_that_no_dispatcher_handles(store: Store, topic: str) -> None:
    consumer = PullConsumer(store, "g")
    got = []
    poll = threading.Thread(target=lambda: got.append(consumer.pull(topic, 0, 0, suspend_ms=20_000)))
    poll.start()
    with Producer(store) as producer:
        producer.send(Message(topic, b"now"), queue_id=0)
    poll.join(60)
    assert got and got[0].status is PullStatus.FOUND and [m.body for m in got[0].messages] == [b"now"]
    assert dispatched_version(store) == -1


def test_leases_take_messages_from_the_tail_and_acks_hold_after_dispatch(store: Store, topic: str) -> None:
    with Producer(store) as producer:
        producer.send_batch([Message(topic, f"m{i}".encode()) for i in range(6)], queue_id=0)
    with SimpleConsumer(store, "g", "c1") as consumer:
        consumer.subscribe(topic)
        got = consumer.receive(max_nums=6, invisible_ms=30_000)
        assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(6)]
        for m in got:
            consumer.ack(m)
    dispatch_pending(store)
    with SimpleConsumer(store, "g", "c2") as consumer:
        consumer.subscribe(topic)
        assert consumer.receive(max_nums=6, invisible_ms=30_000) == []


def test_transaction_halves_and_rolled_back_messages_stay_out_of_the_tail(store: Store, topic: str) -> None:
    writer = CommitLogWriter(store)
    writer.append(
        [
            PendingMessage(topic, 0, b"half", "U-HALF", sys_flag=int(SysFlag.PREPARED)),
            PendingMessage(topic, 0, b"rolled-back", "U-RB", sys_flag=int(SysFlag.ROLLBACK)),
        ]
    )
    with Producer(store) as producer:
        producer.send(Message(topic, b"plain"), queue_id=0)
    result = PullConsumer(store, "g").pull(topic, 0, 0)
    assert [m.body for m in result.messages] == [b"plain"]


def test_each_shard_is_read_past_its_own_marker(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "mq", config=load_config(commit_log_shards=3))
    Admin(store).create_topic("S", 6)
    with Producer(store) as producer:
        for q in range(6):
            producer.send(Message("S", f"q{q}".encode()), queue_id=q)
    consumer = PullConsumer(store, "g")
    assert [[m.body for m in consumer.pull("S", q, 0).messages] for q in range(6)] == [
        [f"q{q}".encode()] for q in range(6)
    ]
    dispatch_pending(store)
    with Producer(store) as producer:
        producer.send(Message("S", b"again"), queue_id=4)
    assert [m.body for m in consumer.pull("S", 4, 0).messages] == [b"q4", b"again"]


def test_a_failed_read_leaves_the_consume_queue_alone_visible(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Producer(store) as producer:
        producer.send(Message(topic, b"dispatched"), queue_id=0)
    dispatch_pending(store)
    with Producer(store) as producer:
        producer.send(Message(topic, b"not yet"), queue_id=0)

    def refused(*args: object, **kwargs: object) -> None:
        raise StoreError("the commit log cannot be read")

    monkeypatch.setattr(Store, "versions_after", refused)
    result = PullConsumer(store, "g").pull(topic, 0, 0)
    assert [m.body for m in result.messages] == [b"dispatched"] and result.max_offset == 1


def test_the_tail_stops_its_read_a_bounded_way_past_a_stopped_dispatcher(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_entries, "TAIL_MAX_VERSIONS", 3)
    with Producer(store) as producer:
        for i in range(5):
            producer.send(Message(topic, f"m{i}".encode()), queue_id=0)
    # versions 0 (the table's creation), 1 and 2 (the first two sends) of the 6
    assert store.version(schemas.COMMIT_LOG) == 5
    assert PullConsumer(store, "g").pull(topic, 0, 0).max_offset == 2
    dispatch_pending(store)
    assert PullConsumer(store, "g").pull(topic, 0, 0).max_offset == 5
    assert store.version(schemas.COMMIT_LOG) == dispatched_version(store)


def test_an_index_is_current_until_a_send_or_a_dispatch_lands(store: Store, topic: str) -> None:
    index = QueueIndex(store)
    assert not index.is_current()  # nothing read yet
    index.refresh()
    assert index.is_current()
    with Producer(store) as producer:
        producer.send(Message(topic, b"m"), queue_id=0)
    assert not index.is_current()  # a commit-log version past the tail
    index.refresh()
    assert index.is_current() and index.bounds(topic, 0) == (0, 1)
    dispatch_pending(store)
    assert not index.is_current()  # a consume-queue version
    index.refresh()
    assert index.is_current()


def test_a_topic_moved_when_the_newest_consume_queue_commit_gives_it_other_bounds(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    Admin(store).create_topic("Other", 2)
    index = QueueIndex(store)
    assert index.topic_moved(topic)  # nothing read yet
    index.refresh(tail=False)
    assert not index.topic_moved(topic) and not index.topic_moved("Other")  # no newer version
    with Producer(store) as producer:
        producer.send(Message("Other", b"m"), queue_id=1)
        dispatch_pending(store)
        assert index.topic_moved("Other") and not index.topic_moved(topic)
        producer.send(Message(topic, b"m"), queue_id=0)
        dispatch_pending(store)
    assert index.topic_moved(topic)
    assert index.bounds(topic, 0) == (0, 0)  # only a look: the index itself did not move
    index.refresh(tail=False)
    assert not index.topic_moved(topic) and index.bounds(topic, 0) == (0, 1)
    with Producer(store) as producer:
        producer.send(Message("Other", b"n"), queue_id=0)
    dispatch_pending(store)

    def unreadable(*args: object, **kwargs: object) -> object:
        raise StoreError("gone")

    monkeypatch.setattr(consume_queue, "read_version", unreadable)
    assert index.topic_moved(topic)  # the newest commit cannot be read: refresh to know


def test_pull_consumers_sharing_an_index_read_each_version_once(store: Store, topic: str) -> None:
    index = QueueIndex(store)
    a, b = PullConsumer(store, "ga", index=index), PullConsumer(store, "gb", index=index)
    with Producer(store) as producer:
        producer.send(Message(topic, b"m"), queue_id=1)
    assert a.bounds_now(topic, 1, 0) == (0, 1)
    assert index.is_current()  # b's pull finds nothing new to read
    assert [m.body for m in b.pull(topic, 1, 0).messages] == [b"m"]
    with pytest.raises(InvalidArgumentError):
        a.bounds_now(topic, 99, 0)


def _log_rows(*chunks: tuple[int, list[int]]) -> pa.Table:
    """Commit-log rows as dispatch reads them: one chunk per version, ``(version, sys_flags)``; a
    row's queue offset is its place in its version."""
    return pa.concat_tables(
        pa.table(
            {
                "queue_offset": pa.array(range(len(flags)), pa.int64()),
                "sys_flag": pa.array(flags, pa.int32()),
                VERSION_COLUMN: pa.array([version] * len(flags), pa.int64()),
            }
        )
        for version, flags in chunks
    )


HALF, ROLLED_BACK = int(SysFlag.PREPARED), int(SysFlag.ROLLBACK)


@pytest.mark.parametrize(
    ("chunks", "last", "kept", "covered"),
    [
        ([(3, [0, 0]), (4, [0])], 2, [(3, 0, 0), (3, 1, 0), (4, 0, 0)], 4),  # every row kept
        ([(3, [0, 0]), (4, [0])], 3, [(4, 0, 0)], 4),  # a version read again is dropped
        ([(3, [0, 0]), (4, [0])], 4, [], 4),  # nothing newer: nothing for the caller to cover
        ([(3, [0]), (4, [HALF, 0]), (5, [ROLLED_BACK])], 2, [(3, 0, 0), (4, 1, 0)], 5),
    ],
)
def test_visible_rows_are_the_newer_versions_without_transaction_halves(
    chunks: list[tuple[int, list[int]]], last: int, kept: list[tuple[int, int, int]], covered: int
) -> None:
    rows = _log_rows(*chunks)
    got, got_covered = queue_entries.visible_rows_after(rows, last)
    assert got.schema == rows.schema
    assert [(r[VERSION_COLUMN], r["queue_offset"], r["sys_flag"]) for r in got.to_pylist()] == kept
    assert got_covered == covered


def _plannable(order: list[int]) -> pa.Table:
    """Six commit-log rows of queue T:0 over three versions (two each, physical offsets rising), in
    the given order of their positions."""
    version = [1, 1, 2, 2, 3, 3]
    columns = {
        "topic": pa.array(["T"] * 6, pa.string()),
        "queue_id": pa.array([0] * 6, pa.int32()),
        "queue_offset": pa.array(range(6), pa.int64()),
        "physical_offset": pa.array([100 * i for i in range(6)], pa.int64()),
        "size": pa.array([100] * 6, pa.int32()),
        "tags_code": pa.array([0] * 6, pa.int64()),
        "store_ts_ms": pa.array([7] * 6, pa.int64()),
        "sys_flag": pa.array([0] * 6, pa.int32()),
        VERSION_COLUMN: pa.array(version, pa.int64()),
    }
    return pa.table(columns).take(pa.array(order))


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4, 5], [5, 3, 4, 0, 2, 1], [1, 0, 3, 2, 5, 4]])
def test_planned_entries_follow_the_log_order_whatever_order_the_rows_come_in(order: list[int]) -> None:
    marks = QueueMarks()
    marks.set_next("T", 0, 1)  # offset 0 was dispatched by an earlier pass over version 1
    entries, covered = queue_entries.plan_entries(_plannable(order), 0, marks)
    assert covered == 3
    assert entries["queue_offset"].to_pylist() == [1, 2, 3, 4, 5]
    assert entries["physical_offset"].to_pylist() == [100, 200, 300, 400, 500]
    assert entries["log_version"].to_pylist() == [1, 2, 2, 3, 3]
    assert marks.max_offset("T", 0) == 6 and marks.log_version == 3


def _queues_rows(queues: list[tuple[str, int, int]]) -> pa.Table:
    """One commit-log row per ``(topic, queue_id, queue_offset)``, in that (log) order, one version."""
    n = len(queues)
    return pa.table(
        {
            "topic": pa.array([t for t, _, _ in queues], pa.string()),
            "queue_id": pa.array([q for _, q, _ in queues], pa.int32()),
            "queue_offset": pa.array([o for _, _, o in queues], pa.int64()),
            "physical_offset": pa.array([100 * i for i in range(n)], pa.int64()),
            "size": pa.array([100] * n, pa.int32()),
            "tags_code": pa.array([0] * n, pa.int64()),
            "store_ts_ms": pa.array([7] * n, pa.int64()),
            "sys_flag": pa.array([0] * n, pa.int32()),
            VERSION_COLUMN: pa.array([1] * n, pa.int64()),
        }
    )


def _marks(next_offsets: dict[tuple[str, int], int]) -> QueueMarks:
    marks = QueueMarks()
    for (topic, qid), value in next_offsets.items():
        marks.set_next(topic, qid, value)
    return marks


def test_rows_of_several_queues_that_continue_each_one_are_all_planned_and_move_each_queue_on() -> None:
    start = {("A", 0): 5, ("A", 2): 0, ("B", 1): 9}
    log = [("A", 0, 5), ("B", 1, 9), ("A", 2, 0), ("A", 0, 6), ("B", 1, 10), ("A", 0, 7), ("C", 3, 0)]
    marks = _marks(start)
    entries, covered = queue_entries.plan_entries(_queues_rows(log), 0, marks)
    assert covered == 1
    got = list(
        zip(
            entries["topic"].to_pylist(),
            entries["queue_id"].to_pylist(),
            entries["queue_offset"].to_pylist(),
            strict=True,
        )
    )
    assert got == log  # every row, in log order
    assert entries["physical_offset"].to_pylist() == [100 * i for i in range(len(log))]
    after = {(t, q): marks.max_offset(t, q) for t, q in [("A", 0), ("A", 2), ("B", 1), ("C", 3)]}
    assert after == {("A", 0): 8, ("A", 2): 1, ("B", 1): 11, ("C", 3): 1}


def test_rows_some_queues_had_dispatched_already_leave_those_out() -> None:
    marks = _marks({("A", 0): 6, ("B", 1): 9})  # A:0's offset 5 was dispatched by an earlier pass
    log = [("A", 0, 5), ("B", 1, 9), ("A", 0, 6)]
    entries, _ = queue_entries.plan_entries(_queues_rows(log), 0, marks)
    assert entries["queue_offset"].to_pylist() == [9, 6]
    assert entries["physical_offset"].to_pylist() == [100, 200]
    assert (marks.max_offset("A", 0), marks.max_offset("B", 1)) == (7, 10)


@pytest.mark.parametrize(
    "log", [[("A", 0, 5), ("B", 1, 10)], [("A", 0, 5), ("A", 0, 7)], [("B", 1, 9), ("A", 0, 6)]]
)
def test_rows_that_skip_a_queue_offset_are_refused_as_a_gap(log: list[tuple[str, int, int]]) -> None:
    marks = _marks({("A", 0): 5, ("B", 1): 9})
    with pytest.raises(StoreError, match="gap"):
        queue_entries.plan_entries(_queues_rows(log), 0, marks)
