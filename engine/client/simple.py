"""Per-message ack (RocketMQ 5 ``SimpleConsumer`` / POP, QMQ): receive, then ack each message.

Consumers of a group share the queues of a topic message by message, so a group may have more
consumers than queues. A received message is invisible to the rest of the group until its deadline;
an ack removes it for good; a message not acked by its deadline is delivered again.

Claims, acks and redelivery need no lock service: all state is in ``action_log``, and the claim
protocol is described in :mod:`engine.client.claim_log`.

Redelivery: a message whose deadline passed without an ack is claimed again straight from its
original queue, with ``reconsume_times`` + 1 per earlier delivery in this group (instead of being
revived into the retry topic as RocketMQ 5 does: the queue already holds it and the claim state says
how often it was delivered). Past ``max_reconsume_times`` the claiming consumer records the claim and
a ``NACK`` (whose ``reconsume_times`` is that delivery count) in one commit instead of returning it,
for the retry job to route (to ``%DLQ%<group>`` when it honours the row's count). ``nack`` records a
``NACK`` for the retry job; the group's retry topic is received from automatically once it exists.

Cost: every receive is one action-log commit, so a group's receives are serialised on that log; a
consumer that loses a race catches up with the new versions only (no re-read of messages) and
retries after a random backoff. Receive in batches (``max_nums``) when throughput matters.

Timing assumes the clocks of the group's consumers agree to well within an invisible time.
New groups start at each queue's first stored message.

Modules: the claim state is :mod:`engine.client.claims` (pure), reading and writing the action log
:mod:`engine.client.claim_log`, finding visible messages :mod:`engine.client.visible_messages`; this module is
the public :class:`SimpleConsumer`.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from engine.client.claim_log import ClaimLog, Held, ReceivedMessage, received_message
from engine.client.claims import CLAIM_ACTIONS, Claim, ClaimBook, Key, QueueBook
from engine.client.membership import default_consumer_id
from engine.client.visible_messages import SCAN_WINDOW, Source, pick_visible, receive_sources
from engine.closing import Closing
from engine.errors import (
    CommitConflictError,
    ConsumerError,
    InvalidArgumentError,
    InvalidTopicError,
    ProducerClosedError,
)
from engine.model import MessageExt
from engine.protocol.actions import ACK, CHANGE_INVISIBLE, NACK, PULL
from engine.protocol.names import SYSTEM_TOPICS, validate_group_name
from engine.protocol.permissions import is_readable
from engine.protocol.tags import TagFilter, parse_tag_expression
from engine.store import schemas
from engine.store.consume_queue import QueueIndex
from engine.store.consumer_offset import OffsetStore
from engine.store.store import Store, now_ms

__all__ = [
    "CLAIM_ACTIONS",
    "MAX_INVISIBLE_MS",
    "MAX_RECEIVE_NUMS",
    "OFFSET_PERSIST_MS",
    "SCAN_WINDOW",
    "Claim",
    "ClaimBook",
    "QueueBook",
    "ReceivedMessage",
    "SimpleConsumer",
    "default_consumer_id",
]

MAX_RECEIVE_NUMS = 1024
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # RocketMQ 5's longest invisible duration
OFFSET_PERSIST_MS = 5000  # as RocketMQ's consumer offset persistence


# ----------------------------------------------------------------------------- the consumer
def _int_arg(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} {value!r} must be an int in {low}..{high}", **{name: value})
    return value


def _backoff(attempt: int) -> None:
    """Sleep after a lost race: long and random enough to fall out of step with a consumer whose
    commits keep landing in our window (a Delta commit takes tens of milliseconds)."""
    time.sleep(random.uniform(0.002, min(0.2, 0.01 * 2 ** min(attempt, 5))))


def _key_of(message: object) -> Key:
    if not isinstance(message, MessageExt):
        raise InvalidArgumentError(f"expected a message returned by receive(), got {type(message).__name__}")
    return (message.topic, message.queue_id, message.queue_offset)


class SimpleConsumer(Closing):
    """Receives messages one by one with per-message ack (RocketMQ 5 ``SimpleConsumer``).

    Args:
        store: an open store.
        group: the consumer group; its consumers share the subscribed topics message by message.
        consumer_id: this instance's id, unique among live instances (default: host, pid, random).
        invisible_ms_default: invisible time of :meth:`receive` when it is not given.
        ack_linger_ms: how long acks wait in the buffer before they are appended.

    Thread-safe. Use :meth:`close` (or a ``with`` block) to flush buffered acks.

    Raises:
        InvalidArgumentError: a bad group, consumer id or time.
    """

    def __init__(
        self,
        store: Store,
        group: str,
        consumer_id: str | None = None,
        invisible_ms_default: int = 30_000,
        *,
        ack_linger_ms: int = 100,
    ) -> None:
        self.group = validate_group_name(group)
        if consumer_id is None:
            consumer_id = default_consumer_id()
        if not isinstance(consumer_id, str) or not consumer_id:
            raise InvalidArgumentError("consumer_id must be a non-empty string", consumer_id=consumer_id)
        self.consumer_id = consumer_id
        self.invisible_ms_default = _int_arg(
            "invisible_ms_default", invisible_ms_default, 1, MAX_INVISIBLE_MS
        )
        self._ack_linger_s = _int_arg("ack_linger_ms", ack_linger_ms, 0, 60_000) / 1000
        self._store = store
        self._log = ClaimLog(store, self.group, consumer_id)
        self._index = QueueIndex(store)
        self._subscriptions: dict[str, TagFilter] = {}
        self._held: dict[Key, Held] = {}
        self._rotation = 0
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._offsets = OffsetStore(store, self.group)
        self._persisted: dict[tuple[str, int], int] = {}
        self._persisted_at = time.monotonic()
        self._closed = False
        self.conflicts = 0  # lost claim races, for tests and benchmarks

    # ----------------------------------------------------------------- subscriptions
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Receive messages of ``topic`` matching a tag expression (``"*"``, ``"TagA || TagB"``).

        Raises:
            TopicNotFoundError: no such topic.
            InvalidArgumentError: a bad expression, a broker-internal or unreadable topic.
        """
        self._check_open()
        config = self._store.topic(topic)
        if config.name in SYSTEM_TOPICS or config.name.lower().startswith("rmq_sys_"):
            raise InvalidArgumentError(f"topic {topic!r} is internal to the broker", topic=topic)
        if not is_readable(config.perm):
            raise InvalidArgumentError(f"topic {topic!r} is not readable (perm {config.perm})", topic=topic)
        tag_filter = parse_tag_expression(expression)
        with self._lock:
            self._subscriptions[config.name] = tag_filter

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
            return {t: f.expression for t, f in self._subscriptions.items()}

    # ----------------------------------------------------------------- receiving
    def receive(
        self, max_nums: int = 16, invisible_ms: int | None = None, *, wait_ms: int = 0
    ) -> list[ReceivedMessage]:
        """Claim up to ``max_nums`` visible messages; they stay invisible to the group until acked or
        until ``invisible_ms`` has passed.

        The claims are committed to ``action_log`` before this returns.

        Args:
            max_nums: most messages returned (1..1024).
            invisible_ms: invisible time (1 ms..12 h); default ``invisible_ms_default``.
            wait_ms: when nothing is visible, keep looking up to this long (long polling).

        Returns:
            The messages, each with ``reconsume_times`` counting earlier deliveries.

        Raises:
            ConsumerError: nothing is subscribed.
            InvalidArgumentError: a bad argument.
            CommitConflictError: lost every race for the action log (retryable; nothing claimed).
            ProducerClosedError: the consumer is closed.
        """
        self._check_open()
        max_nums = _int_arg("max_nums", max_nums, 1, MAX_RECEIVE_NUMS)
        invisible = self.invisible_ms_default if invisible_ms is None else invisible_ms
        invisible = _int_arg("invisible_ms", invisible, 1, MAX_INVISIBLE_MS)
        wait_ms = _int_arg("wait_ms", wait_ms, 0, self._store.config.long_poll_max_ms)
        if not self._subscriptions:
            raise ConsumerError("subscribe to a topic before receive()", group=self.group)
        self._ensure_flusher()
        deadline = time.monotonic() + wait_ms / 1000
        interval = max(self._store.config.long_poll_interval_ms, 50) / 1000
        while True:
            got = self._receive_once(max_nums, invisible)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            time.sleep(min(interval, remaining))

    def _receive_once(self, max_nums: int, invisible_ms: int) -> list[ReceivedMessage]:
        attempts = self._store.config.max_commit_attempts
        cache: dict[int, MessageExt] = {}  # messages read by an attempt that lost its race
        with self._lock:
            self._sync()
            self._index.refresh()
            chosen: list[MessageExt] = []
            for attempt in range(attempts):
                if not chosen:
                    chosen = self._pick(max_nums, now_ms(), cache)
                    if not chosen:
                        return []
                # The race window opens here: catch up with commits made since the pick (a few
                # milliseconds of reading) and keep what is still visible, then commit the next version.
                self._sync()
                now = now_ms()
                chosen = [
                    m
                    for m in chosen
                    if self._log.book.queue(m.topic, m.queue_id).available(m.queue_offset, now)
                ]
                if not chosen:
                    continue  # all taken meanwhile: pick again
                ts = max(now, self._log.book.last_claim_ts + 1)
                rows: list[dict[str, Any]] = []
                out: list[ReceivedMessage] = []
                for message in chosen:
                    claim = self._log.book.claim((message.topic, message.queue_id, message.queue_offset))
                    reconsume = message.reconsume_times + (claim.deliveries if claim is not None else 0)
                    sequence = self._log.next_sequence()
                    rows.append(self._log.row(PULL, message, sequence, ts, reconsume, ts + invisible_ms))
                    if reconsume > self._store.config.max_reconsume_times:
                        # Delivered too often: hand it to the retry job, which sends it to the DLQ.
                        rows.append(
                            self._log.row(NACK, message, self._log.next_sequence(), ts, reconsume, None)
                        )
                        continue
                    out.append(
                        received_message(
                            message, reconsume, f"{self.consumer_id}#{sequence}", ts + invisible_ms
                        )
                    )
                if not self._log.commit(rows):
                    self.conflicts += 1
                    _backoff(attempt)
                    continue
                for m in out:
                    self._held[(m.topic, m.queue_id, m.queue_offset)] = Held.of(m)
                return out
            raise CommitConflictError(
                f"receive lost {attempts} races for the action log in a row; retry later",
                table=schemas.ACTION_LOG,
                group=self.group,
            )

    def _sources(self) -> list[Source]:
        """Every (topic, queue, filter) to receive from, starting at a different queue each time so
        one busy queue does not starve the others."""
        sources = receive_sources(self._store, self.group, self._subscriptions)
        if sources:
            self._rotation = (self._rotation + 1) % len(sources)
            sources = sources[self._rotation :] + sources[: self._rotation]
        return sources

    def _pick(self, max_nums: int, now: int, cache: dict[int, MessageExt]) -> list[MessageExt]:
        """Messages visible to the group as of the state read, to claim."""
        return pick_visible(self._index, self._log.book, self._sources(), max_nums, now, cache)

    # ----------------------------------------------------------------- acknowledging
    def ack(self, message: MessageExt) -> None:
        """Acknowledge a received message: it is never delivered to the group again.

        The ack is buffered and appended within ``ack_linger_ms`` (or with the next claim commit,
        or at :meth:`close`). It is accepted even after the message's invisibility ended.

        Raises:
            InvalidArgumentError: not a message this consumer received, or already acked / nacked.
        """
        self._check_open()
        key = _key_of(message)
        with self._lock:
            held = self._held.pop(key, None)
            if held is None:
                raise self._not_held(key, ": it was not received here, or was already acked or nacked")
            self._log.book.queue(key[0], key[1]).finish(key[2])
            self._log.buffer_ack(
                self._log.row(ACK, key, self._log.next_sequence(), now_ms(), held.reconsume_times, None, held)
            )
        self._ensure_flusher()
        self._wake.set()

    def nack(self, message: MessageExt) -> None:
        """Give a received message back for a later retry: records a ``NACK`` that the retry job
        routes to ``%RETRY%<group>`` (or, past the maximum reconsume times, ``%DLQ%<group>``).

        Raises:
            InvalidArgumentError: not a message this consumer holds.
            ConsumerError: its invisibility ended and another consumer took it over.
        """
        self._claim_action(NACK, message, None)

    def change_invisible_time(self, message: MessageExt, invisible_ms: int) -> None:
        """Keep a received message invisible for ``invisible_ms`` more, counted from now.

        Committed before this returns; until then the old deadline holds.

        Raises:
            InvalidArgumentError: not a message this consumer holds, or a bad time.
            ConsumerError: its invisibility already ended.
        """
        _int_arg("invisible_ms", invisible_ms, 1, MAX_INVISIBLE_MS)
        self._claim_action(CHANGE_INVISIBLE, message, invisible_ms)

    def _not_held(self, key: Key, why: str = "") -> InvalidArgumentError:
        topic, queue_id, offset = key
        return InvalidArgumentError(
            f"message {topic}:{queue_id}@{offset} is not held by consumer {self.consumer_id}{why}",
            topic=topic,
            queue_id=queue_id,
            offset=offset,
        )

    def _claim_action(self, action: str, message: MessageExt, invisible_ms: int | None) -> None:
        self._check_open()
        key = _key_of(message)
        attempts = self._store.config.max_commit_attempts
        with self._lock:
            held = self._held.get(key)
            if held is None:
                raise self._not_held(key)
            for attempt in range(attempts):
                self._sync()
                claim = self._log.book.claim(key)
                ts = max(now_ms(), self._log.book.last_claim_ts + 1)
                lost = (
                    claim is None
                    or claim.consumer_id != self.consumer_id
                    or claim.sequence != held.sequence
                    or (action == CHANGE_INVISIBLE and ts >= claim.deadline_ms)
                )
                if lost:
                    if self._log.book.is_done(key) or (claim is not None and claim.sequence != held.sequence):
                        self._held.pop(key, None)
                    raise ConsumerError(
                        f"message {key[0]}:{key[1]}@{key[2]} is no longer held by {self.consumer_id}: "
                        "its invisible time ended (it may have been delivered again)",
                        topic=key[0],
                        queue_id=key[1],
                        offset=key[2],
                    )
                deadline = ts + invisible_ms if invisible_ms is not None else None
                row = self._log.row(
                    action, key, self._log.next_sequence(), ts, held.reconsume_times, deadline, held
                )
                if not self._log.commit([row]):
                    self.conflicts += 1
                    _backoff(attempt)
                    continue
                if action == NACK:
                    self._held.pop(key, None)
                elif deadline is not None:
                    held.deadline_ms = deadline
                return
            raise CommitConflictError(
                f"{action.lower()} lost {attempts} races for the action log in a row; retry later",
                table=schemas.ACTION_LOG,
                group=self.group,
            )

    # ----------------------------------------------------------------- the action log
    def _sync(self) -> None:
        """Bring the claim state up to the action log's latest version; forget held messages it
        shows finished."""
        if self._log.sync():
            for key in [k for k in self._held if self._log.book.is_done(k)]:
                del self._held[key]

    def _flush_acks(self) -> int:
        with self._lock:
            return self._log.flush_acks()

    def flush(self) -> int:
        """Append buffered acks now; returns how many were written."""
        return self._flush_acks()

    def persist_offsets(self) -> int:
        """Record, per queue, the offset below which every message is finished (acked, nacked or
        filtered out) in ``consumer_offset``: consumer-aware retention keeps what is above it, and
        tools show the group's progress. Done every ``OFFSET_PERSIST_MS`` and at :meth:`close`.

        Returns the queues recorded.
        """
        with self._lock:
            entries = [
                (topic, queue_id, book.floor)
                for (topic, queue_id), book in self._log.book.queues.items()
                if self._persisted.get((topic, queue_id)) != book.floor
            ]
            if entries:
                self._offsets.commit(entries)
                for topic, queue_id, floor in entries:
                    self._persisted[(topic, queue_id)] = floor
            self._persisted_at = time.monotonic()
            return len(entries)

    def _ensure_flusher(self) -> None:
        if self._flusher is None:
            with self._lock:
                if self._flusher is None and not self._closed:
                    self._flusher = threading.Thread(
                        target=self._run_flusher, name=f"mq-simple-{self.group}", daemon=True
                    )
                    self._flusher.start()

    def _flush_when_due(self) -> None:
        """Append buffered acks once the oldest is ``ack_linger_ms`` old, unless a claim commit of
        this consumer takes them along first (a busy consumer's acks then cost no commit of their own)."""
        while not self._closed:
            with self._lock:
                oldest = self._log.oldest_ack
            if oldest is None:
                return
            wait = oldest + self._ack_linger_s - time.monotonic()
            if wait <= 0:
                self._flush_acks()
                return
            time.sleep(wait)

    def _run_flusher(self) -> None:
        """Background: append buffered acks ``ack_linger_ms`` after the first one; persist offsets."""
        persist_s = OFFSET_PERSIST_MS / 1000
        while not self._closed:
            woken = self._wake.wait(persist_s)
            self._wake.clear()
            if self._closed:
                break
            try:
                if woken:
                    self._flush_when_due()
                if time.monotonic() - self._persisted_at >= persist_s:
                    self.persist_offsets()
            except Exception:  # acks stay buffered; the next round or close() retries them
                time.sleep(self._ack_linger_s)
                self._wake.set()

    # ----------------------------------------------------------------- lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise ProducerClosedError("consumer is closed", group=self.group)

    def close(self) -> None:
        """Append buffered acks and stop. Messages still held become visible at their deadlines."""
        if self._closed:
            return
        self._flush_acks()
        self._closed = True
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        self.persist_offsets()

    def __repr__(self) -> str:
        return f"SimpleConsumer(group={self.group!r}, consumer_id={self.consumer_id!r})"
