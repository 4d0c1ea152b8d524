"""Requests per operation on an object store, counted by the proxy in front of the S3 server (steady
state, after a warm-up): what DESIGN.md §7's round-trip budgets are made of, asserted as counts
(deterministic), never as times.

- a sync send costs two requests, its data file PUT and the conditional commit PUT (the engine
  commits itself: :mod:`engine.store.delta.direct_append`), fewer than a bare delta-rs append of one
  file (:func:`test_a_sync_send_costs_two_requests_fewer_than_a_bare_delta_rs_append`);
- a pull of 32 messages stored in one file: the look for a newer consume-queue version (one request)
  and the data file's row groups (one GET);
- a pull at the head of a queue: two looks, the consume queue's and the commit log's (the messages
  not dispatched yet are read from it), besides, once a second, the route check (one request); a pull
  far from the head does not look at the commit log;
- a pull whose messages lie in many files reads each once, and (on an object store) all at once.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, write_deltalake

from bench.s3proxy import S3Proxy
from engine import Admin, Message, Producer, PullConsumer, PullStatus, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.store.delta import file_reader
from engine.store.delta.table_cache import TableCache

pytestmark = pytest.mark.s3


@pytest.fixture
def proxy(s3_proxy: S3Proxy) -> S3Proxy:
    return s3_proxy


@pytest.fixture
def options(proxy: S3Proxy, s3_server: Any) -> dict[str, str]:
    return dict(s3_server.storage_options(endpoint=proxy.endpoint))


@pytest.fixture
def store(options: dict[str, str], s3_root: str) -> Store:
    return Store.open(s3_root, storage_options=options)


def counted(proxy: S3Proxy, action: Any) -> tuple[int, list[str]]:
    """Requests ``action()`` made, and what they were."""
    proxy.record()
    before = proxy.requests
    action()
    return proxy.requests - before, proxy.record(False)


def routed_requests(proxy: S3Proxy, action: Any) -> tuple[int, list[str]]:
    """Requests of a send or pull, without the route check: every second a client looks for a newer
    topics version (one request, as RocketMQ's clients refresh routes on a timer), whichever call it
    falls on."""
    count, seen = counted(proxy, action)
    routes = [r for r in seen if "/topics/_delta_log/" in r]
    assert len(routes) <= 1 and all(r.startswith(("HEAD ", "GET ")) for r in routes), seen
    return count - len(routes), [r for r in seen if r not in routes]


def bare_append_requests(proxy: S3Proxy, options: dict[str, str], root: str) -> int:
    """Requests of one steady-state append of one row through delta-rs alone (no engine)."""
    uri = f"{root}/bare-peer"
    row = pa.table({"a": [1]})
    write_deltalake(uri, row, storage_options=options)
    dt = DeltaTable(uri, storage_options=options)
    props = CommitProperties(max_commit_retries=0)
    hooks = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)

    def append() -> None:
        write_deltalake(dt, row, mode="append", commit_properties=props, post_commithook_properties=hooks)

    for _ in range(3):
        append()
    return counted(proxy, append)[0]


def test_a_sync_send_costs_two_requests_fewer_than_a_bare_delta_rs_append(
    proxy: S3Proxy, options: dict[str, str], store: Store, s3_root: str
) -> None:
    topic = f"T{uuid.uuid4().hex[:6]}"
    Admin(store).create_topic(topic, queues=1)
    with Producer(store, "P") as producer:
        for i in range(3):
            producer.send(Message(topic, f"warm-up {i}".encode()), queue_id=0)
        counts = []
        for i in range(3):
            count, seen = routed_requests(
                proxy, lambda i=i: producer.send(Message(topic, f"m{i}".encode()), queue_id=0)
            )
            counts.append(count)
    puts = [r for r in seen if r.startswith("PUT ")]
    assert len(puts) == 2, seen  # the data file, then the conditional commit PUT
    assert puts[0].endswith(".parquet") and "/_delta_log/" in puts[1], seen
    # The sequencer knows its next version from its own last commit: no look at the log first.
    assert counts == [2, 2, 2], seen
    bare = bare_append_requests(proxy, options, s3_root)  # (not in the assert: its options hold keys)
    assert max(counts) < bare


@pytest.fixture
def pulled(store: Store) -> tuple[str, PullConsumer]:
    """A topic whose queue 0 holds 32 messages in one file and queue 1 32 messages in 32 files,
    dispatched, with a consumer that has pulled both once (warm: footers read, snapshot loaded)."""
    topic = f"T{uuid.uuid4().hex[:6]}"
    Admin(store).create_topic(topic, queues=2)
    with Producer(store, "P") as producer:
        producer.send_batch([Message(topic, f"one {i}".encode()) for i in range(32)], queue_id=0)
        for i in range(32):
            producer.send(Message(topic, f"many {i}".encode()), queue_id=1)
    dispatch_pending(store)
    consumer = PullConsumer(store, "G")
    for queue_id in (0, 1):
        consumer.pull(topic, queue_id, 0, 32)
    return topic, consumer


def test_a_pull_of_32_from_one_file_costs_at_most_3_requests(
    proxy: S3Proxy, pulled: tuple[str, PullConsumer]
) -> None:
    topic, consumer = pulled
    results = []
    count, seen = routed_requests(proxy, lambda: results.append(consumer.pull(topic, 0, 0, 32)))
    assert results[0].status is PullStatus.FOUND and len(results[0].messages) == 32
    assert count <= 3, seen
    assert not any("list-type" in r for r in seen), seen  # no listing of the log on the way


def test_a_pull_at_the_head_of_a_queue_costs_two_requests_and_sees_what_is_not_dispatched(
    proxy: S3Proxy, pulled: tuple[str, PullConsumer], store: Store
) -> None:
    topic, consumer = pulled
    results = []
    count, seen = routed_requests(proxy, lambda: results.append(consumer.pull(topic, 0, 32, 32)))
    assert results[0].status is PullStatus.NO_NEW_MSG
    # a newer consume-queue version, and a newer commit-log version (the queue's tail): one look
    # each (a GET of the next commit file, which finds none)
    assert count == 2 and all(r.startswith(("HEAD ", "GET ")) and "/_delta_log/" in r for r in seen), (
        "\n".join(seen)
    )
    with Producer(store, "P") as producer:
        producer.send(Message(topic, b"not dispatched"), queue_id=0)
    assert [m.body for m in consumer.pull(topic, 0, 32, 32).messages] == [b"not dispatched"]


def test_a_pull_far_from_the_head_does_not_look_at_the_commit_log(
    proxy: S3Proxy, pulled: tuple[str, PullConsumer], store: Store
) -> None:
    topic, consumer = pulled
    with Producer(store, "P") as producer:
        producer.send(Message(topic, b"not dispatched"), queue_id=0)
    results = []
    _, seen = routed_requests(proxy, lambda: results.append(consumer.pull(topic, 0, 0, 32)))
    assert len(results[0].messages) == 32
    assert not any("/commit_log/_delta_log/" in r for r in seen), seen


def test_a_pull_from_many_files_reads_each_once(
    proxy: S3Proxy, pulled: tuple[str, PullConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, consumer = pulled
    # row groups read by earlier pulls are kept (file_reader.ROW_GROUPS): start with none kept
    monkeypatch.setattr(file_reader, "ROW_GROUPS", TableCache(64 << 20))
    results = []
    count, seen = routed_requests(proxy, lambda: results.append(consumer.pull(topic, 1, 0, 32)))
    assert [m.body for m in results[0].messages] == [f"many {i}".encode() for i in range(32)]
    gets = [r for r in seen if r.startswith("GET ") and r.split("?")[0].endswith(".parquet")]
    assert len(gets) == len(set(gets)) == 32 and count <= 33, seen


@pytest.mark.parametrize("fifo", [False, True])
def test_an_idle_simple_consumers_long_poll_reads_the_action_log_once_a_scan_not_every_pass(
    proxy: S3Proxy, store: Store, fifo: bool
) -> None:
    """A receive that waits 3 s for nothing looks at the consume queue every pass (50 ms) but at the
    action log only at each scan (once a second): the "nothing new" shortcut, for a FIFO group too."""
    Admin(store).create_topic("idle", 1)
    with Producer(store, "P") as producer:
        producer.send(Message("idle", b"first"), message_group="g")
    with SimpleConsumer(store, "G", "c1", fifo=fifo) as consumer:
        consumer.subscribe("idle")
        [first] = consumer.receive(1, 30_000, wait_ms=2000)
        consumer.ack(first)
        consumer.flush()
        got: list[Any] = []
        _, seen = counted(proxy, lambda: got.extend(consumer.receive(1, 30_000, wait_ms=3000)))
        assert got == []
        log_reads = [r for r in seen if "/action_log/" in r]
        # 3 s: 3 or 4 scans of a few requests each (measured: 12 for a normal group, 10 for a FIFO
        # one; a FIFO group without the shortcut made 50), not a look every 50 ms pass.
        assert len(log_reads) <= 24, "\n".join(log_reads)
        with Producer(store, "P") as producer:
            producer.send(Message("idle", b"next"), message_group="g")
        assert [m.body for m in consumer.receive(1, 30_000, wait_ms=3000)] == [b"next"]
