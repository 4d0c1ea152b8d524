"""Consumer offsets from the wire, committed in batches.

Java consumers report offsets all the time: piggybacked on every pull and one-way every 5 s per
queue. RocketMQ's broker keeps them in memory and persists them every few seconds; here they are
kept until the next flush (every 200 ms from the server) and committed with one Delta commit per
group through the engine's offset store, so a busy consumer does not turn each pull into a commit.
A query sees an offset the moment it is reported.
"""

from __future__ import annotations

import threading

from engine.errors import InvalidArgumentError
from engine.protocol.names import validate_group_name
from engine.store.consumer_offset import OffsetStore
from engine.store.store import Store

Key = tuple[str, str, int]  # group, topic, queue id


class OffsetBatcher:
    """Pending consumer offsets of every group, flushed in one commit per group.

    Thread-safe.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: dict[Key, int] = {}
        self._flushing: dict[Key, int] = {}  # taken by the flush under way, not committed yet
        self._flushed: dict[Key, int] = {}

    def put(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Report an offset; False when it equals the one last committed (nothing to write).

        Raises:
            TopicNotFoundError: no such topic.
            InvalidArgumentError: a bad group, queue id or offset.
        """
        validate_group_name(group)
        known = self._store.topic_configs().get(topic)  # (no wait, no file: kept on the event loop)
        queues = (known or self._store.topic(topic)).queues
        if not 0 <= queue_id < queues:
            raise InvalidArgumentError(
                f"queue_id {queue_id} is out of range; topic {topic!r} has queues 0..{queues - 1}",
                topic=topic,
                queue_id=queue_id,
            )
        if not 0 <= offset < 2**63:
            raise InvalidArgumentError(f"offset {offset} must be >= 0", topic=topic, offset=offset)
        key = (group, topic, queue_id)
        with self._lock:
            # (one in flight may differ: then this report must follow it, as a newer one)
            if key not in self._pending and key not in self._flushing and self._flushed.get(key) == offset:
                return False
            self._pending[key] = offset
            return True

    def pending(self, group: str, topic: str, queue_id: int) -> int | None:
        """The offset reported for a queue and not committed yet, if any: reported since the last
        flush, or taken by the flush under way (until its commit lands, the store does not have it)."""
        key = (group, topic, queue_id)
        with self._lock:
            reported = self._pending.get(key)
            return reported if reported is not None else self._flushing.get(key)

    def flush(self) -> int:
        """Commit every pending offset (one commit per group); returns how many were written.

        Raises:
            StoreError, CommitConflictError: a commit failed; its offsets and those of the groups
                after it stay pending (unless a newer one was reported meanwhile).
        """
        with self._flush_lock:
            with self._lock:
                batch, self._pending = self._pending, {}
                self._flushing = batch
            try:
                return self._commit(batch)
            finally:
                with self._lock:
                    self._flushing = {}

    def _commit(self, batch: dict[Key, int]) -> int:
        by_group: dict[str, list[tuple[str, int, int]]] = {}
        for (group, topic, queue_id), offset in sorted(batch.items()):
            by_group.setdefault(group, []).append((topic, queue_id, offset))
        written = 0
        groups = list(by_group.items())
        for index, (group, entries) in enumerate(groups):
            try:
                OffsetStore(self._store, group).commit(entries)
            except BaseException:
                # this group's offsets and those of the groups not tried yet wait for the next flush
                with self._lock:
                    for later, later_entries in groups[index:]:
                        for topic, queue_id, offset in later_entries:
                            self._pending.setdefault((later, topic, queue_id), offset)
                raise
            with self._lock:
                for topic, queue_id, offset in entries:
                    self._flushed[(group, topic, queue_id)] = offset
            written += len(entries)
        return written
