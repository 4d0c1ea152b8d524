"""The pull log: action_log PULL rows -> per-consumer dense pull sequences, exactly once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Admin, Message, Producer, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.pull_log import build_pull_log, build_pull_log_rows, pull_rows
from engine.protocol.actions import ACK, PULL
from engine.store import schemas
from engine.store.action_log import ActionLogWriter
from engine.store.commit_markers import PULL_LOG_APP
from engine.store.delta.log import VERSION_COLUMN, read_versions
from engine.store.pull_log import pulled_version, read_marks


def pull_log(store: Store) -> list[dict[str, Any]]:
    rows = store.read(schemas.PULL_LOG).to_pylist()
    return sorted(rows, key=lambda r: (r["group"], r["consumer_id"], r["pull_sequence"]))


def sequences(store: Store) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for r in pull_log(store):
        out.setdefault((r["group"], r["consumer_id"]), []).append(r["pull_sequence"])
    return out


@pytest.fixture
def received(store: Store, admin: Admin) -> list[tuple[str, int]]:
    """Two SimpleConsumers of group G take turns receiving 12 messages of a 1-queue topic."""
    admin.create_topic("Q1", 1)
    with Producer(store) as producer:
        producer.send_batch([Message("Q1", f"m{i}".encode()) for i in range(12)])
    dispatch_pending(store)
    a, b = SimpleConsumer(store, "G", "a"), SimpleConsumer(store, "G", "b")
    order: list[tuple[str, int]] = []
    try:
        for consumer in (a, b):
            consumer.subscribe("Q1")
        for turn in range(4):
            consumer = (a, b)[turn % 2]
            for m in consumer.receive(max_nums=3):
                order.append((consumer.consumer_id, m.queue_offset))
                consumer.ack(m)
    finally:
        a.close()
        b.close()
    return order


def test_pull_log_has_dense_sequences_per_consumer_in_pull_order(
    store: Store, received: list[tuple[str, int]]
) -> None:
    assert build_pull_log(store) == 12
    assert sequences(store) == {("G", "a"): list(range(6)), ("G", "b"): list(range(6))}
    for consumer in ("a", "b"):
        pulled = [r["queue_offset"] for r in pull_log(store) if r["consumer_id"] == consumer]
        assert pulled == [offset for who, offset in received if who == consumer]
    assert all(r["topic"] == "Q1" and r["queue_id"] == 0 for r in pull_log(store))
    assert pulled_version(store) == store.version(schemas.ACTION_LOG)


def test_building_twice_adds_nothing(store: Store, received: list[tuple[str, int]]) -> None:
    build_pull_log(store)
    rows, version = pull_log(store), store.version(schemas.PULL_LOG)
    assert build_pull_log(store) == 0
    assert pull_log(store) == rows and store.version(schemas.PULL_LOG) == version
    # A replayed micro-batch (the same versions again) is a no-op as well.
    replay = read_versions(
        store.uri(schemas.ACTION_LOG), 0, store.version(schemas.ACTION_LOG), schemas.ACTION_LOG_SCHEMA
    )
    assert build_pull_log_rows(store, replay) == 0
    assert pull_log(store) == rows


def test_sequences_continue_across_builds(store: Store) -> None:
    writer = ActionLogWriter(store, "P", "c1")
    for offset in range(3):
        writer.record(PULL, topic="T", queue_id=0, queue_offset=offset, physical_offset=offset * 100)
        writer.flush()
        build_pull_log(store)
    writer.record(ACK, topic="T", queue_id=0, queue_offset=0, physical_offset=0)
    writer.flush()  # an ACK-only version: covered, adds no row
    assert build_pull_log(store) == 0
    assert pulled_version(store) == store.version(schemas.ACTION_LOG)
    writer.record(PULL, topic="T", queue_id=0, queue_offset=3, physical_offset=300)
    writer.flush()
    assert build_pull_log(store) == 1
    assert sequences(store) == {("P", "c1"): [0, 1, 2, 3]}
    assert read_marks(store.snapshot(schemas.PULL_LOG)) == {"P": {"c1": 4}}
    assert store.app_version(schemas.PULL_LOG, PULL_LOG_APP) == store.version(schemas.ACTION_LOG)


def test_concurrent_builders_write_each_pull_once(store: Store) -> None:
    for consumer in ("c1", "c2"):
        writer = ActionLogWriter(store, "G", consumer)
        for offset in range(5):
            writer.record(PULL, topic="T", queue_id=0, queue_offset=offset, physical_offset=offset)
            writer.flush()
    errors: list[BaseException] = []

    def build() -> None:
        try:
            build_pull_log(store, max_versions=2)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sequences(store) == {("G", "c1"): list(range(5)), ("G", "c2"): list(range(5))}


def test_pull_rows_is_pure_and_orders_by_version_then_sequence() -> None:
    actions = pa.table(
        {
            "group": ["G", "G", "G", "G"],
            "consumer_id": ["a", "a", "b", "a"],
            "sequence": [5, 4, 0, 6],
            "action": [PULL, PULL, PULL, ACK],
            "topic": ["T"] * 4,
            "queue_id": pa.array([0] * 4, pa.int32()),
            "queue_offset": [11, 10, 12, 10],
            "physical_offset": [1, 0, 2, 0],
            "ts_ms": [1, 1, 1, 1],
            VERSION_COLUMN: [7, 7, 6, 8],
        }
    )
    marks = {"G": {"a": 3}}
    rows = pull_rows(actions, marks).to_pylist()
    assert [(r["consumer_id"], r["pull_sequence"], r["queue_offset"]) for r in rows] == [
        ("b", 0, 12),
        ("a", 3, 10),
        ("a", 4, 11),
    ]
    assert marks == {"G": {"a": 5, "b": 1}}


# ----------------------------------------------------------------------------- the Spark job
@pytest.mark.spark
def test_pull_log_job_builds_exactly_once(spark: Any, store: Store, received: list[tuple[str, int]]) -> None:
    from engine.spark.jobs.pull_log import PullLogStats, run_pull_log

    stats = PullLogStats()
    query = run_pull_log(spark, store, once=True, stats=stats)
    assert not query.isActive and query.exception() is None
    assert stats.pulls == 12
    assert sequences(store) == {("G", "a"): list(range(6)), ("G", "b"): list(range(6))}
    rows, version = pull_log(store), store.version(schemas.PULL_LOG)
    assert build_pull_log(store) == 0  # the job recorded its progress: nothing left to build
    assert pull_log(store) == rows and store.version(schemas.PULL_LOG) == version


def test_pull_log_job_rejects_a_bad_store(tmp_path: Path, capsys: Any) -> None:
    from jobs.pull_log import main

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert main(["--store", str(not_a_dir), "--once"]) == 2
    assert "error" in capsys.readouterr().err
