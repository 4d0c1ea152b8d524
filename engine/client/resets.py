"""Live offset resets for running consumers (RocketMQ's broker pushes ``resetOffset`` to clients).

:class:`ResetWatcher` tells a consumer which of its group's queues were reset since it last asked.
A consumer that gets a reset for a queue it holds drops what it holds of that queue (in-flight
messages, its un-committed progress), commits the reset offset again itself (so a commit of its
own that raced the reset cannot leave the old offset standing) and resumes from the new offset.
Resets made before the watcher was created are already in ``consumer_offset``, which a consumer
reads when it starts a queue, so the watcher reports only newer ones.
"""

from __future__ import annotations

import threading

from engine.protocol import validate_group_name
from engine.store.offset_resets import OffsetReset, latest_resets, resets_version
from engine.store.store import Store

QueueKey = tuple[str, int]


class ResetWatcher:
    """Reports the offset resets of one group made after it was created.

    Args:
        store: the store.
        group: the consumer group.

    Thread-safe. :meth:`poll` costs a look at the table's latest version when nothing changed.

    Raises:
        InvalidArgumentError: a bad group name.
    """

    def __init__(self, store: Store, group: str) -> None:
        self._store = store
        self.group = validate_group_name(group)
        self._lock = threading.Lock()
        self._version = resets_version(store)
        self._seen: dict[QueueKey, int] = {k: r.ts_ms for k, r in latest_resets(store, group).items()}

    def poll(self) -> dict[QueueKey, OffsetReset]:
        """Resets made since the last call (or since creation), newest per (topic, queue id).

        Raises:
            StoreError: the table cannot be read (nothing is marked as seen; ask again later).
        """
        with self._lock:
            version = resets_version(self._store)
            if version == self._version:
                return {}
            latest = latest_resets(self._store, self.group)
            fresh = {k: r for k, r in latest.items() if r.ts_ms > self._seen.get(k, -1)}
            for key, reset in fresh.items():
                self._seen[key] = reset.ts_ms
            self._version = version
            return fresh
