"""Files a process writes, kept for its own readers and fed to another process of the host
(engine.store.delta.file_feed): what a reader gets from them is what it would read from disk, a
feed never makes the writer wait, and a file changed since it was fed is read anew."""

from __future__ import annotations

import os
import socket
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import Admin, Message, Producer, Store
from engine.broker.loop import BrokerLoop, BrokerProcess
from engine.store import schemas
from engine.store.consume_queue import dispatched_version
from engine.store.delta import file_feed, read_version, read_versions
from engine.store.delta import log as delta_log
from engine.store.delta.file_feed import MAX_FEED_BYTES, FileIntake, feed_pair, stop_feeding, wrote_local_file
from engine.store.delta.log import LOCAL_FILE_MISS_HOOKS, LOCAL_FILES, local_file_key, read_whole


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store.open(str(tmp_path / "s"))
    Admin(store).create_topic("T", 2)
    return store


@pytest.fixture(autouse=True)
def _reader(monkeypatch):
    """This process reads local files (as a server or the broker process does)."""
    monkeypatch.setattr(delta_log, "_local_files_read", True)


@pytest.fixture(autouse=True)
def _empty_cache():
    def clear() -> None:
        with LOCAL_FILES._lock:
            LOCAL_FILES._tables.clear()
            LOCAL_FILES._bytes = 0

    clear()
    yield
    clear()


def _send(store: Store, n: int, keys: tuple[str, ...] = ("k",)) -> None:
    with Producer(store, "P") as producer:
        for i in range(n):
            producer.send(Message("T", f"body {i}".encode(), tags="a", keys=keys, properties={"p": str(i)}))


def _commit_log_file(store: Store, version: int) -> str:
    files = read_version(store.uri(schemas.COMMIT_LOG), version).files
    assert len(files) == 1
    return os.path.join(store.uri(schemas.COMMIT_LOG), files[0])


def _cached(path: str) -> pa.Table | None:
    return LOCAL_FILES.get(local_file_key(path, os.stat(path)))


def test_a_written_commit_log_file_is_kept_as_a_reader_would_read_it(store: Store) -> None:
    _send(store, 3)
    latest = store.version(schemas.COMMIT_LOG)
    path = _commit_log_file(store, latest)
    kept = _cached(path)
    assert kept is not None, "the writer keeps what it wrote"
    from_disk = read_whole(path, os.path.getsize(path))
    assert kept.schema.equals(from_disk.schema, check_metadata=False)
    assert kept.equals(from_disk)
    # The readers of versions take the kept rows, and get what they got from disk.
    uri = store.uri(schemas.COMMIT_LOG)
    with_kept = read_versions(uri, 1, latest, schemas.COMMIT_LOG_SCHEMA)
    LOCAL_FILES._tables.clear()
    assert read_versions(uri, 1, latest, schemas.COMMIT_LOG_SCHEMA).equals(with_kept)
    assert with_kept.num_rows == 3


def test_a_process_that_only_writes_keeps_nothing_but_still_feeds(store: Store, monkeypatch) -> None:
    monkeypatch.setattr(delta_log, "_local_files_read", False)
    feed, theirs = feed_pair()
    intake = FileIntake(theirs)
    try:
        _send(store, 1)
        path = _commit_log_file(store, store.version(schemas.COMMIT_LOG))
        assert _cached(path) is None  # a producer has no use for what it wrote
        assert feed.sent == 1
        assert intake.drain() == 1
        assert _cached(path) is not None
    finally:
        feed.close()
        intake.close()
    read_versions(store.uri(schemas.COMMIT_LOG), 1, 1, schemas.COMMIT_LOG_SCHEMA)
    assert delta_log.local_files_read()  # a read makes it a reader


def test_a_fed_file_reaches_the_other_end_whole(store: Store) -> None:
    feed, theirs = feed_pair()
    intake = FileIntake(theirs)
    try:
        _send(store, 2, keys=("a", "b"))
        assert feed.sent == 2 and feed.dropped == 0
        path = _commit_log_file(store, store.version(schemas.COMMIT_LOG))
        written = _cached(path)
        LOCAL_FILES._tables.clear()  # as in the process at the other end, which has read nothing
        assert intake.drain() == 2
        assert intake.drain() == 0
        received = _cached(path)
        assert received is not None and written is not None
        assert received.equals(written)
        assert received.schema.equals(written.schema)
    finally:
        feed.close()
        intake.close()


