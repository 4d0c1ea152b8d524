"""Maintenance covers every commit-log shard: compaction, consumer-aware retention, index clean-up,
checkpoints with their saved marks, vacuum; reads are the same before and after, and each shard's
sequencer continues where it stood."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Admin, PullConsumer, PullStatus, Store
from engine.broker.compaction import dispatched_physical, table_names
from engine.broker.dispatch import dispatch_pending
from engine.broker.maintenance import checkpoint, compact, maintain, retain, vacuum
from engine.broker.retention import HOUR_MS
from engine.config import load_config
from engine.errors import InvalidArgumentError
from engine.protocol.shards import shard_base, shard_of_offset, shard_of_queue
from engine.store import schemas
from engine.store.commit_log.hwm import read_hwm
from engine.store.commit_log.reads import read_commit_logs
from engine.store.commit_markers import carried_markers
from engine.store.status import table_sizes
from tests.helpers import append_to_queues

SHARDS = 3
TOPIC = "Orders"
BATCHES = 4  # commits (so files) per queue
PER_BATCH = 5


def _queue_of(shard: int) -> int:
    return next(q for q in range(SHARDS) if shard_of_queue(TOPIC, q, SHARDS) == shard)


@pytest.fixture
def sharded(tmp_path: Path) -> Store:
    """A 3-shard store, topic ``Orders`` with a queue on each shard, 4 one-file commits of 5
    messages a queue, dispatched."""
    store = Store.open(tmp_path / "store", config=load_config(commit_log_shards=SHARDS))
    Admin(store).create_topic(TOPIC, SHARDS)
    assert sorted(shard_of_queue(TOPIC, q, SHARDS) for q in range(SHARDS)) == [0, 1, 2]
    for b in range(BATCHES):
        append_to_queues(
            store, TOPIC, {q: [f"q{q}-b{b}-m{i}".encode() for i in range(PER_BATCH)] for q in range(SHARDS)}
        )
    dispatch_pending(store)
    return store


def _pulled(store: Store) -> dict[int, list[tuple[int, bytes]]]:
    consumer = PullConsumer(store, "reader")
    return {
        q: [(m.queue_offset, m.body) for m in consumer.pull(TOPIC, q, 0, max_nums=100).messages]
        for q in range(SHARDS)
    }


def _log_rows(store: Store) -> list[dict[str, Any]]:
    return sorted(read_commit_logs(store).to_pylist(), key=lambda r: int(r["physical_offset"]))


def test_compaction_merges_every_shards_files_and_reads_stay_the_same(sharded: Store) -> None:
    pulled, rows = _pulled(sharded), _log_rows(sharded)
    files = {name: len(sharded.snapshot(name).files()) for name in sharded.commit_logs}
    assert files == {name: BATCHES for name in sharded.commit_logs}

    report = compact(sharded, min_files=2)

    for name in sharded.commit_logs:
        assert report[name]["version"] is not None
        assert report[name]["files_after"] == 1
    assert _pulled(sharded) == pulled
    assert _log_rows(sharded) == rows


def test_each_shards_sequencer_continues_after_its_compaction(sharded: Store) -> None:
    marks = {name: read_hwm(sharded.snapshot(name)).physical for name in sharded.commit_logs}
    compact(sharded, min_files=2)
    assert {name: read_hwm(sharded.snapshot(name)).physical for name in sharded.commit_logs} == marks
    stamped = append_to_queues(sharded, TOPIC, {_queue_of(2): [b"next"]})
    assert stamped[0].queue_offset == BATCHES * PER_BATCH
    assert stamped[0].physical_offset == marks["commit_log_2"]


def test_an_undispatched_shards_files_are_not_compacted(tmp_path: Path) -> None:
    store = Store.open(tmp_path, config=load_config(commit_log_shards=SHARDS))
    Admin(store).create_topic(TOPIC, SHARDS)
    for b in range(BATCHES):
        append_to_queues(store, TOPIC, {_queue_of(1): [f"b{b}".encode()]})
    assert compact(store, "commit_log_1", min_files=2)["commit_log_1"]["version"] is None
    dispatch_pending(store)
    assert compact(store, "commit_log_1", min_files=2)["commit_log_1"]["files_after"] == 1


def test_dispatched_physical_is_each_shards_own_watermark(sharded: Store) -> None:
    for shard, name in enumerate(sharded.commit_logs):
        last = max(int(p) for p in sharded.read(name)["physical_offset"].to_pylist())
        assert dispatched_physical(sharded, shard) == last
        assert shard_of_offset(last) == shard
    append_to_queues(sharded, TOPIC, {_queue_of(1): [b"undispatched"]})
    before = dispatched_physical(sharded, 1)
    assert before < read_hwm(sharded.snapshot("commit_log_1")).physical - 1


def test_dispatched_physical_of_an_empty_consume_queue_is_minus_one(tmp_path: Path) -> None:
    store = Store.open(tmp_path, config=load_config(commit_log_shards=2))
    assert dispatched_physical(store, 1) == -1


def test_retention_deletes_consumed_messages_from_every_shard(sharded: Store) -> None:
    consumer = PullConsumer(sharded, "g")
    for q in range(SHARDS):
        consumer.commit_offset(TOPIC, q, PER_BATCH + 2)  # the first file whole, two of the second
    kept = {q: rows[PER_BATCH + 2 :] for q, rows in _pulled(sharded).items()}

    report = retain(sharded, 0, now_ms=int(time.time() * 1000) + HOUR_MS)

    assert report["min_offsets"] == {TOPIC: {q: PER_BATCH + 2 for q in range(SHARDS)}}
    assert report["rows_removed"] == SHARDS * (PER_BATCH + 2)
    assert (report["files_removed"], report["files_rewritten"]) == (SHARDS, SHARDS)
    assert set(report["versions"]) == {schemas.CONSUME_QUEUE, *sharded.commit_logs}
    fresh = PullConsumer(sharded, "g2")
    for q in range(SHARDS):
        r = fresh.pull(TOPIC, q, 0)
        assert (r.status, r.next_begin_offset) == (PullStatus.OFFSET_ILLEGAL, PER_BATCH + 2)
        got = fresh.pull(TOPIC, q, PER_BATCH + 2, max_nums=100).messages
        assert [(m.queue_offset, m.body) for m in got] == kept[q]
    for name in sharded.commit_logs:
        assert sharded.read(name).num_rows == BATCHES * PER_BATCH - (PER_BATCH + 2)
    # The sequencer's marks survived on every shard: new messages continue each queue.
    for q in range(SHARDS):
        assert append_to_queues(sharded, TOPIC, {q: [b"new"]})[0].queue_offset == BATCHES * PER_BATCH
    assert retain(sharded, 0, now_ms=int(time.time() * 1000) + HOUR_MS)["versions"] == {}


def test_retention_keeps_a_shards_queue_no_group_has_consumed(sharded: Store) -> None:
    PullConsumer(sharded, "g").commit_offset(TOPIC, _queue_of(1), BATCHES * PER_BATCH)
    report = retain(sharded, 0, now_ms=int(time.time() * 1000) + HOUR_MS)
    assert report["min_offsets"] == {TOPIC: {_queue_of(1): BATCHES * PER_BATCH}}
    assert set(report["versions"]) == {schemas.CONSUME_QUEUE, "commit_log_1"}
    assert [sharded.read(n).num_rows for n in sharded.commit_logs] == [
        BATCHES * PER_BATCH,
        0,
        BATCHES * PER_BATCH,
    ]


def _index_rows(store: Store, offsets: list[int]) -> pa.Table:
    rows = [
        {
            "topic": TOPIC,
            "kind": "UNIQ_KEY",
            "key": f"K{p}",
            "physical_offset": p,
            "queue_id": 0,
            "queue_offset": 0,
            "store_ts_ms": 0,
            "log_version": 0,
        }
        for p in offsets
    ]
    return pa.Table.from_pylist(rows, schema=schemas.INDEX_SCHEMA)


def test_retention_drops_index_files_whose_entries_of_every_shard_are_deleted(sharded: Store) -> None:
    offsets = {
        k: sorted(int(p) for p in sharded.read(name)["physical_offset"].to_pylist())
        for k, name in enumerate(sharded.commit_logs)
    }
    PullConsumer(sharded, "g").commit_offset(TOPIC, _queue_of(1), BATCHES * PER_BATCH)  # shard 1 consumed
    PullConsumer(sharded, "g").commit_offset(TOPIC, _queue_of(0), PER_BATCH)  # shard 0's first file
    only_deleted = [offsets[0][0], offsets[1][0], offsets[1][-1]]  # shards 0 and 1, all deleted
    mixed = [offsets[1][0], offsets[2][0]]  # shard 2's entry stays
    deleted_ends = [offsets[0][0], offsets[0][PER_BATCH + 1], offsets[1][-1]]  # a kept shard-0 row inside
    for part in (only_deleted, mixed, deleted_ends):
        sharded.append(schemas.INDEX, _index_rows(sharded, part))

    report = retain(sharded, 0, now_ms=int(time.time() * 1000) + HOUR_MS)

    assert report["index_files_removed"] == 1
    left = sorted(int(p) for p in sharded.read(schemas.INDEX)["physical_offset"].to_pylist())
    assert left == sorted(mixed + deleted_ends)


def test_checkpoints_cover_every_shard_and_save_each_shards_marks(sharded: Store) -> None:
    versions = checkpoint(sharded)
    assert set(versions) == set(sharded.tables())
    root = Path(sharded.root)
    for name in sharded.commit_logs:
        assert any((root / name / "_mq_marks").iterdir())
        assert read_hwm(sharded.snapshot(name)).physical > shard_base(schemas.shard_of_table(name) or 0)


def test_vacuum_removes_every_shards_compacted_files(sharded: Store) -> None:
    pulled = _pulled(sharded)
    compact(sharded, min_files=2)
    deleted = vacuum(sharded, 0)
    for name in sharded.commit_logs:
        assert deleted[name] == BATCHES
    assert _pulled(sharded) == pulled


def test_one_maintenance_pass_compacts_every_shard(sharded: Store) -> None:
    report = maintain(sharded, min_files=2, vacuum_retention_hours=0)
    assert report.errors == ()
    assert {name for name, c in report.compaction.items() if c["version"] is not None} >= set(
        sharded.commit_logs
    )
    assert set(report.checkpoints) == set(sharded.tables())


def test_table_names_are_the_stores_tables_shards_included(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "a", config=load_config(commit_log_shards=2))
    assert table_names(store, None)[-1] == "commit_log_1"
    assert table_names(store, "commit_log_1") == ["commit_log_1"]
    with pytest.raises(InvalidArgumentError, match="commit_log_2"):
        table_names(store, ["commit_log", "commit_log_2"])
    single = Store.open(tmp_path / "b")
    with pytest.raises(InvalidArgumentError):
        compact(single, "commit_log_1")


def test_every_shard_carries_the_commit_logs_markers() -> None:
    assert carried_markers("commit_log_1") == carried_markers(schemas.COMMIT_LOG) != ()
    assert carried_markers("commit_log_01") == ()


def test_table_sizes_list_every_shard(sharded: Store) -> None:
    sizes = {t.table: t for t in table_sizes(sharded)}
    assert set(sizes) == set(sharded.tables())
    for name in sharded.commit_logs:
        assert (sizes[name].files, sizes[name].rows) == (BATCHES, BATCHES * PER_BATCH)
