"""Small helpers shared by tests."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine import Store
from engine.store import schemas


def versions(store: Store) -> dict[str, int]:
    """Current Delta version of every table of a store."""
    return {name: store.version(name) for name in schemas.SCHEMAS}


def age_and_clean_log(store: Store, name: str) -> None:
    """Another process's maintenance: checkpoint table ``name`` and clean up its commit files, all
    of them older than the log retention (their mtimes are set 8 days back)."""
    log = Path(store.uri(name)) / "_delta_log"
    old = time.time() - 8 * 24 * 3600
    for f in log.glob("*.json"):
        os.utime(f, (old, old))
    store.snapshot(name).checkpoint(cleanup=True)
    assert not (log / f"{1:020d}.json").exists()  # the commits a stale handle needs are gone


def commit_log_rows(store: Store) -> list[dict[str, object]]:
    return sorted(store.read(schemas.COMMIT_LOG).to_pylist(), key=lambda r: int(r["physical_offset"]))  # type: ignore[arg-type]


def eventually(condition: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    """Poll ``condition`` until it returns something truthy (generous deadline, no timing asserted)."""
    end = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() > end:
            return value
        time.sleep(0.05)


def lock_waiters() -> int:
    """Threads of this process still waiting in ``flock`` for a host lock their writer gave up on
    (:class:`engine.store.delta.hostlock.HostLock`'s waiters)."""
    return sum(t.name == "mq-lock-wait" and t.is_alive() for t in threading.enumerate())


def run_in_threads(work: Callable[[int], None], count: int = 2) -> list[BaseException]:
    """Run ``work(0)`` ... ``work(count - 1)`` at once, one thread each; returns what they raised."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # pragma: no cover - returned to the test, which asserts on it
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def dead_letter_received(store: Store, topic: str, group: str, max_nums: int = 8) -> None:
    """Receive up to ``max_nums`` messages of ``topic`` for ``group`` with a per-message consumer,
    nack each, route the nacks straight to ``%DLQ%<group>`` and dispatch: dead letters to look at."""
    from engine import SimpleConsumer
    from engine.broker.dispatch import dispatch_pending
    from engine.broker.retry import route_retries

    with SimpleConsumer(store, group) as consumer:
        consumer.subscribe(topic)
        for message in consumer.receive(max_nums=max_nums, invisible_ms=60_000):
            consumer.nack(message)
    route_retries(store, max_reconsume_times=0)
    dispatch_pending(store)


def append_to_queues(
    store: Store, topic: str, per_queue: dict[int, list[bytes]], *, tags: str | None = None
) -> list[Any]:
    """Append ``per_queue[q]``'s bodies to queue ``q`` of ``topic``, each queue through the writer of
    the commit-log shard that holds it (one commit per queue); returns the ``Stamped`` results."""
    from engine.protocol.shards import shard_of_queue
    from engine.store.commit_log import CommitLogWriter
    from engine.store.commit_log.stamping import PendingMessage

    stamped: list[Any] = []
    for queue_id, bodies in per_queue.items():
        shard = shard_of_queue(topic, queue_id, store.commit_log_shards)
        pending = [
            PendingMessage(topic, queue_id, body, f"{topic}-{queue_id}-{i}-{len(stamped)}".upper(), tags=tags)
            for i, body in enumerate(bodies)
        ]
        stamped += CommitLogWriter(store, shard=shard).append(pending)
    return stamped


def start_seaweed(workdir: Path) -> Any:
    """A started :class:`bench.seaweedfs.SeaweedS3` in ``workdir``; the calling test skips where
    it is unavailable, or fails under CI (where ``.ci/run`` built it)."""
    from bench.seaweedfs import SeaweedS3, SeaweedUnavailable, cached_binary

    server = SeaweedS3(workdir, binary=cached_binary())
    try:
        server.start()
    except SeaweedUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the S3 server is unavailable: {exc}")
        pytest.skip(f"the S3 server is unavailable: {exc}")
    return server
