"""The distributed ``mq`` sink: tasks check and stage their partitions, the driver commits them one at a
time, exactly once per (sink, partition, batch) across crashes, retried attempts and replays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import InvalidArgumentError, Store, StoreError, TopicNotFoundError
from engine.spark import mq_sink
from engine.spark.mq_sink import MQStaged, commit_staged, partition_app, sink_progress
from engine.spark.sink_rows import normalize_rows, pending_batch
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.staging import STAGING_DIR, drop_write, new_write_id, stage, staged_files
from tests.helpers import commit_log_rows


def _rows(topic: str, bodies: list[str]) -> pa.Table:
    table = pa.table({"topic": [topic] * len(bodies), "body": [b.encode() for b in bodies]})
    return normalize_rows(table, 1)


def _columns(store: Store, topic: str, bodies: list[str]) -> pa.Table:
    """What a task stages: the commit log's offset-free columns of its checked rows."""
    return pending_batch(store, _rows(topic, bodies)).columns


def _staged(store: Store, write_id: str, topic: str) -> list[MQStaged]:
    parts = []
    for p, bodies in enumerate([["a0", "a1"], ["b0"], ["c0", "c1", "c2"]]):
        path = stage(store, write_id, f"p{p}-attempt0", _columns(store, topic, bodies))
        parts.append(MQStaged(path, len(bodies), p))
    return parts


def _bodies(store: Store) -> list[bytes]:
    return sorted(bytes(r["body"]) for r in commit_log_rows(store))  # type: ignore[arg-type]


ALL = sorted(b.encode() for b in ["a0", "a1", "b0", "c0", "c1", "c2"])


def test_each_staged_partition_is_one_commit_in_partition_order(store: Store, topic: str) -> None:
    write_id = new_write_id()
    before = store.version(schemas.COMMIT_LOG)
    stored = commit_staged(store, list(reversed(_staged(store, write_id, topic))), None, None)
    assert store.version(schemas.COMMIT_LOG) == before + 3
    assert [(c.partition, c.rows, c.version) for c in stored] == [
        (0, 2, before + 1),
        (1, 1, before + 2),
        (2, 3, before + 3),
    ]
    assert _bodies(store) == ALL
    drop_write(store, write_id)
    assert list(staged_files(store, write_id)) == []


