"""Per-message ack (RocketMQ 5 ``SimpleConsumer`` / POP) on QMQ's pull and action logs.

Consumers of a group share the queues of a topic message by message (a group may have more
consumers than queues). A received message is invisible to the group until its deadline; an ack
removes it for good; one not acked by then is delivered again, to any consumer of the group, with
``reconsume_times`` + 1 (in place, from its queue; past ``max_reconsume_times`` an ``EXPIRED`` row
with the failed delivery's count hands it to the retry job, which dead-letters it). ``nack`` records
a ``NACK`` for the retry job; the group's retry topic is received from once it exists.

Leases (:mod:`engine.client.simple.leases`, the protocol described there): one ``PULL`` row leases
a range of a queue; messages are handed out from a local buffer; acks travel as ranges in
micro-batches; a consumer back with its id gets what it held at once; offset resets reach running
consumers. Receipt handles: an ack, nack or change after the deadline, or of a superseded delivery,
is refused (:class:`~engine.errors.ReceiptHandleExpiredError`), as RocketMQ 5 refuses a stale one.
Timing assumes the clocks of the group's consumers agree to well within an invisible time.

FIFO groups (RocketMQ 5's FIFO consume type; ``Admin.update_group(group, fifo=True)`` or
``fifo=True`` here): each queue is received in queue order, the next messages of a queue only after
every one received before is acked or dead-lettered; ``nack`` gives a message back in place (the next
receive gets it again); acks are appended before ``ack`` returns. Producers keep a message group's
messages in one queue (``Producer.send(message_group=...)``), so the order holds per message group.
The rule is described in :mod:`engine.client.simple.leases`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref

from engine.client.membership import default_consumer_id
from engine.client.offsets import ConsumeFrom
from engine.client.simple.deliveries import ReceivedMessage, Source, receive_sources
from engine.client.simple.leases import Leases
from engine.closing import Closing
from engine.errors import (
    ConsumerClosedError,
    ConsumerError,
    InvalidArgumentError,
    InvalidTopicError,
    MQError,
)
from engine.model import MessageExt
from engine.protocol.actions import CHANGE_INVISIBLE, NACK
from engine.protocol.delays import max_reconsume_times
from engine.protocol.names import RETRY_PREFIX, SYSTEM_TOPICS, validate_group_name
from engine.protocol.permissions import is_readable
from engine.protocol.selectors import MessageSelector
from engine.store.consumer_offset import OffsetStore
from engine.store.group_configs import group_config
from engine.store.store import Store, now_ms

MAX_RECEIVE_NUMS = 1024
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # RocketMQ 5's longest invisible duration
OFFSET_PERSIST_MS = 5000  # as RocketMQ's consumer offset persistence


def _reconsume_limit(group: str, default: int, message: MessageExt) -> int:
    """Deliveries after the first allowed for ``message`` in ``group`` (its property, else ``default``)."""
    return max_reconsume_times(message.properties, group, None, default)


def _hand_back(leases: Leases, lock: threading.RLock) -> None:
    """What :meth:`SimpleConsumer.close` does first, for a consumer not closed when its process
    exits (``atexit``) or when it is collected: give back what was leased and never handed out and
    append the buffered acks. Best effort: if that fails, those leases end at their deadlines."""
    if not lock.acquire(timeout=5):  # a flush stuck in another thread: leave it to the deadlines
        return
    try:
        with contextlib.suppress(Exception):
            leases.release_all()
            leases.flush()
    finally:
        lock.release()


def _int_arg(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} {value!r} must be an int in {low}..{high}", **{name: value})
    return value


class SimpleConsumer(Closing):
    """Receives messages one by one with per-message ack (RocketMQ 5 ``SimpleConsumer``).

    Args:
        store: an open store.
        group: the consumer group; its consumers share the subscribed topics message by message.
        consumer_id: this instance's id, unique among live instances (default: host, pid, random).
            A consumer started again with the same id gets back at once what it held.
        invisible_ms_default: invisible time of :meth:`receive` when it is not given.
        ack_linger_ms: how long acks wait in the buffer before they are appended.
        consume_from: where the group starts a queue it has no position in (module docstring).
        consume_from_timestamp_ms: the time for ``ConsumeFrom.TIMESTAMP`` (default 30 min ago).
        max_unacked: most messages received and not yet acked; :meth:`receive` returns no more
            until some are acked, nacked or expire (back-pressure).
        max_reconsume_times: deliveries after the first before a message is dead-lettered; -1 (or
            None) is the store's setting (RocketMQ's 16). A message's ``MAX_RECONSUME_TIMES``
            property wins.
        fifo: receive as a FIFO group (module docstring); None (default): the group's setting
            (``Admin.update_group``).

    Thread-safe. Use :meth:`close` (or a ``with`` block) to flush buffered acks and give back at
    once what was leased ahead and never handed out; a consumer left open does that when its
    process exits normally (not when it is killed: its leases then end at their deadlines).

    Raises:
        InvalidArgumentError: a bad group, consumer id, time or limit.
    """

    def __init__(
        self,
        store: Store,
        group: str,
        consumer_id: str | None = None,
        invisible_ms_default: int = 30_000,
        *,
        ack_linger_ms: int = 100,
        consume_from: ConsumeFrom | str = ConsumeFrom.LAST,
        consume_from_timestamp_ms: int | None = None,
        max_unacked: int = 4096,
        max_reconsume_times: int | None = None,
        fifo: bool | None = None,
    ) -> None:
        self.group = validate_group_name(group)
        if fifo is not None and not isinstance(fifo, bool):
            raise InvalidArgumentError(f"fifo must be a bool or None, got {fifo!r}", fifo=fifo)
        if consumer_id is None:
            consumer_id = default_consumer_id()
        if not isinstance(consumer_id, str) or not consumer_id:
            raise InvalidArgumentError("consumer_id must be a non-empty string", consumer_id=consumer_id)
        self.consumer_id = consumer_id
        self.invisible_ms_default = _int_arg(
            "invisible_ms_default", invisible_ms_default, 1, MAX_INVISIBLE_MS
        )
        self._ack_linger_s = _int_arg("ack_linger_ms", ack_linger_ms, 0, 60_000) / 1000
        try:
            start = ConsumeFrom(consume_from)
        except ValueError:
            raise InvalidArgumentError(
                f"consume_from must be one of {[c.value for c in ConsumeFrom]}, got {consume_from!r}",
                consume_from=consume_from,
            ) from None
        timestamp = now_ms() - 30 * 60_000 if consume_from_timestamp_ms is None else consume_from_timestamp_ms
        _int_arg("consume_from_timestamp_ms", timestamp, 0, 2**62)
        self.max_unacked = _int_arg("max_unacked", max_unacked, 1, 1 << 20)
        limit = -1 if max_reconsume_times is None else max_reconsume_times
        limit = _int_arg("max_reconsume_times", limit, -1, 1 << 30)
        self._max_reconsume = store.config.max_reconsume_times if limit == -1 else limit
        self._store = store
        # The limit as a function of its own (not a method): the leases, which the exit hook
        # keeps, must not keep the consumer alive.
        limit_of = functools.partial(_reconsume_limit, self.group, self._max_reconsume)
        if fifo is None:
            fifo = group_config(store, self.group).fifo
        self.fifo = fifo
        self._leases = Leases(store, self.group, consumer_id, start, timestamp, limit_of, fifo=fifo)
        self._subscriptions: dict[str, MessageSelector] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._ack_batch: float | None = None  # the batch of buffered acks the flusher was woken for
        self._flusher: threading.Thread | None = None
        self._offsets = OffsetStore(store, self.group)
        self._persisted: dict[tuple[str, int], int] = {}
        self._persist_lock = threading.Lock()
        self._persisted_at = time.monotonic()
        self._closed = False
        # A consumer its process leaves unclosed still gives back what it never handed out.
        self._finalizer = weakref.finalize(self, _hand_back, self._leases, self._lock)

    @property
    def conflicts(self) -> int:
        """Lease commits that lost a race with another consumer of the same queue."""
        return self._leases.conflicts

    # ----------------------------------------------------------------- subscriptions
    def subscribe(self, topic: str, expression: MessageSelector | str = "*") -> None:
        """Receive messages of ``topic`` matching a selector: a tag expression (``"*"``,
        ``"TagA || TagB"``), ``MessageSelector.by_tag`` or ``MessageSelector.by_sql`` (SQL92 over the
        message's properties and ``TAGS``, as RocketMQ's).

        Raises:
            TopicNotFoundError: no such topic.
            InvalidSelectorError: a bad expression.
            InvalidArgumentError: a broker-internal or unreadable topic.
        """
        self._check_open()
        config = self._store.topic(topic)
        if config.name in SYSTEM_TOPICS or config.name.lower().startswith("rmq_sys_"):
            raise InvalidArgumentError(f"topic {topic!r} is internal to the broker", topic=topic)
        if not is_readable(config.perm):
            raise InvalidArgumentError(f"topic {topic!r} is not readable (perm {config.perm})", topic=topic)
        selector = MessageSelector.of(expression)
        with self._lock:
            self._subscriptions[config.name] = selector
            # The group's lease state is read, and the tables a receive reads are opened, now
            # rather than in the first receive. Best effort: if it fails, the first receive
            # does it again and reports the failure.
            with contextlib.suppress(MQError):
                self._leases.start()
                self._leases.maintain(self._sources)

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving ``topic`` (messages already received may still be acked).

        Raises:
            InvalidTopicError: ``topic`` is not a string.
        """
        if not isinstance(topic, str):
            raise InvalidTopicError(f"topic must be a non-empty string, got {topic!r}", topic=topic)
        with self._lock:
            self._subscriptions.pop(topic, None)

    @property
    def subscriptions(self) -> dict[str, str]:
        """Subscribed topics and their expressions."""
        with self._lock:
            return {t: str(f) for t, f in self._subscriptions.items()}

    # ----------------------------------------------------------------- receiving
    def receive(
        self,
        max_nums: int = 16,
        invisible_ms: int | None = None,
        *,
        wait_ms: int = 0,
        topic: str | None = None,
    ) -> list[ReceivedMessage]:
        """Up to ``max_nums`` messages visible to the group; they stay invisible to it until acked
        or until ``invisible_ms`` has passed.

        Messages come from this consumer's leases (one action-log commit leases many), so most
        receives commit nothing. Fewer are returned while ``max_unacked`` messages are unacked.

        Args:
            max_nums: most messages returned (1..1024).
            invisible_ms: invisible time (1 ms..12 h); default ``invisible_ms_default``. A message
                is returned only with at least this long left of its lease.
            wait_ms: when nothing is visible, keep looking up to this long (long polling). When
                there are messages but other consumers of the group win the races for them, a
                receive tries again after short jittered pauses, also with ``wait_ms=0`` (for up
                to about 50 ms), rather than answer empty.
            topic: only messages of this subscribed topic (and those of the group's retry topic
                first sent to it), as a RocketMQ 5 receive names its topic; None: every subscription.

        Returns:
            The messages, each with ``reconsume_times`` counting earlier deliveries, its receipt
            handle and ``invisible_until_ms``.

        Raises:
            ConsumerError: nothing is subscribed, or not ``topic``.
            InvalidArgumentError: a bad argument.
            StoreError: reading or writing the store failed (nothing leased).
            ConsumerClosedError: the consumer is closed.
        """
        self._check_open()
        max_nums = _int_arg("max_nums", max_nums, 1, MAX_RECEIVE_NUMS)
        invisible = self.invisible_ms_default if invisible_ms is None else invisible_ms
        invisible = _int_arg("invisible_ms", invisible, 1, MAX_INVISIBLE_MS)
        wait_ms = _int_arg("wait_ms", wait_ms, 0, self._store.config.long_poll_max_ms)
        if not self._subscriptions:
            raise ConsumerError("subscribe to a topic before receive()", group=self.group)
        if topic is not None and topic not in self._subscriptions:
            raise ConsumerError(f"topic {topic!r} is not subscribed", group=self.group, topic=topic)
        self._ensure_flusher()
        deadline = time.monotonic() + wait_ms / 1000
        interval = max(self._store.config.long_poll_interval_ms, 50) / 1000
        while True:
            got = self._receive_once(max_nums, invisible, deadline, topic)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            time.sleep(min(interval, remaining))

    def _receive_once(
        self, max_nums: int, invisible_ms: int, deadline: float, topic: str | None = None
    ) -> list[ReceivedMessage]:
        with self._lock:
            leases = self._leases
            leases.start()
            # The topic routes are read only for a scan or a lease, not for a receive served
            # from the buffer.
            leases.maintain(self._sources)
            room = min(max_nums, self.max_unacked - leases.unacked)
            if room <= 0:
                return []
            out = leases.take(room, invisible_ms, topic=topic)
            if len(out) < room:
                capacity = self.max_unacked - leases.unacked - leases.waiting
                since = time.monotonic()
                wanted = min(room - len(out), capacity)
                if (
                    capacity > 0
                    and leases.lease(self._sources(topic), wanted, invisible_ms, deadline=deadline) > 0
                ):
                    out += leases.take(room - len(out), invisible_ms, leased_since=since, topic=topic)
                if self.fifo and leases.buffered_acks:
                    # Messages the selector filtered out finish the queue's range: now, not later.
                    with contextlib.suppress(MQError):
                        leases.flush()
            self._nudge_flusher()
        return out

    def _sources(self, topic: str | None = None) -> list[Source]:
        """What to receive from: every subscription, or ``topic`` and the group's retry topic."""
        sources = receive_sources(self._store, self.group, self._subscriptions)
        if topic is None:
            return sources
        return [s for s in sources if s[0] == topic or s[0].startswith(RETRY_PREFIX)]

    def adopt(self, topic: str, queue_id: int, offset: int, receipt_handle: str) -> ReceivedMessage:
        """Hold a message received through another process with this consumer id (a client that
        reconnected elsewhere): the message at ``topic:queue_id@offset``, as :meth:`receive`
        returned it there under ``receipt_handle``, to :meth:`ack`, :meth:`nack` or change here.

        Raises:
            InvalidReceiptHandleError: ``receipt_handle`` is not this id's live lease of the message
                (its invisible time ended, it was delivered again or changed since, or it is acked).
            StoreError: reading the action log failed.
            ConsumerClosedError: the consumer is closed.
        """
        self._check_open()
        with self._lock:
            return self._leases.adopt(topic, queue_id, offset, receipt_handle)

    # ----------------------------------------------------------------- acknowledging
    def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge a received message: it is never delivered to the group again.

        The ack is buffered and appended within ``ack_linger_ms`` (or with the next lease commit, or
        at :meth:`close`); less than a second before its deadline it is committed before this
        returns, so that it never lands after the message was delivered again.

        Raises:
            InvalidReceiptHandleError: not a message this consumer holds (never received here,
                already acked or nacked).
            ReceiptHandleExpiredError: its invisible time has passed.
        """
        self._check_open()
        self._ensure_flusher()
        with self._lock:
            self._leases.ack(message, self._store.config.max_commit_attempts)
            self._nudge_flusher()
        if self.fifo:
            # The queue's next messages wait for this ack: append it now (if that fails, the
            # flusher appends it later).
            with contextlib.suppress(MQError):
                self.flush()

    def nack(self, message: ReceivedMessage) -> None:
        """Give a received message back for a later retry: records a ``NACK`` that the retry job
        routes to ``%RETRY%<group>`` (or, past the maximum reconsume times, ``%DLQ%<group>``). In a
        FIFO group the message is made visible again at once, in place: the next receive of its
        queue gets it again (``reconsume_times`` + 1; past the most, it is dead-lettered).

        Committed before this returns.

        Raises:
            InvalidReceiptHandleError: not a message this consumer holds.
            ReceiptHandleExpiredError: its invisible time ended (another consumer may hold it).
        """
        if self.fifo:
            self._holder_action(CHANGE_INVISIBLE, message, 0)
            with self._lock:
                self._leases.forget(message)
            return
        self._holder_action(NACK, message, None)

    def dead_letter(self, message: ReceivedMessage) -> None:
        """Give a received message up for good: records a ``NACK`` counted as its last delivery
        allowed, which the retry job puts in ``%DLQ%<group>`` (RocketMQ 5's
        ``ForwardMessageToDeadLetterQueue``), as one never acked after the most deliveries.

        Committed before this returns.

        Raises:
            InvalidReceiptHandleError: not a message this consumer holds.
            ReceiptHandleExpiredError: its invisible time ended (another consumer may hold it).
        """
        self._check_open()
        limit = _reconsume_limit(self.group, self._max_reconsume, message)
        with self._lock:
            self._leases.decide(
                NACK,
                message,
                None,
                self._store.config.max_commit_attempts,
                reconsume_times=max(limit, message.reconsume_times),
            )

    def change_invisible_time(self, message: ReceivedMessage, invisible_ms: int) -> ReceivedMessage:
        """Keep a received message invisible for ``invisible_ms`` more, counted from now.

        Committed before this returns; until then the old deadline holds.

        Returns:
            The message with its new receipt handle and ``invisible_until_ms`` (the old handle
            stays valid for :meth:`ack`).

        Raises:
            InvalidArgumentError: a bad time.
            InvalidReceiptHandleError: not a message this consumer holds.
            ReceiptHandleExpiredError: its invisible time already ended.
        """
        _int_arg("invisible_ms", invisible_ms, 1, MAX_INVISIBLE_MS)
        changed = self._holder_action(CHANGE_INVISIBLE, message, invisible_ms)
        assert changed is not None
        return changed

    def _holder_action(
        self, action: str, message: ReceivedMessage, invisible_ms: int | None
    ) -> ReceivedMessage | None:
        self._check_open()
        with self._lock:
            return self._leases.decide(action, message, invisible_ms, self._store.config.max_commit_attempts)

    # ----------------------------------------------------------------- the action log
    def flush(self) -> int:
        """Append buffered acks now; returns how many messages they cover."""
        # Not under the consumer's lock: receives and acks go on while the acks are written (the
        # action-log writer keeps its buffers and commits in order by itself).
        return self._leases.flush()

    def persist_offsets(self) -> int:
        """Record, per queue, the offset below which every message is finished (acked, nacked or
        filtered out) in ``consumer_offset``: consumer-aware retention keeps what is above it, and
        tools show the group's progress. Done every ``OFFSET_PERSIST_MS`` and at :meth:`close`.

        Returns the queues recorded.
        """
        with self._persist_lock:
            with self._lock:
                floors = self._leases.floors()
            entries = [
                (topic, queue_id, floor)
                for (topic, queue_id), floor in floors.items()
                if self._persisted.get((topic, queue_id)) != floor
            ]
            if entries:
                self._offsets.commit(entries)
                for topic, queue_id, floor in entries:
                    self._persisted[(topic, queue_id)] = floor
            self._persisted_at = time.monotonic()
            return len(entries)

    def _nudge_flusher(self) -> None:
        """Wake the flusher when a new batch of acks or releases began (the first buffered since a
        flush), not on every ack: a thread woken per message costs the receiving thread its
        processor. While a batch is buffered the flusher waits no longer than the linger, and
        looks again after each flush. Called under the lock."""
        batch = self._leases.ack_batch
        if batch is not None and batch != self._ack_batch:
            self._wake.set()
        self._ack_batch = batch

    def _ensure_flusher(self) -> None:
        if self._flusher is None:
            with self._lock:
                if self._flusher is None and not self._closed:
                    self._flusher = threading.Thread(
                        target=self._run_flusher, name=f"mq-simple-{self.group}", daemon=True
                    )
                    self._flusher.start()

    def _run_flusher(self) -> None:
        """Background: append buffered acks when due; persist offsets every ``OFFSET_PERSIST_MS``."""
        persist_s = OFFSET_PERSIST_MS / 1000
        while not self._closed:
            with self._lock:
                wait = self._leases.ack_flush_due_in(self._ack_linger_s)
            if wait == 0.0:
                try:
                    self.flush()
                except Exception:  # acks stay buffered; the next round or close() retries them
                    time.sleep(self._ack_linger_s)
                continue
            woken = self._wake.wait(persist_s if wait is None else min(wait, persist_s))
            if woken:
                self._wake.clear()
            if self._closed:
                break
            if time.monotonic() - self._persisted_at >= persist_s:
                try:
                    self.persist_offsets()
                except Exception:  # the next round retries
                    self._persisted_at = time.monotonic()

    # ----------------------------------------------------------------- lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError(
                f"consumer {self.consumer_id} of group {self.group} is closed", group=self.group
            )

    def close(self, *, offline: bool = False) -> None:
        """Give back what was leased and never handed out, append buffered acks and stop.

        Messages received and not acked become visible at their deadlines, or at once with
        ``offline=True`` (QMQ's FOREVER_OFFLINE: this consumer id is gone for good).
        """
        if self._closed:
            return
        with self._lock:
            self._leases.release_all()
            self._leases.flush(offline=offline)
            self._closed = True
            self._finalizer.detach()
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        self.persist_offsets()

    def __repr__(self) -> str:
        return f"SimpleConsumer(group={self.group!r}, consumer_id={self.consumer_id!r})"
