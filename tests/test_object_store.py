"""The core API on both stores: a local directory and an S3 server (``any_store``; CONVENTIONS 14:
where the two differ the object-store path is the reference). Plus what only an object store can
do wrong: a missing bucket, refused credentials, an unreachable endpoint, a commit whose answer was
lost."""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from engine import (
    Admin,
    ConsumeResult,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SimpleConsumer,
    Store,
    TransactionProducer,
)
from engine.broker.compaction import compact
from engine.broker.dispatch import dispatch_pending
from engine.broker.maintenance import checkpoint, vacuum
from engine.broker.retention import retain
from engine.errors import (
    BucketNotFoundError,
    StoreAccessDeniedError,
    StoreError,
    StoreUnreachableError,
)
from engine.protocol import SCHEDULE_TOPIC
from engine.store import schemas
from engine.store.commit_log import hwm as commit_log_marks
from engine.store.commit_log import saved_marks
from engine.store.delta import delete_object, delete_prefix, get_object, list_objects, put_object
from engine.store.delta.objects import storage_failure
from engine.store.maintenance import listing
from engine.store.staging import drop_write, new_write_id, read_staged, stage, staged_files
from engine.store.status import JobStatus, read_statuses, write_status


def _topic(store: Store, queues: int = 1) -> str:
    name = f"T{uuid.uuid4().hex[:6]}"
    Admin(store).create_topic(name, queues=queues)
    return name


def _offsets(store: Store, topic: str, queue_id: int = 0) -> list[int]:
    rows = store.read(schemas.COMMIT_LOG, columns=["topic", "queue_id", "queue_offset"]).to_pylist()
    return sorted(r["queue_offset"] for r in rows if r["topic"] == topic and r["queue_id"] == queue_id)


def _pull_bodies(store: Store, topic: str, queue_id: int = 0, group: str = "reader") -> list[bytes]:
    dispatch_pending(store)
    result = PullConsumer(store, group).pull(topic, queue_id, 0, 32)
    return [m.body for m in result.messages] if result.status is PullStatus.FOUND else []


def _eventually(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"did not hold within {timeout} s")


# ----------------------------------------------------------------------------- producing and pulling
def test_send_batch_and_async_land_once_with_dense_offsets_and_are_pulled(any_store: Store) -> None:
    topic = _topic(any_store)
    with Producer(any_store, "P") as producer:
        first = producer.send(Message(topic, b"one"), queue_id=0)
        batch = producer.send_batch([Message(topic, f"b{i}".encode()) for i in range(3)], queue_id=0)
        later = producer.send_async(Message(topic, b"async"), queue_id=0).result(timeout=60)
    assert [first.queue_offset, *(r.queue_offset for r in batch), later.queue_offset] == [0, 1, 2, 3, 4]
    assert _offsets(any_store, topic) == [0, 1, 2, 3, 4]
    assert _pull_bodies(any_store, topic) == [b"one", b"b0", b"b1", b"b2", b"async"]


def test_a_transaction_half_is_hidden_until_committed(any_store: Store) -> None:
    topic = _topic(any_store)
    with TransactionProducer(
        any_store, lambda m: LocalTransactionState.UNKNOWN, check_poll_ms=3_600_000
    ) as tx:
        result = tx.send_in_transaction(Message(topic, b"paid"), lambda m: LocalTransactionState.COMMIT, 0)
    assert result.local_state is LocalTransactionState.COMMIT
    assert _pull_bodies(any_store, topic) == [b"paid"]


def test_a_delayed_message_is_dispatched_to_the_schedule_topic_not_its_own(any_store: Store) -> None:
    topic = _topic(any_store)
    with Producer(any_store, "P") as producer:
        producer.send(Message(topic, b"later"), queue_id=0, delay_level=3)
    dispatch_pending(any_store)
    assert _pull_bodies(any_store, topic) == []
    entries = any_store.read(schemas.CONSUME_QUEUE, columns=["topic", "queue_id"]).to_pylist()
    assert {"topic": SCHEDULE_TOPIC, "queue_id": 2} in entries  # level 3: schedule queue 2


def test_offsets_are_committed_and_read_back(any_store: Store) -> None:
    topic = _topic(any_store)
    consumer = PullConsumer(any_store, "G")
    consumer.commit_offset(topic, 0, 7)
    assert PullConsumer(any_store, "G").committed_offset(topic, 0) == 7


def test_a_simple_consumer_receives_and_acks(any_store: Store) -> None:
    topic = _topic(any_store)
    with Producer(any_store, "P") as producer:
        producer.send_batch([Message(topic, f"m{i}".encode()) for i in range(3)], queue_id=0)
    dispatch_pending(any_store)
    consumer = SimpleConsumer(any_store, "S", "c1", consume_from="FIRST", ack_linger_ms=0)
    consumer.subscribe(topic)
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            got.extend(consumer.receive(16, wait_ms=500))
        assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]
        for message in got:
            consumer.ack(message)
    finally:
        consumer.close()


