"""The push consumer's queue workers: one thread per assigned queue long-polls it, hands the messages
to the listener and moves the queue's offsets (RocketMQ's ``ProcessQueue`` and its
``ConsumeMessageConcurrentlyService`` / ``ConsumeMessageOrderlyService``).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
import threading
import time
from collections.abc import Callable

from engine.client.membership import GroupMembership
from engine.client.pull import PullConsumer
from engine.errors import MQError
from engine.model import MessageExt, PullStatus
from engine.protocol.actions import NACK
from engine.protocol.delays import nack_plan
from engine.protocol.names import PROPERTY_RETRY_TOPIC, RETRY_PREFIX
from engine.protocol.rebalance import MessageModel, MessageQueue
from engine.protocol.selectors import MessageSelector
from engine.store.action_log import ActionLogWriter
from engine.store.store import Store

_log = logging.getLogger(__name__)


class ConsumeResult(enum.StrEnum):
    """What a listener returns (RocketMQ ``ConsumeConcurrentlyStatus`` / ``ConsumeOrderlyStatus``).

    SUCCESS: the messages are consumed. RECONSUME_LATER: a concurrent listener's messages go to the
    group's retry topic. SUSPEND_CURRENT_QUEUE_A_MOMENT: an orderly listener's queue pauses (about
    1 s) and the same messages come again, in place (an orderly listener's RECONSUME_LATER means the
    same; a concurrent listener's SUSPEND_CURRENT_QUEUE_A_MOMENT means RECONSUME_LATER).
    """

    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclasses.dataclass
class ConsumeConcurrentlyContext:
    """What a concurrent listener may say about a failed batch (RocketMQ's context of the same name).

    A listener taking two arguments gets one per call. ``delay_level_when_next_consume``: 0 (the
    default) lets the broker choose the retry delay (level 3 + reconsume times), -1 sends the
    failed messages to the dead-letter queue at once, 1..18 retries after that delay level (a
    higher level is clamped to 18).
    """

    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0


@dataclasses.dataclass
class ConsumeOrderlyContext:
    """What an orderly listener may say about a failed batch (RocketMQ's context of the same name).

    ``suspend_current_queue_time_ms``: how long the queue pauses before the batch comes again;
    -1 (the default) means the consumer's ``suspend_current_queue_ms``.
    """

    message_queue: MessageQueue
    suspend_current_queue_time_ms: int = -1


Listener = Callable[..., "ConsumeResult | str"]
# RocketMQ's orderly default: a failing message is retried in place, never dead-lettered.
UNLIMITED_RECONSUME = 2**31 - 1


def takes_context(listener: Callable[..., object]) -> bool:
    """True when ``listener`` accepts two positional arguments (the messages and a context)."""
    try:
        inspect.signature(listener).bind([], None)
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): called with the messages only
        return False
    return True


class ProcessQueue:
    """An assigned queue: its worker thread and offsets (RocketMQ's ``ProcessQueue``)."""

    def __init__(
        self, mq: MessageQueue, expression: MessageSelector | str, offset: int, committed: int | None
    ) -> None:
        self.mq = mq
        self.expression = expression
        self.offset = offset  # next offset to pull
        self.consumed = offset  # every message before this is consumed (or NACKed)
        self.committed = committed
        self.dropped = threading.Event()
        self.thread: threading.Thread | None = None
        self.attempts: dict[int, int] = {}  # orderly: queue offset -> reconsume times so far
        self.no_match: tuple[int, int] | None = None  # last NO_MATCHED_MSG (offset, next)


class QueueWorkers:
    """The consuming half of :class:`~engine.client.push.PushConsumer` (a mixin): what one queue's
    worker thread runs. The consumer sets the attributes below."""

    instance_id: str
    model: MessageModel
    pull_batch_size: int
    consume_batch_size: int
    _store: Store
    _membership: GroupMembership
    _puller: PullConsumer
    _actions: ActionLogWriter
    _listener: Listener | None
    _with_context: bool
    _orderly: bool
    _stop: threading.Event
    _rebalance_s: float
    _suspend_s: float
    _pull_suspend_ms: int

    @property
    def max_reconsume_times(self) -> int:  # pragma: no cover - the consumer defines it
        raise NotImplementedError

    @property
    def _uses_locks(self) -> bool:
        # RocketMQ locks queues for orderly clustering only; a broadcasting instance owns every queue.
        return self._orderly and self.model is MessageModel.CLUSTERING

    def _warn(self, what: str, exc: Exception) -> None:
        # Expected failures (MQError) are one line; anything else is a bug worth its traceback.
        _log.warning(
            "push consumer %s: %s: %s", self.instance_id, what, exc, exc_info=not isinstance(exc, MQError)
        )

    # ----------------------------------------------------------------- consuming
    def _active(self, pq: ProcessQueue) -> bool:
        return not pq.dropped.is_set() and not self._stop.is_set()

    def _run_queue(self, pq: ProcessQueue) -> None:
        mq = pq.mq
        while self._active(pq):
            if self._uses_locks and not self._membership.is_locked(mq):
                pq.dropped.wait(min(self._rebalance_s, 0.2))  # the rebalance thread relocks it
                continue
            try:
                result = self._puller.pull(
                    mq.topic,
                    mq.queue_id,
                    pq.offset,
                    max_nums=self.pull_batch_size,
                    expression=pq.expression,
                    suspend_ms=self._pull_suspend_ms,
                )
            except Exception as exc:  # logged; background work goes on
                self._warn(f"pull of {mq} failed", exc)
                pq.dropped.wait(self._suspend_s)
                continue
            # Offsets move only past entries the pull has shown to us. A pull's queue bounds can
            # run one dispatch commit ahead of the entries it read (QueueIndex takes them from
            # table history, which on a stale snapshot already holds newer commits), so "the
            # rest of the window was filtered out" is trusted only when a second pull agrees.
            if result.status is PullStatus.FOUND:
                if self._orderly:
                    done = self._consume_orderly(pq, result.messages)
                else:
                    done = self._consume_concurrently(pq, result.messages)
                if done:
                    pq.consumed = pq.offset = result.messages[-1].queue_offset + 1
                else:
                    pq.offset = pq.consumed  # interrupted: pull the unconsumed rest again
                pq.no_match = None
            elif result.status is PullStatus.OFFSET_ILLEGAL:
                _log.warning(
                    "push consumer %s: offset %d of %s is illegal; corrected to %d",
                    self.instance_id,
                    pq.offset,
                    mq,
                    result.next_begin_offset,
                )
                pq.consumed = pq.offset = result.next_begin_offset
            elif result.status is PullStatus.NO_MATCHED_MSG:
                seen = (pq.offset, result.next_begin_offset)
                if pq.no_match == seen and not MessageSelector.of(pq.expression).matches_all:
                    pq.consumed = pq.offset = result.next_begin_offset
                    pq.no_match = None
                else:
                    pq.no_match = seen  # "*" matches every entry: this can only be a stale view
            # NO_NEW_MSG: next_begin_offset is the offset pulled; nothing to move.

    def _view(self, message: MessageExt, reconsume_times: int | None = None) -> MessageExt:
        """The message as the listener sees it: a retry shows its original topic, as in RocketMQ."""
        changes: dict[str, object] = {}
        origin = message.properties.get(PROPERTY_RETRY_TOPIC)
        if origin and message.topic.startswith(RETRY_PREFIX):
            changes["topic"] = origin
        if reconsume_times is not None and reconsume_times != message.reconsume_times:
            changes["reconsume_times"] = reconsume_times
        return dataclasses.replace(message, **changes) if changes else message  # type: ignore[arg-type]

    def _call(
        self,
        messages: list[MessageExt],
        context: ConsumeConcurrentlyContext | ConsumeOrderlyContext | None = None,
    ) -> ConsumeResult:
        assert self._listener is not None
        try:
            result = self._listener(messages, context) if self._with_context else self._listener(messages)
        except Exception as exc:  # a failing listener means "reconsume later", as in RocketMQ
            _log.warning("push consumer %s: listener raised %r; reconsume later", self.instance_id, exc)
            return ConsumeResult.RECONSUME_LATER
        if isinstance(result, ConsumeResult):
            return result
        if isinstance(result, str) and result in ConsumeResult.__members__:
            return ConsumeResult(result)
        _log.warning("push consumer %s: listener returned %r; reconsume later", self.instance_id, result)
        return ConsumeResult.RECONSUME_LATER

    def _dead_letter_times(self, reconsume_times: int) -> int:
        # The retry job dead-letters a NACK whose reconsume_times reach its max (config); a lower
        # per-consumer max is carried by raising the count to the job's threshold.
        return max(reconsume_times, self.max_reconsume_times, self._store.config.max_reconsume_times)

    def _nack(self, message: MessageExt, reconsume_times: int, retry_at_ms: int | None = None) -> None:
        self._actions.record(NACK, message, reconsume_times=reconsume_times, deadline_ms=retry_at_ms)

    def _nack_failed(self, chunk: list[MessageExt], delay_level: object) -> None:
        """NACK a failed concurrent batch as ``delayLevelWhenNextConsume`` says: -1 dead-letters at
        once, 0 lets the retry job choose the delay, 1..18 (higher: 18) retries after that level."""
        if isinstance(delay_level, bool) or not isinstance(delay_level, int) or delay_level < -1:
            _log.warning(
                "push consumer %s: delay_level_when_next_consume %r is not -1, 0 or 1..18; using 0",
                self.instance_id,
                delay_level,
            )
            delay_level = 0
        now = int(time.time() * 1000)
        job_max = self._store.config.max_reconsume_times
        for m in chunk:
            self._nack(m, *nack_plan(m.reconsume_times, self.max_reconsume_times, delay_level, job_max, now))

    def _consume_concurrently(self, pq: ProcessQueue, messages: list[MessageExt]) -> bool:
        size = self.consume_batch_size
        for start in range(0, len(messages), size):
            if not self._active(pq):
                return False
            chunk = messages[start : start + size]
            context = ConsumeConcurrentlyContext(pq.mq)
            if self._call([self._view(m) for m in chunk], context) is not ConsumeResult.SUCCESS:
                if self.model is MessageModel.BROADCASTING:
                    # RocketMQ drops failed broadcast messages: there is no per-instance retry topic.
                    _log.warning(
                        "push consumer %s: broadcast consume failed; dropping %d message(s)",
                        self.instance_id,
                        len(chunk),
                    )
                else:
                    self._nack_failed(chunk, context.delay_level_when_next_consume)
            pq.consumed = chunk[-1].queue_offset + 1
        return True

    def _consume_orderly(self, pq: ProcessQueue, messages: list[MessageExt]) -> bool:
        pending = list(messages)
        size = self.consume_batch_size
        while pending:
            if not self._active(pq) or (self._uses_locks and not self._membership.is_locked(pq.mq)):
                return False
            chunk = pending[:size]
            times = {m.queue_offset: pq.attempts.get(m.queue_offset, m.reconsume_times) for m in chunk}
            context = ConsumeOrderlyContext(pq.mq)
            result = self._call([self._view(m, times[m.queue_offset]) for m in chunk], context)
            if result is ConsumeResult.SUCCESS:
                done = chunk
            else:
                # RocketMQ's checkReconsumeTimes: past the max, a message is dead-lettered and counts
                # as consumed; the others are retried, in order, after a pause.
                done = []
                for m in chunk:
                    attempts = times[m.queue_offset]
                    if attempts >= self.max_reconsume_times:
                        self._nack(m, self._dead_letter_times(attempts))
                        done.append(m)
                    else:
                        pq.attempts[m.queue_offset] = attempts + 1
            done_offsets = {m.queue_offset for m in done}
            for offset in done_offsets:
                pq.attempts.pop(offset, None)
            pending = [m for m in pending if m.queue_offset not in done_offsets]
            # Consumed up to the first message still pending (orderly never passes a failure).
            if done:
                first_pending = pending[0].queue_offset if pending else None
                last_done = max(done_offsets)
                if first_pending is None or first_pending > last_done:
                    pq.consumed = last_done + 1
            if len(done) < len(chunk):
                pause = context.suspend_current_queue_time_ms
                ok = not isinstance(pause, bool) and isinstance(pause, int) and 0 < pause <= 60_000
                pq.dropped.wait(pause / 1000 if ok else self._suspend_s)
        return True
