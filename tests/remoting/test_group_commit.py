"""Wire sends share Delta commits: the sends waiting while a commit runs make up the next one."""

from __future__ import annotations

import threading

import pytest

from engine import Admin, Store
from engine.errors import TopicNotFoundError
from engine.remoting.wire_messages import incoming
from engine.remoting.wire_producer import WireProducer
from engine.store import schemas


def test_sends_queued_during_a_commit_are_committed_together(store: Store) -> None:
    Admin(store).create_topic("G", 2)
    producer = WireProducer(store, "LAKEMQ_WIRE", linger_ms=0)
    gate, entered = threading.Event(), threading.Event()
    writer = producer._producer._writer  # the commit log's writers the group commits go through
    real = writer.append_batch
    batches: list[int] = []

    def held(pending: list) -> object:  # the first commit waits until the others are queued
        batches.append(len(pending))
        entered.set()
        gate.wait(30)
        return real(pending)

    writer.append_batch = held  # type: ignore[method-assign]
    before = store.version(schemas.COMMIT_LOG)
    try:
        first = producer.send_wire_grouped(incoming("G", b"first", {}), 0).future
        assert entered.wait(30)
        rest = [
            producer.send_wire_grouped(incoming("G", f"m{i}".encode(), {}), i % 2).future for i in range(6)
        ]
        gate.set()
        results = [first.result(30), *(f.result(30) for f in rest)]
    finally:
        gate.set()
        producer.close()
    assert batches == [1, 6]
    assert store.version(schemas.COMMIT_LOG) == before + 2
    assert [r.queue_offset for r in results if r.queue_id == 0] == [0, 1, 2, 3]
    assert [r.queue_offset for r in results if r.queue_id == 1] == [0, 1, 2]


def test_a_bad_message_is_refused_before_it_is_queued(store: Store) -> None:
    producer = WireProducer(store, "LAKEMQ_WIRE", linger_ms=0)
    before = store.version(schemas.COMMIT_LOG)
    try:
        with pytest.raises(TopicNotFoundError):
            producer.send_wire_grouped(incoming("Missing", b"x", {}), 0)
    finally:
        producer.close()
    assert store.version(schemas.COMMIT_LOG) == before
