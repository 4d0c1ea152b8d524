"""Dispatch and index over a store of several commit-log shards: every shard is followed from its own
marker, every queue stays dense, every entry points at its shard's row; producers and the ``mq`` sink
write each message to the shard of its queue."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Admin, Message, Producer, PullConsumer, PullStatus, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.broker.loop import BrokerLoop
from engine.config import load_config
from engine.errors import StoreError
from engine.protocol.queue_choice import STINT_ROUNDS
from engine.protocol.shards import shard_of_offset, shard_of_queue
from engine.spark.mq_sink import commit_rows, sink_progress
from engine.spark.sink_rows import normalize_rows
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_markers import DISPATCH_APP, INDEX_APP, dispatch_app, index_app
from engine.store.consume_queue import dispatched_version
from engine.store.index import indexed_version

TOPIC = "Orders"
QUEUES = 6
SHARDS = 3


@pytest.fixture
def sharded(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "mq", config=load_config(commit_log_shards=SHARDS))
    Admin(store).create_topic(TOPIC, QUEUES)
    return store


def all_rows(store: Store) -> list[dict[str, Any]]:
    """Every commit-log row of every shard, with the shard that holds it."""
    out = []
    for shard, name in enumerate(store.commit_logs):
        out += [{**r, "shard": shard} for r in store.read(name).to_pylist()]
    return out


def send_mixed(store: Store, n: int) -> None:
    """Sync sends (round robin), a batch per queue, and async sends grouped across queues."""
    with Producer(store, linger_ms=50, batch_size=64) as producer:
        for i in range(n):
            producer.send(Message(TOPIC, f"s{i}".encode(), keys=(f"k{i}",)))
        for q in range(QUEUES):
            producer.send_batch([Message(TOPIC, f"b{q}-{j}".encode()) for j in range(3)], queue_id=q)
        futures = [producer.send_async(Message(TOPIC, f"a{i}".encode())) for i in range(n)]
        producer.flush()
    assert all(f.result().queue_offset >= 0 for f in futures)


def test_the_topics_queues_really_spread_over_every_shard() -> None:
    homes = Counter(shard_of_queue(TOPIC, q, SHARDS) for q in range(QUEUES))
    assert homes == {0: 2, 1: 2, 2: 2}


def test_a_store_of_one_shard_keeps_its_progress_ids() -> None:
    assert (dispatch_app(0), index_app(0)) == (DISPATCH_APP, INDEX_APP)
    assert (dispatch_app(2), index_app(2)) == ("mq.dispatch.2", "mq.index.2")


def test_producers_write_each_message_to_its_queues_shard(sharded: Store) -> None:
    send_mixed(sharded, 12)
    rows = all_rows(sharded)
    assert len(rows) == 12 + 3 * QUEUES + 12
    for r in rows:
        assert (
            r["shard"]
            == shard_of_queue(TOPIC, r["queue_id"], SHARDS)
            == shard_of_offset(r["physical_offset"])
        )
    per_queue: dict[int, list[int]] = {}
    for r in rows:
        per_queue.setdefault(r["queue_id"], []).append(r["queue_offset"])
    assert all(sorted(offs) == list(range(len(offs))) for offs in per_queue.values())
    for shard in range(SHARDS):  # physical offsets unique within a shard
        offsets = [r["physical_offset"] for r in rows if r["shard"] == shard]
        assert len(set(offsets)) == len(offsets) > 0


def test_dispatch_covers_every_shard_densely_and_points_at_the_shards_rows(sharded: Store) -> None:
    send_mixed(sharded, 12)
    added = dispatch_pending(sharded)
    rows = {(r["topic"], r["queue_id"], r["queue_offset"]): r for r in all_rows(sharded)}
    entries = sharded.read(schemas.CONSUME_QUEUE).to_pylist()
    assert added == len(entries) == len(rows)
    for e in entries:
        row = rows[(e["topic"], e["queue_id"], e["queue_offset"])]
        assert e["physical_offset"] == row["physical_offset"] and e["size"] == row["size"]
        assert shard_of_offset(e["physical_offset"]) == row["shard"]
    by_queue = Counter(e["queue_id"] for e in entries)
    for q, count in by_queue.items():
        assert sorted(e["queue_offset"] for e in entries if e["queue_id"] == q) == list(range(count))
    for shard, name in enumerate(sharded.commit_logs):
        assert dispatched_version(sharded, shard) == sharded.version(name)
    assert dispatch_pending(sharded) == 0  # each shard resumes after its own marker


def test_dispatch_resumes_each_shard_from_its_own_marker(sharded: Store) -> None:
    q_on = {shard_of_queue(TOPIC, q, SHARDS): q for q in range(QUEUES)}
    with Producer(sharded) as producer:
        producer.send(Message(TOPIC, b"first"), queue_id=q_on[1])
        assert dispatch_pending(sharded) == 1
        producer.send(Message(TOPIC, b"second"), queue_id=q_on[2])
        producer.send(Message(TOPIC, b"third"), queue_id=q_on[1])
    assert dispatch_pending(sharded) == 2
    assert dispatched_version(sharded, 0) == -1  # shard 0 got nothing to dispatch beyond its creation
    assert dispatched_version(sharded, 1) == sharded.version("commit_log_1")


def test_pull_reads_every_queue_of_a_sharded_topic(sharded: Store) -> None:
    with Producer(sharded) as producer:
        for q in range(QUEUES):
            for i in range(3):
                producer.send(Message(TOPIC, f"q{q}-{i}".encode()), queue_id=q)
    dispatch_pending(sharded)
    consumer = PullConsumer(sharded, "g")
    for q in range(QUEUES):
        result = consumer.pull(TOPIC, q, 0, max_nums=8)
        assert result.status is PullStatus.FOUND
        assert [m.body for m in result.messages] == [f"q{q}-{i}".encode() for i in range(3)]
        assert {shard_of_offset(m.physical_offset) for m in result.messages} == {
            shard_of_queue(TOPIC, q, SHARDS)
        }


def test_the_index_covers_every_shard_and_points_at_the_shards_rows(sharded: Store) -> None:
    send_mixed(sharded, 9)
    index_pending(sharded)
    rows = {r["uniq_key"]: r for r in all_rows(sharded)}
    index = sharded.read(schemas.INDEX).to_pylist()
    uniq = [i for i in index if i["kind"] == "UNIQ_KEY"]
    assert sorted(i["key"] for i in uniq) == sorted(rows)
    for entry in uniq:
        assert entry["physical_offset"] == rows[entry["key"]]["physical_offset"]
    assert sorted(i["key"] for i in index if i["kind"] == "KEY") == sorted(f"k{i}" for i in range(9))
    for shard, name in enumerate(sharded.commit_logs):
        assert indexed_version(sharded, shard) == sharded.version(name)
    assert index_pending(sharded) == 0


def test_the_broker_loop_dispatches_when_only_another_shard_moved(sharded: Store) -> None:
    loop = BrokerLoop(sharded)
    loop.run_once(everything=False)
    q2 = next(q for q in range(QUEUES) if shard_of_queue(TOPIC, q, SHARDS) == 2)
    with Producer(sharded) as producer:
        producer.send(Message(TOPIC, b"x"), queue_id=q2)
    loop.run_once(everything=False)
    assert loop.errors == 0
    assert dispatched_version(sharded, 2) == sharded.version("commit_log_2")
    assert sharded.read(schemas.CONSUME_QUEUE).num_rows == 1


def test_an_async_group_over_shards_fails_only_the_sends_of_the_failing_shard(
    sharded: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = CommitLogWriter.append_batch

    def shard_one_fails(self: CommitLogWriter, *args: Any, **kwargs: Any) -> Any:
        if self.shard == 1:
            raise StoreError("shard 1 is down")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CommitLogWriter, "append_batch", shard_one_fails)
    with Producer(sharded, linger_ms=200, batch_size=QUEUES) as producer:
        futures = [producer.send_async(Message(TOPIC, f"a{q}".encode()), queue_id=q) for q in range(QUEUES)]
        producer.flush()
    for q, future in enumerate(futures):
        if shard_of_queue(TOPIC, q, SHARDS) == 1:
            assert isinstance(future.exception(), StoreError)
        else:
            assert shard_of_offset(future.result().physical_offset) == shard_of_queue(TOPIC, q, SHARDS)
    assert sharded.read("commit_log_1").num_rows == 0
    assert len(all_rows(sharded)) == 4


def _sink_rows(store: Store, queues: list[int]) -> pa.Table:
    table = pa.table(
        {
            "topic": [TOPIC] * len(queues),
            "body": [f"r{q}".encode() for q in queues],
            "queue_id": pa.array(queues, pa.int32()),
        }
    )
    return normalize_rows(table, 1)


def test_the_sink_writes_each_shard_exactly_once_per_batch(sharded: Store) -> None:
    queues = list(range(QUEUES))
    stored = commit_rows(sharded, _sink_rows(sharded, queues), "mq.sink.s", 0)
    assert [s.queue_id for s in stored] == queues  # input order
    assert commit_rows(sharded, _sink_rows(sharded, queues), "mq.sink.s", 0) == []  # a replay
    for name in sharded.commit_logs:
        assert sharded.app_version(name, "mq.sink.s") == 0
    assert sink_progress(sharded, "mq.sink.s") == 0
    assert len(all_rows(sharded)) == QUEUES


def test_a_sink_batch_cut_between_shards_is_completed_by_its_replay(
    sharded: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = CommitLogWriter.append_batch

    def shard_two_fails(self: CommitLogWriter, *args: Any, **kwargs: Any) -> Any:
        if self.shard == 2:
            raise StoreError("the driver died here")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CommitLogWriter, "append_batch", shard_two_fails)
    with pytest.raises(StoreError):
        commit_rows(sharded, _sink_rows(sharded, list(range(QUEUES))), "mq.sink.s", 4)
    monkeypatch.setattr(CommitLogWriter, "append_batch", real)
    before = len(all_rows(sharded))
    assert 0 < before < QUEUES
    stored = commit_rows(sharded, _sink_rows(sharded, list(range(QUEUES))), "mq.sink.s", 4)
    assert len(stored) == QUEUES - before  # only the shard that had not committed
    assert sorted(r["queue_id"] for r in all_rows(sharded)) == list(range(QUEUES))


@pytest.mark.spark
def test_the_spark_dispatch_and_index_jobs_follow_every_shard(spark: Any, sharded: Store) -> None:
    from engine.spark.jobs.dispatch import DispatchStats, run_dispatch
    from engine.spark.jobs.index import IndexStats, run_index

    send_mixed(sharded, 6)
    stats = DispatchStats()
    run_dispatch(spark, sharded, once=True, stats=stats)
    assert stats.entries == len(all_rows(sharded))
    run_index(spark, sharded, once=True, stats=IndexStats())
    # Only shard 2 moves now: the next runs (same checkpoints) must still find its version.
    q2 = next(q for q in range(QUEUES) if shard_of_queue(TOPIC, q, SHARDS) == 2)
    with Producer(sharded) as producer:
        producer.send(Message(TOPIC, b"late", keys=("late",)), queue_id=q2)
    again = DispatchStats()
    run_dispatch(spark, sharded, once=True, stats=again)
    indexed = IndexStats()
    run_index(spark, sharded, once=True, stats=indexed)
    assert again.entries == 1 and indexed.entries == 2  # the late message: its key and its uniq key
    for shard, name in enumerate(sharded.commit_logs):
        assert dispatched_version(sharded, shard) == sharded.version(name)
        assert indexed_version(sharded, shard) == sharded.version(name)
    assert sharded.read(schemas.CONSUME_QUEUE).num_rows == len(all_rows(sharded))


def test_a_producer_that_names_no_queue_gives_every_queue_its_share(sharded: Store) -> None:
    with Producer(sharded) as producer:
        queues = [producer._choose_queue(TOPIC, QUEUES, None, None) for _ in range(2 * QUEUES * STINT_ROUNDS)]
    assert Counter(queues) == dict.fromkeys(range(QUEUES), 2 * STINT_ROUNDS)


def test_a_single_shard_stores_round_robin_starts_at_queue_zero(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "one")
    with Producer(store) as producer:
        assert [producer._choose_queue("T", 4, None, None) for _ in range(5)] == [0, 1, 2, 3, 0]