def test_a_batch_replayed_after_a_crash_between_partitions_writes_each_once(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = _staged(store, new_write_id(), topic)
    real = CommitLogWriter.append_batch
    calls = {"n": 0}

    def crash_on_second(self: CommitLogWriter, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise StoreError("the driver died here")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CommitLogWriter, "append_batch", crash_on_second)
    with pytest.raises(StoreError, match="died"):
        commit_staged(store, parts, "mq.sink.copy", 7)
    monkeypatch.setattr(CommitLogWriter, "append_batch", real)
    assert _bodies(store) == [b"a0", b"a1"]
    assert (sink_progress(store, "mq.sink.copy") or -1) < 7  # the batch is not complete
    assert store.app_version(schemas.COMMIT_LOG, partition_app("mq.sink.copy", 0)) == 7

    commit_staged(store, parts, "mq.sink.copy", 7)  # the replay
    assert _bodies(store) == ALL
    assert sink_progress(store, "mq.sink.copy") == 7
    before = store.version(schemas.COMMIT_LOG)
    assert commit_staged(store, parts, "mq.sink.copy", 7) == []  # complete: nothing more
    assert store.version(schemas.COMMIT_LOG) == before


def test_a_batch_below_the_recorded_one_is_a_reset_checkpoint(store: Store, topic: str) -> None:
    parts = _staged(store, new_write_id(), topic)
    commit_staged(store, parts, "mq.sink.copy", 3)
    before = store.version(schemas.COMMIT_LOG)
    with pytest.raises(InvalidArgumentError, match="checkpoint was reset"):
        commit_staged(store, parts, "mq.sink.copy", 2)
    assert store.version(schemas.COMMIT_LOG) == before


def test_only_the_attempt_spark_committed_is_written_and_leftovers_are_dropped(
    store: Store, topic: str
) -> None:
    write_id = new_write_id()
    stage(store, write_id, "p0-attempt0", _columns(store, topic, ["lost"]))  # a failed or slower attempt
    winner = stage(store, write_id, "p0-attempt1", _columns(store, topic, ["kept"]))
    commit_staged(store, [MQStaged(winner, 1, 0)], "mq.sink.spec", 0)
    assert _bodies(store) == [b"kept"]
    assert len(list(staged_files(store, write_id))) == 2
    drop_write(store, write_id)
    assert not (Path(store.root) / STAGING_DIR / write_id).exists()


def test_staging_names_are_checked(store: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="write id"):
        stage(store, "../escape", "p0", _rows("T", ["x"]))
    with pytest.raises(InvalidArgumentError, match="staged name"):
        stage(store, new_write_id(), "a/b", _rows("T", ["x"]))


@pytest.mark.spark
def test_a_dataframe_write_commits_one_commit_per_partition_and_leaves_no_staging(
    spark: Any, store: Store, topic: str
) -> None:
    before = store.version(schemas.COMMIT_LOG)
    frame = spark.range(40, numPartitions=4).selectExpr(f"'{topic}' AS topic", "CAST(id AS STRING) AS body")
    frame.write.format("mq").option("store", store.root).mode("append").save()
    assert store.version(schemas.COMMIT_LOG) == before + 4
    assert _bodies(store) == sorted(str(i).encode() for i in range(40))
    staging = Path(store.root) / STAGING_DIR
    assert not staging.exists() or not any(staging.iterdir())


@pytest.mark.spark
def test_a_bad_row_in_one_partition_writes_no_partition(spark: Any, store: Store, topic: str) -> None:
    before = store.version(schemas.COMMIT_LOG)
    frame = spark.range(40, numPartitions=4).selectExpr(
        f"IF(id = 39, 'NO_SUCH_TOPIC', '{topic}') AS topic", "CAST(id AS STRING) AS body"
    )
    with pytest.raises(Exception, match="TopicNotFoundError"):
        frame.write.format("mq").option("store", store.root).mode("append").save()
    assert store.version(schemas.COMMIT_LOG) == before
    staging = Path(store.root) / STAGING_DIR
    assert not staging.exists() or not any(staging.iterdir())


def test_a_task_checks_topics_before_staging(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.spark.mq_options import WriteOptions
    from engine.spark.mq_sink import MQBatchWriter

    writer = MQBatchWriter(WriteOptions.parse({"store": store.root}, streaming=False), None)  # type: ignore[arg-type]
    table = pa.table({"topic": ["NOPE"], "body": [b"x"]})
    with pytest.raises(TopicNotFoundError):
        writer.write(iter(table.to_batches()))
    assert list(staged_files(store, writer.write_id)) == []
    good = writer.write(iter(pa.table({"topic": [topic], "body": [b"x"]}).to_batches()))
    assert isinstance(good, MQStaged) and good.rows == 1
    assert mq_sink.read_staged(store, good.path).num_rows == 1


def test_check_rows_rejects_each_bad_destination_column_wise(store: Store, topic: str) -> None:
    from engine import InvalidMessageError
    from engine.spark.sink_rows import check_rows

    def rows(**columns: list[Any]) -> pa.Table:
        n = len(columns["topic"])
        return normalize_rows(pa.table({"body": [b"x"] * n, **columns}), 1)

    assert set(check_rows(store, rows(topic=[topic, topic], queue_id=[0, 3]))) == {topic}  # 4 queues
    with pytest.raises(InvalidArgumentError, match="queue_id 4 is out of range"):
        check_rows(store, rows(topic=[topic, topic], queue_id=[None, 4]))
    with pytest.raises(InvalidArgumentError, match="queue_id -1 is out of range"):
        check_rows(store, rows(topic=[topic], queue_id=[-1]))
    with pytest.raises(InvalidArgumentError, match="sharding_key"):
        check_rows(store, rows(topic=[topic, topic], sharding_key=["k", ""]))
    with pytest.raises(TopicNotFoundError):
        check_rows(store, rows(topic=[topic, "NOPE"]))
    with pytest.raises(InvalidMessageError, match="system topic"):
        check_rows(store, rows(topic=["SCHEDULE_TOPIC_XXXX"]))
