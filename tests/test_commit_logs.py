"""Appending across commit-log shards: a batch split by the shard of each queue, committed per shard,
offsets in input order; a shard's writer refuses messages of another shard's queues."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow.compute as pc
import pytest

from engine.config import load_config
from engine.errors import InvalidArgumentError
from engine.protocol.shards import shard_base, shard_of_offset, shard_of_queue
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.shards import CommitLogs
from engine.store.commit_log.stamping import PendingBatch, PendingMessage
from engine.store.store import Store

TOPIC = "Orders"


def sharded(tmp_path: Path, shards: int) -> Store:
    return Store.open(tmp_path / "mq", config=load_config(commit_log_shards=shards))


def msg(queue_id: int, i: int, topic: str = TOPIC) -> PendingMessage:
    return PendingMessage(topic, queue_id, f"m{i}".encode(), f"U{i:04d}")


def rows_of(store: Store) -> dict[str, int]:
    return {name: store.read(name).num_rows for name in store.commit_logs}


def test_the_queues_used_here_land_on_every_shard() -> None:
    assert [shard_of_queue(TOPIC, q, 3) for q in range(3)] != [0, 0, 0]
    assert sorted(shard_of_queue(TOPIC, q, 3) for q in range(3)) == [0, 1, 2]


def test_a_batch_over_three_shards_is_one_commit_per_shard_with_offsets_in_input_order(
    tmp_path: Path,
) -> None:
    store = sharded(tmp_path, 3)
    logs = CommitLogs(store)
    batch = [msg(i % 3, i) for i in range(9)]
    stamped = logs.append(batch)
    assert [s.uniq_key for s in stamped] == [m.uniq_key for m in batch]
    assert [shard_of_offset(s.physical_offset) for s in stamped] == [
        shard_of_queue(TOPIC, i % 3, 3) for i in range(9)
    ]
    for q in range(3):  # every queue dense, in input order
        assert [s.queue_offset for s in stamped if s.queue_id == q] == [0, 1, 2]
    assert rows_of(store) == {"commit_log": 3, "commit_log_1": 3, "commit_log_2": 3}
    assert all(store.version(name) == 1 for name in store.commit_logs[1:])  # one commit each
    for shard, name in enumerate(store.commit_logs):
        offsets = sorted(store.read(name)["physical_offset"].to_pylist())
        assert offsets[0] == shard_base(shard)
    logs.close()


def test_a_batch_of_one_shard_keeps_its_commit_version(tmp_path: Path) -> None:
    store = sharded(tmp_path, 3)
    shard = shard_of_queue(TOPIC, 1, 3)
    stamped = CommitLogs(store).append_batch([msg(1, 0), msg(1, 1)])
    assert stamped.version == store.version(store.commit_logs[shard])
    assert {shard_of_offset(p) for p in stamped.physical} == {shard}


def test_a_single_shard_store_appends_exactly_as_its_writer(tmp_path: Path) -> None:
    store = sharded(tmp_path, 1)
    stamped = CommitLogs(store).append([msg(0, 0), msg(3, 1)])
    assert [s.physical_offset for s in stamped] == [0, stamped[1].physical_offset]
    assert store.version("commit_log") == 1 and stamped[0].version == 1


def test_app_transactions_need_a_shard_in_a_store_of_several_and_nothing_is_written(tmp_path: Path) -> None:
    store = sharded(tmp_path, 3)
    with pytest.raises(InvalidArgumentError, match="shard="):
        CommitLogs(store).append([msg(0, 0)], app_transactions={"mq.test": 1})
    assert rows_of(store) == {"commit_log": 0, "commit_log_1": 0, "commit_log_2": 0}


def test_app_transactions_go_on_the_shard_named_and_guard_it(tmp_path: Path) -> None:
    store = sharded(tmp_path, 3)
    logs = CommitLogs(store)
    shard = shard_of_queue(TOPIC, 2, 3)
    assert logs.append([msg(2, 0)], shard=shard, app_transactions={"mq.test": 5})
    assert logs.append([msg(2, 1)], shard=shard, app_transactions={"mq.test": 5}) == []  # a replay
    assert store.app_version(store.commit_logs[shard], "mq.test") == 5
    assert all(
        store.app_version(n, "mq.test") == -1 for n in store.commit_logs if n != store.commit_logs[shard]
    )


def test_a_message_of_another_shards_queue_is_refused_by_the_named_shard(tmp_path: Path) -> None:
    store = sharded(tmp_path, 3)
    other = (shard_of_queue(TOPIC, 0, 3) + 1) % 3
    with pytest.raises(InvalidArgumentError, match="lives in commit-log shard"):
        CommitLogs(store).append([msg(0, 0)], shard=other)
    assert store.read(store.commit_logs[other]).num_rows == 0


@pytest.mark.parametrize("mixed", [False, True])
def test_a_shards_writer_refuses_a_batch_with_a_queue_of_another_shard(tmp_path: Path, mixed: bool) -> None:
    store = sharded(tmp_path, 3)
    home = shard_of_queue(TOPIC, 0, 3)
    foreign = next(q for q in range(3) if shard_of_queue(TOPIC, q, 3) != home)
    batch = [msg(0, 0), msg(foreign, 1)] if mixed else [msg(foreign, 0), msg(foreign, 1)]
    writer = CommitLogWriter(store, shard=home)
    with pytest.raises(InvalidArgumentError) as caught:
        writer.append(batch)
    assert caught.value.context["queue_id"] == foreign
    assert store.version(store.commit_logs[home]) == (0 if home else 1)  # only the creation commits
    assert store.read(store.commit_logs[home]).num_rows == 0


def test_a_writer_of_a_single_shard_store_takes_every_queue(tmp_path: Path) -> None:
    store = sharded(tmp_path, 1)
    assert len(CommitLogWriter(store).append([msg(q, q) for q in range(8)])) == 8


def test_the_writer_of_a_shard_is_made_once_and_a_missing_shard_is_refused(tmp_path: Path) -> None:
    logs = CommitLogs(sharded(tmp_path, 2))
    assert logs.writer(1) is logs.writer(1)
    assert logs.writer(1).shard == 1
    with pytest.raises(InvalidArgumentError):
        logs.writer(2)


def test_commit_parts_tells_each_shards_outcome(tmp_path: Path) -> None:
    store = sharded(tmp_path, 3)
    parts = CommitLogs(store).commit_parts(PendingBatch.of([msg(i % 3, i) for i in range(6)]))
    assert sorted(p.shard for p in parts) == [0, 1, 2]
    for part in parts:
        assert part.error is None and part.stamped is not None
        assert [shard_of_queue(TOPIC, i % 3, 3) for i in part.positions] == [part.shard] * 2
        assert {shard_of_offset(p) for p in part.stamped.physical} == {part.shard}


def test_threads_appending_across_shards_keep_every_queue_dense(tmp_path: Path) -> None:
    store = sharded(tmp_path, 3)
    logs = CommitLogs(store)
    errors: list[BaseException] = []

    def send(worker: int) -> None:
        try:
            for i in range(5):
                logs.append([msg(q, worker * 100 + i * 10 + q) for q in range(3)])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for q in range(3):
        name = store.commit_logs[shard_of_queue(TOPIC, q, 3)]
        offsets = sorted(store.read(name, filter=pc.field("queue_id") == q)["queue_offset"].to_pylist())
        assert offsets == list(range(20))
    assert logs.conflicts == 0  # one writer per shard in a process: its threads take turns
    logs.close()
