"""The action log's one writer: buffered actions and acks, sequences, lease decisions."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import CommitConflictError, InvalidArgumentError, Store, StoreError
from engine.protocol.actions import ACK, NACK, PULL, RELEASE, RESET
from engine.store import schemas
from engine.store.action_log import ActionLogWriter, lease_frontier, read_actions
from engine.store.delta.log import read_files


def _rows(store: Store, group: str = "G") -> list[dict[str, Any]]:
    return read_actions(store, group)


def test_recorded_actions_are_appended_in_one_commit_with_dense_sequences(store: Store) -> None:
    writer = ActionLogWriter(store, "G", "c1")
    before = store.version(schemas.ACTION_LOG)
    for offset in range(3):
        writer.record(NACK, topic="T", queue_id=0, queue_offset=offset, physical_offset=100 + offset)
    assert writer.pending == 3 and _rows(store) == []
    assert writer.flush() == 3
    assert store.version(schemas.ACTION_LOG) == before + 1
    assert [(r["sequence"], r["queue_offset"]) for r in _rows(store)] == [(0, 0), (1, 1), (2, 2)]
    assert writer.pending == 0 and writer.flush() == 0


def test_a_new_writer_of_the_same_consumer_continues_its_sequence(store: Store) -> None:
    with ActionLogWriter(store, "G", "c1") as writer:
        writer.record(NACK, topic="T", queue_id=0, queue_offset=0, physical_offset=0)
        writer.record(NACK, topic="T", queue_id=0, queue_offset=1, physical_offset=1)
    again = ActionLogWriter(store, "G", "c1")
    assert again.next_sequence() == 2
    other = ActionLogWriter(store, "G", "c2")
    assert other.next_sequence() == 0


def test_a_known_sequence_spares_the_read_and_never_goes_back(store: Store, monkeypatch: Any) -> None:
    writer = ActionLogWriter(store, "G", "c1")

    def no_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("the table was read")

    monkeypatch.setattr(store, "read", no_read)
    writer.known_sequence(41)
    assert writer.next_sequence() == 42
    writer.known_sequence(7)  # an older view of the log never moves the sequence back
    assert writer.next_sequence() == 43


def test_acks_of_consecutive_offsets_travel_as_ranges_and_releases_name_their_lease(store: Store) -> None:
    writer = ActionLogWriter(store, "G", "c1")
    for offset in (1, 2, 3, 7):
        writer.buffer_ack(ACK, "T", 0, offset, 5_000, 10)
    writer.buffer_ack(RELEASE, "T", 0, 4, 9_000, 20)
    writer.buffer_ack(RELEASE, "T", 0, 5, 8_000, 20)
    assert (writer.buffered_acks, writer.earliest_deadline) == (6, 5_000)
    assert writer.oldest_ack is not None
    assert writer.flush() == 6
    got = sorted(
        (r["action"], r["queue_offset"], r["end_offset"], r["deadline_ms"], r["ts_ms"]) for r in _rows(store)
    )
    assert got == [
        (ACK, 1, 4, None, 20),
        (ACK, 7, 8, None, 20),
        (RELEASE, 4, 5, 9_000, 20),
        (RELEASE, 5, 6, 8_000, 20),
    ]
    assert (writer.buffered_acks, writer.oldest_ack, writer.earliest_deadline) == (0, None, None)


def test_only_acks_and_releases_are_buffered_as_acks(store: Store) -> None:
    writer = ActionLogWriter(store, "G", "c1")
    with pytest.raises(InvalidArgumentError, match="ACK or RELEASE"):
        writer.buffer_ack(PULL, "T", 0, 0, 1, 1)
    assert writer.pending == 0


def test_a_failed_flush_keeps_everything_buffered_in_order(store: Store, monkeypatch: Any) -> None:
    writer = ActionLogWriter(store, "G", "c1")
    writer.record(NACK, topic="T", queue_id=0, queue_offset=9, physical_offset=9)
    writer.buffer_ack(ACK, "T", 0, 1, 5_000, 10)
    real = store.append

    def broken(*args: object, **kwargs: object) -> int:
        raise StoreError("disk full")

    monkeypatch.setattr(store, "append", broken)
    with pytest.raises(StoreError):
        writer.flush()
    assert (writer.pending, writer.buffered_acks, writer.earliest_deadline) == (2, 1, 5_000)
    writer.buffer_ack(ACK, "T", 0, 2, 4_000, 11)  # buffered while the store was down
    monkeypatch.setattr(store, "append", real)
    assert writer.flush() == 3
    got = [(r["action"], r["queue_offset"], r["end_offset"]) for r in _rows(store)]
    assert sorted(got, key=str) == sorted([(ACK, 1, 3), (NACK, 9, None)], key=str)


def test_a_lease_commit_carries_the_buffered_acks_first_and_moves_the_frontier(store: Store) -> None:
    writer = ActionLogWriter(store, "G", "c1")
    assert writer.frontier("T", 0, refresh=True) == -1
    writer.buffer_ack(ACK, "T", 1, 3, 5_000, 10)
    lease = writer.row(PULL, "T", 0, 0, end=4, deadline_ms=9_000, ts=12)
    version, committed = writer.commit_lease([lease], "T", 0, 4)
    assert [r["action"] for r in committed] == [ACK, PULL]
    assert committed[0]["sequence"] > lease["sequence"]  # numbered when committed, after the lease row
    assert writer.buffered_acks == 0
    assert version == store.version(schemas.ACTION_LOG)
    assert writer.frontier("T", 0, refresh=False) == 4
    assert lease_frontier(store.shared(schemas.ACTION_LOG), "G", "T", 0) == 4


def test_a_lease_starts_at_the_first_offset_of_a_new_queue_with_a_reset_else_at_the_frontier(
    store: Store,
) -> None:
    writer = ActionLogWriter(store, "G", "c1")
    start, rows = writer.lease_start("T", 0, 0, lambda: 7, ts=1, refresh=True)
    assert start == 7 and [(r["action"], r["queue_offset"]) for r in rows] == [(RESET, 7)]
    writer.commit_lease([*rows, writer.row(PULL, "T", 0, 7, end=9, deadline_ms=9_000, ts=1)], "T", 0, 9)

    def never() -> int:
        raise AssertionError("a queue with a frontier does not ask for its first offset")

    assert writer.lease_start("T", 0, 0, never, ts=2, refresh=True) == (9, [])  # past the frontier
    assert writer.lease_start("T", 0, 12, lambda: 0, ts=3, refresh=False)[0] == 12  # retention's low


def test_of_two_lease_decisions_about_one_queue_only_one_lands(store: Store) -> None:
    a, b = ActionLogWriter(store, "G", "a"), ActionLogWriter(store, "G", "b")
    assert a.frontier("T", 0, refresh=True) == b.frontier("T", 0, refresh=True) == -1
    a.commit_lease([a.row(RESET, "T", 0, 0, ts=1)], "T", 0, 0)
    b.buffer_ack(ACK, "T", 1, 0, 5_000, 2)
    before = store.version(schemas.ACTION_LOG)
    with pytest.raises(CommitConflictError):
        b.commit_lease([b.row(RESET, "T", 0, 5, ts=2)], "T", 0, 5)
    assert store.version(schemas.ACTION_LOG) == before
    assert b.buffered_acks == 1  # kept for the next try
    assert b.frontier("T", 0, refresh=True) == 0  # read again, decide again
    _, committed = b.commit_lease([b.row(PULL, "T", 0, 0, end=2, deadline_ms=9, ts=3)], "T", 0, 2)
    assert [r["action"] for r in committed] == [ACK, PULL]
    assert sorted(r["action"] for r in _rows(store) if r["consumer_id"] == "b") == [ACK, PULL]


def test_a_lease_commit_of_another_queue_does_not_conflict(store: Store) -> None:
    a, b = ActionLogWriter(store, "G", "a"), ActionLogWriter(store, "G", "b")
    a.frontier("T", 0, refresh=True)
    b.frontier("T", 1, refresh=True)
    a.commit_lease([a.row(RESET, "T", 0, 0, ts=1)], "T", 0, 0)
    b.commit_lease([b.row(RESET, "T", 1, 0, ts=1)], "T", 1, 0)  # rebased past a's commit
    assert pa.compute.sum(store.read(schemas.ACTION_LOG)["queue_id"]).as_py() == 1


def test_a_data_file_of_an_older_schema_reads_with_the_added_column_null(tmp_path: Any) -> None:
    old = pa.table({"a": pa.array([1, 2], pa.int64())})
    pq.write_table(old, tmp_path / "old.parquet")
    new_schema = pa.schema([pa.field("a", pa.int64()), pa.field("end_offset", pa.int64())])
    pq.write_table(pa.table({"a": [3], "end_offset": [9]}, schema=new_schema), tmp_path / "new.parquet")
    rows = read_files(str(tmp_path), ["old.parquet", "new.parquet"], new_schema)
    assert rows.to_pydict() == {"a": [1, 2, 3], "end_offset": [None, None, 9]}
