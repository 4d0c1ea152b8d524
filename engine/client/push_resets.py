"""The push consumer's live offset resets (RocketMQ's client side of ``resetOffset``).

A :class:`~engine.client.resets.ResetWatcher` tells the consumer which queues of its group an admin
reset; the rebalance thread applies them (:meth:`LiveResets._apply_resets`) and every offset commit
first collects them, so the old progress of a reset queue is never committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from engine.client.queue_workers import ProcessQueue
from engine.client.resets import ResetWatcher
from engine.protocol.rebalance import MessageQueue
from engine.protocol.selectors import MessageSelector
from engine.store.consumer_offset import OffsetStore

_log = logging.getLogger(__name__)


class LiveResets:
    """The reset-handling half of :class:`~engine.client.push.PushConsumer` (a mixin); the
    consumer sets the attributes and provides the queue methods below."""

    instance_id: str
    _resets: ResetWatcher | None
    _pending_resets: dict[tuple[str, int], int]
    _resets_lock: threading.Lock
    _state_lock: threading.RLock
    _persist_lock: threading.Lock
    _pqs: dict[MessageQueue, ProcessQueue]
    _offsets: OffsetStore
    _stop: threading.Event

    def _drop(self, pqs: Sequence[ProcessQueue], *, commit: bool = True) -> None:  # pragma: no cover
        raise NotImplementedError

    def _start_queues(
        self,
        added: Sequence[MessageQueue],
        target: dict[MessageQueue, MessageSelector],
        known: dict[tuple[str, int], int] | None = None,
    ) -> None:  # pragma: no cover - the consumer defines it
        raise NotImplementedError

    def _collect_resets(self) -> dict[tuple[str, int], int]:
        """Resets seen so far and not applied yet: (topic, queue id) -> the offset to resume from."""
        if self._resets is None:
            return {}
        with self._resets_lock:
            for key, reset in self._resets.poll().items():
                self._pending_resets[key] = reset.offset
            return dict(self._pending_resets)

    def _apply_resets(self) -> None:
        """Resume every held queue that was reset from its new offset (the rebalance thread only, so
        no rebalance round starts or drops a queue meanwhile).

        The queue's worker is stopped and its progress forgotten (nothing of it is committed), the
        reset offset is committed again by this instance (a commit of ours that raced the reset
        cannot leave the old offset standing), and a new worker starts from it. An orderly
        consumer keeps the queue's lock throughout.
        """
        pending = self._collect_resets()
        if not pending:
            return
        with self._state_lock:
            held = {mq: pq for mq, pq in self._pqs.items() if (mq.topic, mq.queue_id) in pending}
        with self._persist_lock:  # no periodic commit of the old progress in between
            if held:
                self._drop(list(held.values()), commit=False)
                self._offsets.commit(
                    [(mq.topic, mq.queue_id, pending[(mq.topic, mq.queue_id)]) for mq in held]
                )
            with self._resets_lock:
                for key, offset in pending.items():
                    if self._pending_resets.get(key) == offset:
                        del self._pending_resets[key]  # applied, or not ours: committed offsets hold it
        if held and not self._stop.is_set():
            _log.info("push consumer %s: offsets reset for %s", self.instance_id, sorted(held))
            offsets = {(mq.topic, mq.queue_id): pending[(mq.topic, mq.queue_id)] for mq in held}
            selectors = {mq: MessageSelector.of(pq.expression) for mq, pq in held.items()}
            self._start_queues(sorted(held), selectors, offsets)