def test_a_push_consumer_consumes_what_is_sent(any_store: Store) -> None:
    topic = _topic(any_store)
    seen: list[bytes] = []
    lock = threading.Lock()

    def listener(messages: list[MessageExt]) -> ConsumeResult:
        with lock:
            seen.extend(m.body for m in messages)
        return ConsumeResult.SUCCESS

    with Producer(any_store, "P") as producer:
        producer.send_batch([Message(topic, f"p{i}".encode()) for i in range(3)], queue_id=0)
    dispatch_pending(any_store)
    consumer = PushConsumer(
        any_store, "Push", consume_from="FIRST", rebalance_interval_ms=150, pull_suspend_ms=100
    )
    consumer.subscribe(topic, "*")
    consumer.register_listener(listener)
    consumer.start()
    try:
        _eventually(lambda: len(seen) >= 3)
    finally:
        consumer.shutdown()
    assert sorted(seen) == [b"p0", b"p1", b"p2"]


# ----------------------------------------------------------------------------- side files
def test_a_commit_log_checkpoint_saves_the_marks_and_they_load_back(any_store: Store) -> None:
    topic = _topic(any_store)
    snapshot = any_store.snapshot(schemas.COMMIT_LOG)
    snapshot.set_properties({"delta.checkpointInterval": "5"})  # cross one sooner than at 100
    with Producer(any_store, "P") as producer:
        results = [producer.send(Message(topic, f"m{i}".encode()), queue_id=0) for i in range(8)]
    assert [r.queue_offset for r in results] == list(range(8))  # the checkpointing send did not fail
    version = any_store.snapshot(schemas.COMMIT_LOG).version()
    saved = saved_marks.load(any_store.uri(schemas.COMMIT_LOG), any_store.storage_options, version)
    assert saved is not None and saved[0] % 5 == 0 and saved[0] > 0
    assert saved[1].next_queue_offset(topic, 0) == saved[0] - (version - 8)
    checkpoint(any_store, schemas.COMMIT_LOG)  # the maintenance job's checkpoint saves them too
    latest = any_store.snapshot(schemas.COMMIT_LOG)
    loaded = saved_marks.load(latest.uri, any_store.storage_options, latest.version())
    assert loaded is not None and loaded[0] == latest.version()
    assert loaded[1].to_json() == commit_log_marks.read_hwm(latest).to_json()
    # A log cleanup: the commits before the checkpoint are deleted, as delta-rs's cleanup does.
    log = any_store.uri(schemas.COMMIT_LOG)
    for info in list_objects(log, "_delta_log", any_store.storage_options):
        name = info.path.removeprefix("_delta_log/")
        if name.endswith(".json") and name[:-5].isdigit() and int(name[:-5]) < latest.version():
            delete_object(log, info.path, any_store.storage_options)
    reopened = Store.open(any_store.root, any_store.storage_options)
    assert commit_log_marks.read_hwm(reopened.snapshot(schemas.COMMIT_LOG)).to_json() == loaded[1].to_json()
    with Producer(reopened, "P2") as producer:
        assert producer.send(Message(topic, b"after"), queue_id=0).queue_offset == 8


def test_status_files_are_written_and_read(any_store: Store) -> None:
    write_status(any_store, JobStatus("dispatch", "running", 1, batch_id=3))
    write_status(any_store, JobStatus("dispatch", "stopped", 2, batch_id=4))
    write_status(any_store, JobStatus("index", "finished", 3))
    assert [(s.job, s.state, s.batch_id) for s in read_statuses(any_store)] == [
        ("dispatch", "stopped", 4),
        ("index", "finished", None),
    ]


def test_rows_are_staged_on_the_store_read_back_and_dropped(any_store: Store) -> None:
    write = new_write_id()
    rows = pa.table({"a": [1, 2, 3]})
    path = stage(any_store, write, "task-0", rows)
    stage(any_store, write, "task-1", rows.slice(0, 1))
    assert list(staged_files(any_store, write)) == [f"{write}/task-0.arrow", f"{write}/task-1.arrow"]
    assert read_staged(any_store, path).equals(rows)
    drop_write(any_store, write)
    drop_write(any_store, write)  # gone already: nothing happens
    assert list(staged_files(any_store, write)) == []
    with pytest.raises(StoreError, match="gone"):
        read_staged(any_store, path)


def test_side_objects_are_put_whole_got_listed_and_deleted(any_store: Store) -> None:
    root, options = any_store.root, any_store.storage_options
    assert get_object(root, "_side/a.json", options) is None
    put_object(root, "_side/a.json", b"one", options)
    put_object(root, "_side/a.json", b"two", options)  # replaced whole
    put_object(root, "_side/deep/b.bin", bytes(range(256)), options)
    assert get_object(root, "_side/a.json", options) == b"two"
    assert [(o.path, o.size) for o in list_objects(root, "_side", options)] == [
        ("_side/a.json", 3),
        ("_side/deep/b.bin", 256),
    ]
    delete_object(root, "_side/a.json", options)
    delete_object(root, "_side/a.json", options)
    delete_prefix(root, "_side", options)
    assert list_objects(root, "_side", options) == []
    with pytest.raises(StoreError, match="relative"):
        put_object(root, "../escape", b"x", options)