def test_every_open_feed_gets_each_file(store: Store) -> None:
    pairs = [feed_pair() for _ in range(2)]
    intakes = [FileIntake(theirs) for _, theirs in pairs]
    try:
        _send(store, 1)
        assert [feed.sent for feed, _ in pairs] == [1, 1]
        path = _commit_log_file(store, store.version(schemas.COMMIT_LOG))
        written = _cached(path)
        for intake in intakes:
            LOCAL_FILES._tables.clear()
            assert intake.drain() == 1
            assert _cached(path).equals(written)
    finally:
        for (feed, _), intake in zip(pairs, intakes, strict=True):
            feed.close()
            intake.close()


def test_a_file_changed_after_it_was_fed_is_read_from_disk(store: Store, tmp_path) -> None:
    path = str(tmp_path / "f.parquet")
    old = pa.table({"x": [1, 2]})
    pq.write_table(old, path)
    wrote_local_file(path, old)
    assert _cached(path).equals(old)
    new = pa.table({"x": [3, 4, 5]})
    os.unlink(path)
    pq.write_table(new, path)  # a table removed and made again under the same path
    assert _cached(path) is None


def test_a_feed_never_makes_the_writer_wait(store: Store) -> None:
    feed, theirs = feed_pair()
    try:
        rows = pa.table({"body": [b"x" * 60_000]})
        key = ("/nowhere/f.parquet", 1, 2, 3)
        began = time.monotonic()
        for _ in range(2_000):  # far more than the socket holds, with nobody reading
            feed.send(key, rows)
        assert time.monotonic() - began < 60  # (a blocked send would never return)
        assert feed.dropped > 0 and feed.sent > 0
        assert feed.sent + feed.dropped == 2_000
        big = pa.table({"body": [b"x" * (MAX_FEED_BYTES + 1)]})
        dropped = feed.dropped
        feed.send(key, big)
        assert feed.dropped == dropped + 1
        # the reader takes what was sent, the dropped ones are read from disk
        intake = FileIntake(theirs)
        assert intake.drain() == feed.sent
        assert LOCAL_FILES.get(key).equals(rows)
    finally:
        feed.close()
        theirs.close()


def test_a_malformed_datagram_is_dropped_and_the_intake_goes_on(store: Store) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    intake = FileIntake(theirs)
    try:
        ours.send(b"\x01")
        ours.send(b"\x05\x00" + b"\x00" * 24 + b"abcde" + b"not arrow")
        assert intake.drain() == 0
        assert intake.malformed == 2
    finally:
        ours.close()
        intake.close()


def test_a_closed_feed_sends_nothing_more(store: Store) -> None:
    feed, theirs = feed_pair()
    intake = FileIntake(theirs)
    try:
        feed.close()
        _send(store, 1)
        assert intake.drain() == 0 and feed.sent == 0
        stop_feeding(feed)  # twice is harmless
    finally:
        intake.close()
    assert feed not in file_feed._feeds


def test_a_reader_that_misses_a_file_takes_what_was_fed(store: Store) -> None:
    feed, theirs = feed_pair()
    intake = FileIntake(theirs)
    loop = BrokerLoop(store)
    try:
        _send(store, 3)
        LOCAL_FILES._tables.clear()  # as in the broker process, which has read nothing yet
        loop.run_once()
        assert intake.received == 3  # dispatch missed the first file and took all three
        path = _commit_log_file(store, store.version(schemas.COMMIT_LOG))
        assert _cached(path) is not None
        assert dispatched_version(store) == store.version(schemas.COMMIT_LOG)  # and dispatched them
    finally:
        feed.close()
        intake.close()
    assert intake.drain not in LOCAL_FILE_MISS_HOOKS


def test_the_broker_process_feeds_its_child_until_it_stops(store: Store) -> None:
    process = BrokerProcess(store)
    assert process._local
    process._launch()
    try:
        assert process._feed is not None and process._feed in file_feed._feeds
        feed = process._feed
    finally:
        process.stop(timeout=30)
    assert feed not in file_feed._feeds
