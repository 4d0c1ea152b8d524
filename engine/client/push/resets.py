"""The push consumer's live offset resets (RocketMQ's client side of ``resetOffset``).

A :class:`~engine.client.resets.ResetWatcher` tells the consumer which queues of its group an admin
reset; :class:`LiveResets` keeps those not applied yet. The consumer's rebalance thread applies them
(it owns the queues) and every offset commit first looks at them, so the old progress of a reset
queue is never committed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from engine.client.resets import ResetWatcher


class LiveResets:
    """The resets seen and not applied yet, per queue; thread-safe.

    Args:
        watcher: the group's reset watcher, made before any queue starts (a reset made later is
            seen here, one made before is in the committed offsets the queues start from).
    """

    def __init__(self, watcher: ResetWatcher) -> None:
        self._watcher = watcher
        self._pending: dict[tuple[str, int], int] = {}  # (topic, queue id) -> reset offset
        self._lock = threading.Lock()

    def pending(self) -> dict[tuple[str, int], int]:
        """The resets seen so far and not applied yet: (topic, queue id) -> the offset to resume from."""
        with self._lock:
            for key, reset in self._watcher.poll().items():
                self._pending[key] = reset.offset
            return dict(self._pending)

    def applied(self, resets: Mapping[tuple[str, int], int]) -> None:
        """Forget resets that were applied (or concern queues this consumer does not hold, whose
        committed offsets hold them); one reset again meanwhile, to another offset, is kept."""
        with self._lock:
            for key, offset in resets.items():
                if self._pending.get(key) == offset:
                    del self._pending[key]
