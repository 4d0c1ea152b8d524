"""A commit whose answer was lost on an object store is committed exactly once and reported right.

The proxy forwards the commit's conditional PUT, the server stores it, and the client hears 503
(``after=True``): object_store retries the PUT, which meets 412 "version already exists". A writer
that took that for a lost race would stamp its messages again and commit them a second time; one that
reported a failure would make an application that retries send them twice. Each case here checks
that the fault really hit the commit PUT, that the table holds exactly one copy, and that the call
returned what landed.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from bench.s3proxy import RemoteRule, S3Proxy
from engine import Admin, Message, Producer, PullConsumer, PullStatus, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.errors import CommitStateUnknownError
from engine.store import schemas

pytestmark = pytest.mark.s3


@pytest.fixture
def proxy(s3_proxy: S3Proxy) -> S3Proxy:
    return s3_proxy


@pytest.fixture
def store(proxy: S3Proxy, s3_server: Any, s3_root: str) -> Store:
    return Store.open(s3_root, storage_options=s3_server.storage_options(endpoint=proxy.endpoint))


@pytest.fixture
def topic(store: Store) -> str:
    name = f"T{uuid.uuid4().hex[:6]}"
    Admin(store).create_topic(name, queues=1)
    return name


def lose_next_answer(proxy: S3Proxy, store: Store, table: str) -> RemoteRule:
    """Make the next commit PUT of ``table`` land and answer 503; returns the rule."""
    version = store.snapshot(table).version() + 1
    return proxy.fail(rf"/{table}/_delta_log/0*{version}\.json", method="PUT", status=503, after=True)


def rows(store: Store, topic: str) -> list[tuple[int, bytes]]:
    table = store.read(schemas.COMMIT_LOG, columns=["topic", "queue_offset", "body"]).to_pylist()
    return sorted((r["queue_offset"], r["body"]) for r in table if r["topic"] == topic)


def test_a_send_whose_commit_answer_was_lost_is_stored_once(proxy: S3Proxy, store: Store, topic: str) -> None:
    with Producer(store, "P") as producer:
        producer.send(Message(topic, b"before"), queue_id=0)
        rule = lose_next_answer(proxy, store, schemas.COMMIT_LOG)
        result = producer.send(Message(topic, b"lost"), queue_id=0)
        after = producer.send(Message(topic, b"after"), queue_id=0)
    assert rule.hits, "the fault did not hit the commit PUT"
    assert (result.queue_offset, after.queue_offset) == (1, 2)
    assert rows(store, topic) == [(0, b"before"), (1, b"lost"), (2, b"after")]


def test_a_batch_whose_commit_answer_was_lost_is_stored_once(
    proxy: S3Proxy, store: Store, topic: str
) -> None:
    with Producer(store, "P") as producer:
        rule = lose_next_answer(proxy, store, schemas.COMMIT_LOG)
        results = producer.send_batch([Message(topic, f"b{i}".encode()) for i in range(3)], queue_id=0)
    assert rule.hits
    assert [r.queue_offset for r in results] == [0, 1, 2]
    assert rows(store, topic) == [(0, b"b0"), (1, b"b1"), (2, b"b2")]


def test_an_async_send_whose_commit_answer_was_lost_is_stored_once(
    proxy: S3Proxy, store: Store, topic: str
) -> None:
    with Producer(store, "P") as producer:
        rule = lose_next_answer(proxy, store, schemas.COMMIT_LOG)
        result = producer.send_async(Message(topic, b"async"), queue_id=0).result(timeout=60)
    assert rule.hits
    assert result.queue_offset == 0
    assert rows(store, topic) == [(0, b"async")]


def test_a_dispatch_commit_whose_answer_was_lost_indexes_each_message_once(
    proxy: S3Proxy, store: Store, topic: str
) -> None:
    with Producer(store, "P") as producer:
        producer.send_batch([Message(topic, f"m{i}".encode()) for i in range(3)], queue_id=0)
    rule = lose_next_answer(proxy, store, schemas.CONSUME_QUEUE)
    dispatch_pending(store)
    dispatch_pending(store)
    assert rule.hits
    entries = store.read(schemas.CONSUME_QUEUE, columns=["topic", "queue_offset"]).to_pylist()
    assert sorted(e["queue_offset"] for e in entries if e["topic"] == topic) == [0, 1, 2]
    result = PullConsumer(store, "G").pull(topic, 0, 0, 32)
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"m0", b"m1", b"m2"]


def test_an_offset_commit_whose_answer_was_lost_is_recorded_once(
    proxy: S3Proxy, store: Store, topic: str
) -> None:
    consumer = PullConsumer(store, "G")
    rule = lose_next_answer(proxy, store, schemas.CONSUMER_OFFSET)
    consumer.commit_offset(topic, 0, 5)
    assert rule.hits
    offsets = store.read(schemas.CONSUMER_OFFSET).to_pylist()
    assert [(o["topic"], o["offset"]) for o in offsets if o["topic"] == topic] == [(topic, 5)]
    assert PullConsumer(store, "G").committed_offset(topic, 0) == 5


def test_an_action_log_commit_whose_answer_was_lost_leases_once(
    proxy: S3Proxy, store: Store, topic: str
) -> None:
    with Producer(store, "P") as producer:
        producer.send_batch([Message(topic, f"m{i}".encode()) for i in range(3)], queue_id=0)
    dispatch_pending(store)
    consumer = SimpleConsumer(store, "S", "c1", consume_from="FIRST", ack_linger_ms=0)
    consumer.subscribe(topic)
    try:
        rule = lose_next_answer(proxy, store, schemas.ACTION_LOG)
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            got.extend(consumer.receive(16, wait_ms=300))
        assert rule.hits
        assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]
        assert consumer.receive(16) == []  # nothing handed out twice
    finally:
        consumer.close()
    actions = store.read(schemas.ACTION_LOG).to_pylist()
    pulls = [a for a in actions if a["action"] == "PULL" and a["topic"] == topic]
    assert len(pulls) == 1, pulls


def test_a_commit_answered_after_the_client_timeout_is_unknown_never_failed_and_stored_once(
    s3_server: Any, s3_root: str
) -> None:
    # object_store does not retry a conditional PUT that timed out: when the version is still free
    # the request may yet land (here it does, 2.5 s later), so the send says "unknown", not "failed".
    with S3Proxy(s3_server.endpoint) as proxy:
        options = {**s3_server.storage_options(endpoint=proxy.endpoint), "timeout": "1s"}
        store = Store.open(s3_root, storage_options=options)
        topic = f"T{uuid.uuid4().hex[:6]}"
        Admin(store).create_topic(topic, queues=1)
        with Producer(store, "P") as producer:
            producer.send(Message(topic, b"before"), queue_id=0)
            version = store.snapshot(schemas.COMMIT_LOG).version() + 1
            rule = proxy.slow(rf"/commit_log/_delta_log/0*{version}\.json", 2_500, method="PUT")
            with pytest.raises(CommitStateUnknownError):
                producer.send(Message(topic, b"slow"), queue_id=0)
            time.sleep(3)  # the held request reaches the server
            after = producer.send(Message(topic, b"after"), queue_id=0)
        assert rule.hits
        assert after.queue_offset == 2
        assert rows(store, topic) == [(0, b"before"), (1, b"slow"), (2, b"after")]