def test_object_store_failures_become_one_line_typed_errors() -> None:
    dump = (
        "Kernel error -> Generic S3 error\n  \x1b[31m↳\x1b[0m Error performing GET "
        "http://127.0.0.1:9/b/x in 2s\n   \x1b[31m↳\x1b[0m tcp connect error\n"
        "    \x1b[31m↳\x1b[0m Connection refused (os error 111)\n"
    )
    unreachable = storage_failure(OSError(dump), "cannot load", "s3://b/x")
    assert isinstance(unreachable, StoreUnreachableError)
    assert str(unreachable).endswith(
        "cannot be reached at http://127.0.0.1:9: Connection refused (os error 111)"
    )
    missing = storage_failure(OSError("...<Code>NoSuchBucket</Code>..."), "cannot load", "s3://gone/x")
    assert isinstance(missing, BucketNotFoundError) and missing.context["bucket"] == "gone"
    denied = storage_failure(OSError("403 Forbidden\n<Code>AccessDenied</Code>"), "cannot load", "s3://b/x")
    assert isinstance(denied, StoreAccessDeniedError) and "(AccessDenied)" in str(denied)
    other = storage_failure(
        OSError("Kernel error -> Parse\n  \x1b[31m↳\x1b[0m bad json\n"), "cannot load", "s3://b/x"
    )
    assert type(other) is StoreError and str(other) == "cannot load: Kernel error -> Parse ... bad json"


# ----------------------------------------------------------------------------- maintenance
def test_compaction_retention_and_vacuum_keep_the_queue_readable(any_store: Store) -> None:
    topic = _topic(any_store)
    with Producer(any_store, "P") as producer:
        for i in range(6):
            producer.send(Message(topic, f"m{i}".encode()), queue_id=0)
    dispatch_pending(any_store)
    before = listing(any_store, schemas.COMMIT_LOG)
    assert len(before) >= 6
    report = compact(any_store, schemas.COMMIT_LOG, min_files=2)
    assert report[schemas.COMMIT_LOG]["files_removed"] >= 6
    assert _pull_bodies(any_store, topic) == [f"m{i}".encode() for i in range(6)]
    consumer = PullConsumer(any_store, "G")
    consumer.commit_offset(topic, 0, 6)
    retain(any_store, file_reserved_hours=0, force=True)
    vacuumed = vacuum(any_store, 0, table=schemas.COMMIT_LOG)
    assert vacuumed[schemas.COMMIT_LOG] >= 6
    after = listing(any_store, schemas.COMMIT_LOG)
    assert not (before & after)  # every file written before compaction was vacuumed
    with Producer(any_store, "P") as producer:
        assert producer.send(Message(topic, b"next"), queue_id=0).queue_offset == 6


# ----------------------------------------------------------------------------- many writers
def _writer(root: str, options: dict[str, str] | None, topic: str, n: int) -> None:
    store = Store.open(root, options)
    with Producer(store, "W") as producer:
        for i in range(n):
            producer.send(Message(topic, f"w{i}".encode()), queue_id=0)


@pytest.mark.slow
def test_four_writer_processes_keep_offsets_dense(any_store: Store) -> None:
    topic = _topic(any_store)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_writer, args=(any_store.root, any_store.storage_options, topic, 5))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    assert _offsets(any_store, topic) == list(range(20))


# ----------------------------------------------------------------------------- what only S3 does wrong
@pytest.mark.s3
def test_a_missing_bucket_is_named_in_one_line(s3_options: dict[str, str]) -> None:
    with pytest.raises(BucketNotFoundError) as caught:
        Store.open("s3://no-such-bucket-lakemq/store", storage_options=s3_options)
    assert "'no-such-bucket-lakemq' does not exist" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert caught.value.context["bucket"] == "no-such-bucket-lakemq"


@pytest.mark.s3
def test_side_files_of_a_missing_bucket_are_an_error_not_absent(s3_options: dict[str, str]) -> None:
    # (a HEAD's 404 carries no body: a get cannot tell a missing bucket from a missing object)
    with pytest.raises(BucketNotFoundError):
        list_objects("s3://no-such-bucket-lakemq/store", "_status", s3_options)


@pytest.mark.s3
def test_wrong_credentials_are_access_denied_in_one_line(s3_root: str, s3_options: dict[str, str]) -> None:
    with pytest.raises(StoreAccessDeniedError) as caught:
        Store.open(s3_root, storage_options={**s3_options, "AWS_SECRET_ACCESS_KEY": "not-the-secret-7f3a"})
    assert "denied" in str(caught.value) and "\n" not in str(caught.value)
    assert "7f3a" not in str(caught.value)  # no secret in the message


@pytest.mark.s3
def test_an_unreachable_endpoint_is_said_in_one_line(s3_root: str, s3_options: dict[str, str]) -> None:
    options = {**s3_options, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_RETRY_TIMEOUT": "2s"}
    with pytest.raises(StoreUnreachableError) as caught:
        Store.open(s3_root, storage_options=options)
    assert "cannot be reached at http://127.0.0.1:9" in str(caught.value)
    assert "\n" not in str(caught.value)
