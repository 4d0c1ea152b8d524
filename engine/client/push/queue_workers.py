"""The push consumer's queue workers: one thread per assigned queue long-polls it, hands the messages
to the listener and moves the queue's offsets (RocketMQ's ``ProcessQueue`` and its
``ConsumeMessageConcurrentlyService`` / ``ConsumeMessageOrderlyService``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from engine.client.membership import GroupMembership
from engine.client.pull import PullConsumer
from engine.client.push.listener import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeResult,
    ListenerCall,
    listener_view,
)
from engine.errors import MQError
from engine.model import MessageExt, PullStatus
from engine.protocol.actions import NACK
from engine.protocol.delays import nack_plan
from engine.protocol.rebalance import MessageModel, MessageQueue
from engine.protocol.selectors import MessageSelector
from engine.store.action_log import ActionLogWriter

_log = logging.getLogger(__name__)

# RocketMQ's orderly default: a failing message is retried in place, never dead-lettered.
UNLIMITED_RECONSUME = 2**31 - 1


def log_failure(consumer_id: str, what: str, exc: Exception) -> None:
    """Log a failure of a push consumer's background work, which goes on: an expected failure
    (:class:`MQError`) in one line, anything else (a bug) with its traceback."""
    _log.warning(
        "push consumer %s: %s: %s", consumer_id, what, exc, exc_info=None if isinstance(exc, MQError) else exc
    )


@dataclass(frozen=True)
class ConsumeSetup:
    """What every queue worker of one push consumer shares, fixed when the consumer starts."""

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
    puller: PullConsumer
    membership: GroupMembership
    actions: ActionLogWriter
    stop: threading.Event  # set when the consumer shuts down


class ProcessQueue:
    """An assigned queue: its offsets and the worker thread consuming it (RocketMQ's ``ProcessQueue``).

    The worker thread alone moves :attr:`consumed` and the next offset to pull; the consumer starts
    and drops the queue, changes its selector and records what it committed, through the methods
    below.

    Args:
        mq: the queue.
        expression: its selector (or a tag expression).
        offset: where consuming starts.
        committed: the group's committed offset of the queue (None: none yet).
    """

    def __init__(
        self, mq: MessageQueue, expression: MessageSelector | str, offset: int, committed: int | None
    ) -> None:
        self.mq = mq
        self._expression = expression
        self._offset = offset  # next offset to pull
        self._consumed = offset  # every message before this is consumed (or NACKed)
        self._committed = committed
        self._dropped = threading.Event()
        self._thread: threading.Thread | None = None
        self._attempts: dict[int, int] = {}  # orderly: queue offset -> reconsume times so far
        self._no_match: tuple[int, int] | None = None  # last NO_MATCHED_MSG (offset, next)

    # ----------------------------------------------------------------- the consumer's side
    @property
    def expression(self) -> MessageSelector | str:
        """The selector the next pull uses."""
        return self._expression

    @property
    def consumed(self) -> int:
        """Every message before this offset is consumed (or NACKed): what a commit may record."""
        return self._consumed

    @property
    def committed(self) -> int | None:
        """The offset last committed for this queue (None: none yet)."""
        return self._committed

    def reselect(self, expression: MessageSelector | str) -> None:
        """Use a new selector from the next pull on."""
        self._expression = expression

    def mark_committed(self, offset: int) -> None:
        """Record that ``offset`` was committed for this queue."""
        self._committed = offset

    def start(self, setup: ConsumeSetup, name: str) -> None:
        """Start the worker thread (once)."""
        self._thread = threading.Thread(target=self._run, args=(setup,), name=name, daemon=True)
        self._thread.start()

    def drop(self) -> None:
        """Ask the worker to stop after its in-flight batch (the queue is going away)."""
        self._dropped.set()

    def wait_stopped(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the worker to end; True when it has (or never ran).
        Called from the worker itself, it does not wait and returns False."""
        thread = self._thread
        if thread is None:
            return True
        if thread is not threading.current_thread():
            thread.join(timeout=timeout)
        return not thread.is_alive()

    # ----------------------------------------------------------------- the worker thread
    def _active(self, setup: ConsumeSetup) -> bool:
        return not self._dropped.is_set() and not setup.stop.is_set()

    def _run(self, setup: ConsumeSetup) -> None:
        mq = self.mq
        while self._active(setup):
            if setup.uses_locks and not setup.membership.is_locked(mq):
                self._dropped.wait(setup.relock_wait_s)  # the rebalance thread relocks it
                continue
            try:
                result = setup.puller.pull(
                    mq.topic,
                    mq.queue_id,
                    self._offset,
                    max_nums=setup.pull_batch_size,
                    expression=self._expression,
                    suspend_ms=setup.pull_suspend_ms,
                )
            except Exception as exc:  # logged; background work goes on
                log_failure(setup.consumer_id, f"pull of {mq} failed", exc)
                self._dropped.wait(setup.suspend_s)
                continue
            # Offsets move only past entries the pull has shown to us. A pull's queue bounds can
            # run one dispatch commit ahead of the entries it read (QueueIndex takes them from
            # table history, which on a stale snapshot already holds newer commits), so "the
            # rest of the window was filtered out" is trusted only when a second pull agrees.
            if result.status is PullStatus.FOUND:
                if setup.orderly:
                    done = self._consume_orderly(setup, result.messages)
                else:
                    done = self._consume_concurrently(setup, result.messages)
                if done:
                    self._consumed = self._offset = result.messages[-1].queue_offset + 1
                else:
                    self._offset = self._consumed  # interrupted: pull the unconsumed rest again
                self._no_match = None
            elif result.status is PullStatus.OFFSET_ILLEGAL:
                _log.warning(
                    "push consumer %s: offset %d of %s is illegal; corrected to %d",
                    setup.consumer_id,
                    self._offset,
                    mq,
                    result.next_begin_offset,
                )
                self._consumed = self._offset = result.next_begin_offset
            elif result.status is PullStatus.NO_MATCHED_MSG:
                seen = (self._offset, result.next_begin_offset)
                if self._no_match == seen and not MessageSelector.of(self._expression).matches_all:
                    self._consumed = self._offset = result.next_begin_offset
                    self._no_match = None
                else:
                    self._no_match = seen  # "*" matches every entry: this can only be a stale view
            # NO_NEW_MSG: next_begin_offset is the offset pulled; nothing to move.

    def _nack_failed(self, setup: ConsumeSetup, chunk: list[MessageExt], delay_level: object) -> None:
        """NACK a failed concurrent batch as ``delayLevelWhenNextConsume`` says: -1 dead-letters at
        once, 0 lets the retry job choose the delay, 1..18 (higher: 18) retries after that level."""
        if isinstance(delay_level, bool) or not isinstance(delay_level, int) or delay_level < -1:
            _log.warning(
                "push consumer %s: delay_level_when_next_consume %r is not -1, 0 or 1..18; using 0",
                setup.consumer_id,
                delay_level,
            )
            delay_level = 0
        now = int(time.time() * 1000)
        for m in chunk:
            times, retry_at_ms = nack_plan(
                m.reconsume_times, setup.max_reconsume_times, delay_level, setup.job_max_reconsume_times, now
            )
            setup.actions.record(NACK, m, reconsume_times=times, deadline_ms=retry_at_ms)

    def _consume_concurrently(self, setup: ConsumeSetup, messages: list[MessageExt]) -> bool:
        size = setup.consume_batch_size
        for start in range(0, len(messages), size):
            if not self._active(setup):
                return False
            chunk = messages[start : start + size]
            context = ConsumeConcurrentlyContext(self.mq)
            if setup.listener([listener_view(m) for m in chunk], context) is not ConsumeResult.SUCCESS:
                if setup.model is MessageModel.BROADCASTING:
                    # RocketMQ drops failed broadcast messages: there is no per-instance retry topic.
                    _log.warning(
                        "push consumer %s: broadcast consume failed; dropping %d message(s)",
                        setup.consumer_id,
                        len(chunk),
                    )
                else:
                    self._nack_failed(setup, chunk, context.delay_level_when_next_consume)
            self._consumed = chunk[-1].queue_offset + 1
        return True

    def _consume_orderly(self, setup: ConsumeSetup, messages: list[MessageExt]) -> bool:
        pending = list(messages)
        size = setup.consume_batch_size
        while pending:
            if not self._active(setup) or (setup.uses_locks and not setup.membership.is_locked(self.mq)):
                return False
            chunk = pending[:size]
            times = {m.queue_offset: self._attempts.get(m.queue_offset, m.reconsume_times) for m in chunk}
            context = ConsumeOrderlyContext(self.mq)
            result = setup.listener([listener_view(m, times[m.queue_offset]) for m in chunk], context)
            if result is ConsumeResult.SUCCESS:
                done = chunk
            else:
                # RocketMQ's checkReconsumeTimes: past the max, a message is dead-lettered and counts
                # as consumed; the others are retried, in order, after a pause.
                done = []
                for m in chunk:
                    attempts = times[m.queue_offset]
                    if attempts >= setup.max_reconsume_times:
                        # The retry job dead-letters a NACK whose reconsume_times reach its max
                        # (config); a lower per-consumer max is carried by raising the count to the
                        # job's threshold.
                        dead = max(attempts, setup.max_reconsume_times, setup.job_max_reconsume_times)
                        setup.actions.record(NACK, m, reconsume_times=dead, deadline_ms=None)
                        done.append(m)
                    else:
                        self._attempts[m.queue_offset] = attempts + 1
            done_offsets = {m.queue_offset for m in done}
            for offset in done_offsets:
                self._attempts.pop(offset, None)
            pending = [m for m in pending if m.queue_offset not in done_offsets]
            # Consumed up to the first message still pending (orderly never passes a failure).
            if done:
                first_pending = pending[0].queue_offset if pending else None
                last_done = max(done_offsets)
                if first_pending is None or first_pending > last_done:
                    self._consumed = last_done + 1
            if len(done) < len(chunk):
                pause = context.suspend_current_queue_time_ms
                ok = not isinstance(pause, bool) and isinstance(pause, int) and 0 < pause <= 60_000
                self._dropped.wait(pause / 1000 if ok else setup.suspend_s)
        return True
