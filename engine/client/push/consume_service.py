"""The push consumer's consuming side: listener calls on the consume pool (RocketMQ's
``ConsumeMessageConcurrentlyService`` and ``ConsumeMessageOrderlyService``), apart from pulling.

Concurrently: every pulled batch is cut into calls of at most ``consume_message_batch_max_size``
messages, each a pool task, so several calls on one queue run at once and a listener that hangs
holds one pool thread, not its queue. A failed call's messages are NACKed (CLUSTERING: they come
back through the retry topic) or dropped (BROADCASTING, as RocketMQ); either way they leave the
process queue, whose smallest cached offset is what a commit records. A message inside a call for
longer than ``consume_timeout`` is sent back as a retry at once (delay level 3, as RocketMQ's
``cleanExpireMsg``) and leaves the process queue, so the queue's offset moves on; what the hung
call answers later is ignored.

Orderly: one task at a time owns a queue and takes its cached messages in queue order, one call
at a time, only while the queue's lock is held; a failed call is retried in place after a pause
(the task is submitted again later, freeing its thread meanwhile); after each call the task goes
to the back of the pool's line, so queues share the threads fairly. ``consume_timeout`` does not
apply (as in RocketMQ: skipping a message would break the order).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from engine.client.membership import GroupMembership
from engine.client.pull import PullConsumer
from engine.client.push.consume_pool import ConsumePool
from engine.client.push.listener import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeResult,
    ListenerCall,
    listener_view,
)
from engine.client.push.process_queue import ProcessQueue
from engine.errors import MQError
from engine.model import MessageExt
from engine.protocol.actions import NACK
from engine.protocol.delays import nack_plan
from engine.protocol.rebalance import MessageModel
from engine.store.action_log import ActionLogWriter

_log = logging.getLogger(__name__)

# RocketMQ's orderly default: a failing message is retried in place, never dead-lettered.
UNLIMITED_RECONSUME = 2**31 - 1
# The delay level of a message sent back for exceeding consume_timeout (RocketMQ's cleanExpireMsg).
EXPIRED_DELAY_LEVEL = 3


def log_failure(consumer_id: str, what: str, exc: Exception) -> None:
    """Log a failure of a push consumer's background work, which goes on: an expected failure
    (:class:`MQError`) in one line, anything else (a bug) with its traceback."""
    _log.warning(
        "push consumer %s: %s: %s", consumer_id, what, exc, exc_info=None if isinstance(exc, MQError) else exc
    )


@dataclass(frozen=True)
class ConsumeSetup:
    """What the pull threads and the consume service of one push consumer share, fixed at start."""

    consumer_id: str
    model: MessageModel
    orderly: bool
    uses_locks: bool  # orderly clustering: a queue is consumed only while its lock is held
    listener: ListenerCall
    max_reconsume_times: int  # the consumer's (UNLIMITED_RECONSUME: an orderly default)
    job_max_reconsume_times: int  # the retry job's (EngineConfig.max_reconsume_times)
    pull_batch_size: int
    consume_batch_size: int
    pull_suspend_ms: int
    relock_wait_s: float  # how long a queue waits for the rebalance thread to relock it
    suspend_s: float
    pull_threshold_for_queue: int
    pull_threshold_bytes_for_queue: int
    consume_concurrently_max_span: int
    consume_timeout_s: float
    consume_thread_min: int
    consume_thread_max: int
    puller: PullConsumer
    membership: GroupMembership
    actions: ActionLogWriter
    stop: threading.Event  # set when the consumer shuts down


class ConsumeService:
    """Runs listener calls for every queue of one push consumer on one :class:`ConsumePool`.

    Args:
        setup: the consumer's shared setup.
        name: the pool threads' name prefix.
    """

    def __init__(self, setup: ConsumeSetup, name: str) -> None:
        self._setup = setup
        self.pool = ConsumePool(name, setup.consume_thread_min, setup.consume_thread_max)

    def submit(self, pq: ProcessQueue, messages: list[MessageExt]) -> None:
        """Consume messages just cached in ``pq`` (called by its pull thread)."""
        setup = self._setup
        if setup.orderly:
            if pq.claim_orderly():
                self.pool.submit(functools.partial(self._consume_orderly, pq))
            return
        size = setup.consume_batch_size
        for start in range(0, len(messages), size):
            self.pool.submit(
                functools.partial(self._consume_concurrently, pq, messages[start : start + size])
            )

    def expire(self, pqs: Iterable[ProcessQueue]) -> int:
        """Send back every message inside a concurrent listener call for longer than
        ``consume_timeout`` (RocketMQ's ``cleanExpireMsg``; orderly consumers are left alone);
        returns how many."""
        setup = self._setup
        if setup.orderly:
            return 0
        count = 0
        for pq in pqs:
            expired = pq.expire(setup.consume_timeout_s, functools.partial(self._send_back_expired, pq))
            count += len(expired)
        return count

    def shutdown(self) -> None:
        """Start no more calls (those running go on in their threads; see :class:`ConsumePool`)."""
        self.pool.shutdown()

    # ----------------------------------------------------------------- concurrently
    def _consume_concurrently(self, pq: ProcessQueue, chunk: list[MessageExt]) -> None:
        setup = self._setup
        if setup.stop.is_set():
            return
        live = pq.begin(chunk)
        if not live:
            return  # dropped, or sent back before its turn came
        context = ConsumeConcurrentlyContext(pq.mq)
        result = ConsumeResult.RECONSUME_LATER
        try:
            result = setup.listener([listener_view(m) for m in live], context)
        finally:
            failed = result is not ConsumeResult.SUCCESS
            pq.end(live, functools.partial(self._settle_concurrently, failed, context))

    def _settle_concurrently(
        self, failed: bool, context: ConsumeConcurrentlyContext, messages: list[MessageExt]
    ) -> list[MessageExt]:
        """Under the queue's lock: the failed messages are NACKed (dropped when broadcasting);
        every message leaves the queue."""
        if failed:
            if self._setup.model is MessageModel.BROADCASTING:
                # RocketMQ drops failed broadcast messages: there is no per-instance retry topic.
                _log.warning(
                    "push consumer %s: broadcast consume failed; dropping %d message(s)",
                    self._setup.consumer_id,
                    len(messages),
                )
            else:
                self._nack(messages, context.delay_level_when_next_consume)
        return messages

    def _send_back_expired(self, pq: ProcessQueue, messages: list[MessageExt]) -> list[MessageExt]:
        """Under the queue's lock: messages past ``consume_timeout`` go back as retries (dropped
        when broadcasting, as a failed broadcast message is)."""
        setup = self._setup
        offsets = [m.queue_offset for m in messages]
        if setup.model is MessageModel.BROADCASTING:
            _log.warning(
                "push consumer %s: listener exceeded consume_timeout on %s offsets %s; dropping them "
                "(broadcasting has no retry topic)",
                setup.consumer_id,
                pq.mq,
                offsets,
            )
        else:
            _log.warning(
                "push consumer %s: listener exceeded consume_timeout on %s offsets %s; sent back as retries",
                setup.consumer_id,
                pq.mq,
                offsets,
            )
            self._nack(messages, EXPIRED_DELAY_LEVEL)
        return messages

    def _nack(self, messages: list[MessageExt], delay_level: object) -> None:
        """NACK failed concurrent messages as ``delayLevelWhenNextConsume`` says: -1 dead-letters at
        once, 0 lets the retry job choose the delay, 1..18 (higher: 18) retries after that level."""
        setup = self._setup
        if isinstance(delay_level, bool) or not isinstance(delay_level, int) or delay_level < -1:
            _log.warning(
                "push consumer %s: delay_level_when_next_consume %r is not -1, 0 or 1..18; using 0",
                setup.consumer_id,
                delay_level,
            )
            delay_level = 0
        now = int(time.time() * 1000)
        for m in messages:
            times, retry_at_ms = nack_plan(
                m.reconsume_times, setup.max_reconsume_times, delay_level, setup.job_max_reconsume_times, now
            )
            setup.actions.record(NACK, m, reconsume_times=times, deadline_ms=retry_at_ms)

    # ----------------------------------------------------------------- orderly
    def _consume_orderly(self, pq: ProcessQueue) -> None:
        """One call of the queue's orderly task; it submits itself again while there is more."""
        setup = self._setup
        if setup.stop.is_set() or pq.dropped:
            pq.release_orderly()
            return
        if setup.uses_locks and not setup.membership.is_locked(pq.mq):
            # The rebalance thread relocks it; look again then (the thread is free meanwhile).
            self.pool.submit(functools.partial(self._consume_orderly, pq), setup.relock_wait_s)
            return
        chunk = pq.head(setup.consume_batch_size)
        if not chunk:
            return  # nothing cached: the queue's next pull hands it out again
        times = {m.queue_offset: pq.attempts.get(m.queue_offset, m.reconsume_times) for m in chunk}
        live = pq.begin(chunk)
        if not live:
            pq.release_orderly()
            return
        context = ConsumeOrderlyContext(pq.mq)
        result = ConsumeResult.RECONSUME_LATER
        try:
            result = setup.listener([listener_view(m, times[m.queue_offset]) for m in live], context)
        finally:
            removed = pq.end(live, functools.partial(self._settle_orderly, pq, result, times))
        if pq.dropped or setup.stop.is_set():
            pq.release_orderly()
            return
        delay = 0.0
        if len(removed) < len(live):
            pause = context.suspend_current_queue_time_ms
            ok = not isinstance(pause, bool) and isinstance(pause, int) and 0 < pause <= 60_000
            delay = pause / 1000 if ok else setup.suspend_s
        self.pool.submit(functools.partial(self._consume_orderly, pq), delay)

    def _settle_orderly(
        self, pq: ProcessQueue, result: ConsumeResult, times: dict[int, int], messages: list[MessageExt]
    ) -> list[MessageExt]:
        """Under the queue's lock: what leaves the queue after an orderly call. All on SUCCESS;
        otherwise RocketMQ's checkReconsumeTimes: a message past the max is dead-lettered and
        counts as consumed, the others stay, in order, to be retried after a pause."""
        setup = self._setup
        if result is ConsumeResult.SUCCESS:
            done = messages
        else:
            done = []
            for m in messages:
                attempts = times[m.queue_offset]
                if attempts >= setup.max_reconsume_times:
                    # The retry job dead-letters a NACK whose reconsume_times reach its max (config);
                    # a lower per-consumer max is carried by raising the count to the job's threshold.
                    dead = max(attempts, setup.max_reconsume_times, setup.job_max_reconsume_times)
                    setup.actions.record(NACK, m, reconsume_times=dead, deadline_ms=None)
                    done.append(m)
                else:
                    pq.attempts[m.queue_offset] = attempts + 1
        for m in done:
            pq.attempts.pop(m.queue_offset, None)
        # A dead-lettered message leaves even after a retained one: the queue's offset (its smallest
        # cached message) still stops at the first retained, so order is never passed.
        return done
