"""A ``SimpleConsumer``'s leases: what it leases, hands out, holds and gives back, kept in ``action_log``.

Lease protocol (QMQ's pull / ack / action log, with Delta as the broker; no lock service):

* Every action is a row of ``action_log`` for ``(group, consumer_id, sequence)``; the rules that
  evaluate them are the lease book's (:mod:`engine.protocol.lease_book`). One ``PULL`` row leases a
  range of a queue to one consumer until its deadline; acks travel as ``ACK`` ranges. Every row is
  written by the consumer's :class:`~engine.store.action_log.ActionLogWriter`.
* The group's lease frontier in a queue (the next offset never leased) is the Delta app transaction
  :func:`~engine.store.commit_markers.lease_app` of ``action_log``. Every commit that decides about
  the queue's leases (a fresh lease, a redelivery, ``CHANGE_INVISIBLE``, ``NACK``, ``EXPIRED``, a
  reset) carries it, so Delta's conflict check lets exactly one of two such commits on one queue
  land; the loser reads again and decides again. Commits for other queues and acks carry no such
  id and are rebased by Delta without a conflict: consumers of one group do not serialise on one
  log, only on one queue.
* A fresh lease needs nothing but the frontier (a table snapshot, no data read): the consumer
  leases ``[frontier, frontier + n)``; a group's first lease of a queue also records where the
  group starts (a ``RESET`` row: the committed offset, else RocketMQ's rule for new groups).
* Redelivery: leases that ended without an ack (found in the lease book, read from the log every
  :data:`SCAN_INTERVAL_MS`: one snapshot scan, then only the new versions) are leased again, with
  ``reconsume_times`` + 1; past the group's most deliveries an ``EXPIRED`` row hands the message
  to the retry job, which dead-letters it.
* Recovery: a consumer starting with an id that holds unexpired leases gets those messages back at
  once (QMQ: a consumer that pulls again with its id first gets what it did not ack).
* Resets: a queue reset by an administrator (:func:`~engine.store.action_log.reset_leases`) drops
  what this consumer leased of it before the reset landed (by action-log version: a ``RESET`` row
  also marks the group's first lease of a queue, and what others lease after it stays theirs).
* Hand-back: what was leased and never handed out is released (``RELEASE``, no delivery counted)
  when the consumer closes, when its process exits with the consumer open, or when it waited too
  long in the buffer; what was handed out and not acked comes back at its deadline. So a message
  is never out of the group's reach while no consumer holds it.
* Contention: a lease takes no more than a fair share of what is left among the group's consumers
  that lease (so none sits on a buffer while the others find nothing); a race lost on one queue
  moves on to the next, and the queues lost are tried again after a short jittered pause.
* Acks change no lease and are valid only before their lease's deadline (an expired receipt is
  refused), so they are buffered briefly and appended blindly, or ride along with the consumer's
  next lease commit.

FIFO groups (``fifo=True``; RocketMQ 5's orderly POP; the rule is the lease book's,
:meth:`~engine.protocol.lease_book.QueueBook.fifo_next`): a queue holds at most one outstanding
lease range; the next range is not leased until every message of the outstanding one is acked or
dead-lettered; an ended lease gives the SAME messages again, in queue order, to whoever receives
next (``reconsume_times`` + 1); past the most deliveries the head is dead-lettered (``EXPIRED``) and
the queue moves on. A FIFO lease takes exactly what the receive asks (no lease ahead into the
buffer), so a consumer's next receive of a queue gets nothing of it until the previous receive's
messages are finished; acks of a FIFO group are appended before ``ack`` returns, and a FIFO ``nack``
makes the message visible again at once in place (no retry topic: the next receive gets it again).
Every FIFO decision about a queue is made on the lease book read up to the version the commit is
based on, and carries the queue's lease app id, so two consumers never hold one queue at once (the
loser of a race reads again and decides again). Across a restart: a consumer back with its id gets
what it held at once (the head first); any other consumer gets the head when the holder's invisible
time ends.

Leased messages wait in a buffer until :meth:`Leases.take` hands them out; the lease size grows
while the buffer drains quickly (up to the fair share) and shrinks when leased messages wait too
long. :class:`Leases`
owns all of one consumer's lease state (the book, the buffer, what it holds, its writer). Not
thread-safe: the consumer calls it under its lock.
"""

from __future__ import annotations

import collections
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.client.offsets import ConsumeFrom, start_offset
from engine.errors import (
    CommitConflictError,
    InvalidArgumentError,
    InvalidReceiptHandleError,
    ReceiptHandleExpiredError,
    StoreError,
)
from engine.model import MessageExt
from engine.protocol import retry_topic
from engine.protocol.actions import ACK, EXPIRED, OFFLINE, PULL, RELEASE, RESET
from engine.protocol.lease_book import FIFO_AGAIN, FIFO_HELD, LeaseBook, ranges
from engine.protocol.names import PROPERTY_RETRY_TOPIC, RETRY_PREFIX
from engine.protocol.selectors import MessageSelector
from engine.store import schemas
from engine.store.action_log import ActionLogWriter
from engine.store.consume_queue import QueueIndex
from engine.store.consumer_offset import OffsetStore
from engine.store.delta import VERSION_COLUMN, backoff, read_versions
from engine.store.store import Store, now_ms, sql_literal

Key = tuple[str, int, int]  # topic, queue_id, queue_offset
Source = tuple[str, int, MessageSelector]  # topic, queue_id, the subscription's selector
MATCH_ALL = MessageSelector.by_tag("*")

LEASE_HOLD_MS = 1000  # a leased message may wait this long in the buffer and still get its full time
MAX_PREFETCH = 1024  # most messages one lease takes
PREFETCH_GROWTH = 4  # the lease size grows by this factor while the buffer drains quickly
SCAN_INTERVAL_MS = 1000  # how often the lease state is read for expired leases and resets
LEASE_ATTEMPTS = 8  # passes over the queues whose lease commits lost a race, in one lease()
# A receive whose lease commits all lost their races tries again for up to this long, even when it
# does not wait for new messages (wait_ms=0): there are messages, only contended.
CONTENTION_WAIT_MS = 50
# A consumer of the group that leased within this long shares what is left of a queue (fair share).
ACTIVE_WINDOW_MS = 10_000
ACK_FLUSH_ROWS = 256  # buffered acks that are flushed at once
ACK_DEADLINE_MARGIN_MS = 1000  # acks whose lease ends sooner than this (plus the linger) go at once


@dataclass
class Held:
    """A message this consumer handed to its user and that is not acked or nacked yet."""

    sequence: int  # the lease's (the receipt handle's) action sequence
    deadline_ms: int
    reconsume_times: int
    msg_id: str
    physical_offset: int
    version: int  # the action-log version the lease landed at (a reset after it drops it)
    handles: set[str] = field(default_factory=set)  # every receipt handle of this delivery


@dataclass(frozen=True)
class ReceivedMessage(MessageExt):
    """A message returned by :meth:`SimpleConsumer.receive`: a :class:`MessageExt` with its lease.

    ``receipt_handle`` names the lease (consumer id and action sequence); ``invisible_until_ms`` is
    when the message becomes visible to the group again unless acked or extended.
    """

    receipt_handle: str = ""
    invisible_until_ms: int = 0


def received_message(
    message: MessageExt, reconsume_times: int, receipt_handle: str, until_ms: int
) -> ReceivedMessage:
    """``message`` as handed to the consumer that leased it: its delivery count and its lease."""
    # A copy of the frozen dataclass's fields, without __init__ (one per message received: the
    # keyword call cost more than the rest of a receive from the buffer).
    out = object.__new__(ReceivedMessage)
    fields_of = out.__dict__
    fields_of.update(message.__dict__)
    fields_of.update(
        reconsume_times=reconsume_times, receipt_handle=receipt_handle, invisible_until_ms=until_ms
    )
    return out


@dataclass
class Leased:
    """A leased message waiting in the buffer."""

    message: MessageExt
    sequence: int
    deadline_ms: int
    reconsume_times: int
    version: int  # the action-log version the lease landed at (a reset after it drops it)
    recovered: bool = False
    leased_at: float = 0.0  # monotonic


def _rotated(items: list[Any], turn: int) -> list[Any]:
    """``items`` starting at ``turn`` (modulo their number): consumers of a group start apart."""
    if not items:
        return items
    start = turn % len(items)
    return items[start:] + items[:start]


def _contention_until(deadline: float | None) -> float:
    """How long (monotonic) a lease keeps trying queues lost to races: :data:`CONTENTION_WAIT_MS`
    from now, or the receive's own ``deadline`` when that is later."""
    until = time.monotonic() + CONTENTION_WAIT_MS / 1000
    return until if deadline is None else max(until, deadline)


def _pause_after_lost(until: float, attempt: int) -> bool:
    """After a pass whose lease commits all lost their races: False when the time is up (answer
    with what there is; the caller's next receive tries again), else True after a jittered, growing
    pause (so that the racers do not meet again in step)."""
    left = until - time.monotonic()
    if left <= 0 and attempt > 0:
        return False
    time.sleep(max(0.0, min(left, random.uniform(0, 0.001 * 2 ** min(attempt + 1, 5)))))
    return True


def topic_of(message: MessageExt) -> str:
    """The topic a received message is of: its own, or for a message of a group's retry topic the
    topic it was first sent to."""
    if message.topic.startswith(RETRY_PREFIX):
        return message.properties.get(PROPERTY_RETRY_TOPIC) or message.topic
    return message.topic


def receive_sources(store: Store, group: str, subscriptions: dict[str, MessageSelector]) -> list[Source]:
    """Every (topic, queue, filter) to receive from: the subscriptions and the group's retry topic."""
    configs = store.topic_configs(refresh=True)
    subscribed = dict(subscriptions)
    retry = retry_topic(group)
    if retry in configs and retry not in subscribed:
        subscribed[retry] = MATCH_ALL
    sources: list[Source] = []
    for topic, tag_filter in subscribed.items():
        config = configs.get(topic)
        if config is None:
            continue  # deleted since subscribe
        sources.extend((topic, q, tag_filter) for q in range(config.queues))
    return sources


class Leases:
    """All of one consumer's lease state (module docstring): the group's lease book as of the action
    log's latest version read, the buffer of leased messages, the messages handed out and not yet
    acked, and the consumer's writes to the log.

    Args:
        store: the store.
        group: the consumer group.
        consumer_id: this consumer's id (stamped on every row it writes).
        consume_from: where the group starts a queue it has no position in.
        consume_from_timestamp_ms: the time for ``ConsumeFrom.TIMESTAMP``.
        max_reconsume: deliveries allowed for a message (its properties) before it is dead-lettered.
        fifo: the group is a FIFO group (module docstring).
    """

    def __init__(
        self,
        store: Store,
        group: str,
        consumer_id: str,
        consume_from: ConsumeFrom,
        consume_from_timestamp_ms: int,
        max_reconsume: Callable[[MessageExt], int],
        *,
        fifo: bool = False,
    ) -> None:
        self.group = group
        self.fifo = fifo
        # A commit landed past other commits the book has not read: the writer's handle is ahead
        # of the book, so a FIFO decision reads the log again first.
        self._stale = False
        self.consumer_id = consumer_id
        self._store = store
        self._writer = ActionLogWriter(store, group, consumer_id)
        self._book = LeaseBook(group)
        self._version = -1  # the action log's version the book is at (-1: not read yet)
        # Queues reset by others, seen by _sync(): the version of the latest reset of each.
        self._resets: dict[tuple[str, int], int] = {}
        self._index = QueueIndex(store)
        self._consume_from = consume_from
        self._timestamp_ms = consume_from_timestamp_ms
        self._max_reconsume = max_reconsume
        self._held: dict[Key, Held] = {}
        self._buffer: collections.deque[Leased] = collections.deque()
        self.prefetch = 1
        self._drained_since: float | None = None  # monotonic time the last lease was taken
        self._last_lease = 0  # messages the last lease buffered
        self._scanned_at: float | None = None  # monotonic; None: never
        self._expired: dict[tuple[str, int], list[int]] = {}
        self._committed: dict[tuple[str, int], int] | None = None
        self._rotation = zlib.crc32(consumer_id.encode())
        # The routes every queue of which was found leased to its end (until the consume queue
        # moves or the next scan): receives do not try them again meanwhile.
        self._dry: list[tuple[str, int]] | None = None
        # A FIFO group's: the routes whose every queue had nothing to lease, and this consumer's
        # writes then (its own ack or lease frees a queue at once, not at the next scan).
        self._fifo_dry: tuple[list[tuple[str, int]], int] | None = None
        self._writes = 0  # commits of this consumer's rows (leases, decisions, acks)
        self.conflicts = 0  # lease commits that lost a race with another consumer of the same queue

    @property
    def unacked(self) -> int:
        """Messages handed out and not yet acked, nacked or expired."""
        return len(self._held)

    @property
    def waiting(self) -> int:
        """Leased messages waiting in the buffer to be handed out."""
        return len(self._buffer)

    # ----------------------------------------------------------------- reading the log
    def _sync(self) -> None:
        """Bring the lease book up to the action log's latest version; queues other writers reset in
        the versions read accumulate until :meth:`maintain` takes them."""
        version = self._writer.latest_version()
        if self._version < 0:
            snapshot = self._store.dataset(
                schemas.ACTION_LOG, f"group = {sql_literal(self.group)}", version=version
            ).to_table()
            snapshot = snapshot.filter(pc.equal(snapshot["group"], self.group))
            self._book.bootstrap(snapshot.to_pylist())
            self._version = version
            self._writer.known_sequence(self._book.sequences.get(self.consumer_id, -1))
            self._stale = False
            return
        self._stale = False
        if version <= self._version:
            return
        try:
            rows = read_versions(
                self._store.uri(schemas.ACTION_LOG),
                self._version + 1,
                version,
                schemas.ACTION_LOG_SCHEMA,
                self._store.storage_options,
            )
        except StoreError:
            # The log files we need are gone (log cleanup): rebuild the book from a snapshot.
            self._book = LeaseBook(self.group)
            self._version = -1
            self._sync()
            return
        if rows.num_rows:
            mine = rows.filter(pc.equal(rows["group"], self.group)).to_pylist()
            self._book.apply(mine)
            # Rows of this id written elsewhere (a process started again with it) move it on too.
            self._writer.known_sequence(self._book.sequences.get(self.consumer_id, -1))
            for r in mine:
                if r["action"] == RESET and r["consumer_id"] != self.consumer_id:
                    queue = (r["topic"], int(r["queue_id"]))
                    self._resets[queue] = max(int(r[VERSION_COLUMN]), self._resets.get(queue, -1))
        self._version = version

    def _commit(self, rows: list[dict[str, Any]], topic: str, queue_id: int, frontier: int) -> int:
        """Commit rows deciding about a queue's leases (with the buffered acks) at ``frontier``; the
        book applies them at once when nothing else landed since it was read. Returns the version.

        Raises:
            CommitConflictError: another commit about the same queue landed first (read again).
            StoreError: the write failed; nothing was committed.
        """
        version, committed = self._writer.commit_lease(rows, topic, queue_id, frontier)
        self._writes += 1
        if version == self._version + 1:
            self._book.apply(committed)
            self._version = version
        else:
            self._stale = True
        return version

    def floors(self) -> dict[tuple[str, int], int]:
        """Per queue of the book (read anew once it was read at all), the offset below which every
        message is finished (acked, nacked or filtered out)."""
        if self._version >= 0:
            self._sync()
        return {key: book.floor for key, book in self._book.queues.items()}

    # ----------------------------------------------------------------- state
    def start(self) -> None:
        """Read the lease state once and take back the messages this consumer id still holds."""
        if self._version >= 0:
            return
        self._sync()
        now = now_ms()
        recovered: list[Leased] = []
        for (topic, queue_id), book in self._book.queues.items():
            mine = [
                (o, c)
                for o, c in book.held_by(self.consumer_id, now)
                if (topic, queue_id, o) not in self._held
            ]
            if not mine:
                continue
            self._index.refresh()
            leases = dict(mine)
            messages, _ = self._read(topic, queue_id, list(leases), MATCH_ALL)
            for offset, message in messages:
                lease = leases[offset]
                reconsume = message.reconsume_times + lease.deliveries - 1
                recovered.append(
                    Leased(message, lease.sequence, lease.deadline_ms, reconsume, self._version, True)
                )
        self._buffer.extendleft(reversed(recovered))

    def maintain(self, sources: Callable[[], list[Source]]) -> None:
        """Every :data:`SCAN_INTERVAL_MS`: read the new lease state, drop what an administrator reset,
        forget held messages whose lease ended, and note the expired leases of ``sources()`` (asked
        for only then) for redelivery."""
        due = self._scanned_at is None or time.monotonic() - self._scanned_at >= SCAN_INTERVAL_MS / 1000
        if not due:
            return
        self._sync()
        reset, self._resets = self._resets, {}
        self._scanned_at = time.monotonic()
        self._dry = None
        self._fifo_dry = None
        now = now_ms()
        held = self._held
        for key in [k for k, h in held.items() if h.deadline_ms <= now]:
            del held[key]  # expired: no longer counts against max_unacked
        if reset:
            # Only what was leased before the reset landed: a group's first lease of a queue
            # records where it starts with a RESET too, and leases after that one are valid.
            self._buffer = collections.deque(
                x for x in self._buffer if x.version >= reset.get((x.message.topic, x.message.queue_id), -1)
            )
            for key in [k for k, h in held.items() if h.version < reset.get((k[0], k[1]), -1)]:
                del held[key]
        self._index.refresh()
        self._expired = {}
        for topic, queue_id, _ in sources():
            book = self._book.queues.get((topic, queue_id))
            if book is None:
                continue
            book.raise_floor(self._index.bounds(topic, queue_id)[0])
            expired = book.expired(now)
            if expired:
                self._expired[(topic, queue_id)] = expired[:MAX_PREFETCH]

    # ----------------------------------------------------------------- handing out
    def take(
        self, n: int, invisible_ms: int, *, leased_since: float | None = None, topic: str | None = None
    ) -> list[ReceivedMessage]:
        """Up to ``n`` buffered messages with about ``invisible_ms`` of their lease left (less at
        most LEASE_HOLD_MS or half of it; a recovered one: any time left), now held; the others are
        released to the group. Messages leased at or after ``leased_since`` (monotonic) were leased
        for this very request and go out with any time left. With ``topic``, only messages of that
        topic (:func:`topic_of`) go out; the others stay buffered for a receive of theirs (those
        waiting longer than LEASE_HOLD_MS are released)."""
        now = now_ms()
        out: list[ReceivedMessage] = []
        held = self._held
        enough = invisible_ms - min(LEASE_HOLD_MS, invisible_ms // 2)
        others: list[Leased] = []
        while self._buffer and len(out) < n:
            item = self._buffer.popleft()
            m = item.message
            if topic is not None and topic_of(m) != topic:
                if item.recovered or time.monotonic() - item.leased_at < LEASE_HOLD_MS / 1000:
                    others.append(item)
                elif item.deadline_ms > now:
                    self._writer.buffer_ack(
                        RELEASE, m.topic, m.queue_id, m.queue_offset, item.deadline_ms, now
                    )
                continue
            key = (m.topic, m.queue_id, m.queue_offset)
            if key in held and held[key].sequence == item.sequence:
                continue  # recovered, and handed out already
            left = item.deadline_ms - now
            just_leased = leased_since is not None and item.leased_at >= leased_since
            if left < (1 if item.recovered or just_leased else enough):
                if not item.recovered and left > 0:
                    self._writer.buffer_ack(
                        RELEASE, m.topic, m.queue_id, m.queue_offset, item.deadline_ms, now
                    )
                    self.prefetch = max(1, self.prefetch // 2)
                continue
            handle = f"{self.consumer_id}#{item.sequence}"
            held[key] = Held(
                item.sequence,
                item.deadline_ms,
                item.reconsume_times,
                m.msg_id,
                m.physical_offset,
                item.version,
                {handle},
            )
            out.append(received_message(m, item.reconsume_times, handle, item.deadline_ms))
        self._buffer.extendleft(reversed(others))
        if not self._buffer and self._drained_since is not None:
            if time.monotonic() - self._drained_since < LEASE_HOLD_MS / 2000:
                # From what the last lease took (a receive's worth at first, not the prefetch of
                # 1): a consumer reaches full leases in a few commits, not a dozen.
                self.prefetch = min(MAX_PREFETCH, max(self.prefetch, self._last_lease) * PREFETCH_GROWTH)
            self._drained_since = None
        return out

    def release_all(self) -> None:
        """Give every buffered (never handed out) message back to the group."""
        now = now_ms()
        while self._buffer:
            item = self._buffer.popleft()
            m = item.message
            if item.deadline_ms > now and not item.recovered:
                self._writer.buffer_ack(RELEASE, m.topic, m.queue_id, m.queue_offset, item.deadline_ms, now)

    # ----------------------------------------------------------------- leasing
    def lease(
        self, sources: list[Source], n: int, invisible_ms: int, *, deadline: float | None = None
    ) -> int:
        """Lease at least ``n`` messages if there are (up to the prefetch size, and no more than a
        fair share of what is left when other consumers of the group lease too): expired leases
        first, then fresh ones; returns how many were buffered.

        A race lost on one queue moves on to the next at once; the queues lost are tried again, on
        a fresh frontier, only once every queue was tried and nothing was leased, after a jittered,
        growing pause (so that the racers do not meet again in step): at least once, then for up
        to :data:`LEASE_ATTEMPTS` passes until ``deadline`` (monotonic) or, when that is sooner,
        :data:`CONTENTION_WAIT_MS` from now: messages are there, only contended, so even a
        receive that does not wait for new ones waits that long for them.
        When every queue was found leased to its end and the consume queue has not moved since,
        nothing is tried until the next scan (:data:`SCAN_INTERVAL_MS`), so an idle consumer's
        receives cost next to nothing.
        """
        if not sources:
            return 0
        if self.fifo:
            return self._lease_fifo(sources, n, invisible_ms, deadline)
        filters = {(t, q): f for t, q, f in sources}
        expired = [k for k in self._expired if k in filters]
        routes = [(t, q) for t, q, _ in sources]
        if self._index.refresh() or self._dry != routes:
            self._dry = None
        if self._dry is not None and not expired:
            return 0
        # The book as of now: who else leases (the fair share) and how far (the backlog). Each
        # version is read once whenever it is read, so this costs little more than the scan would.
        self._sync()
        want = max(n, min(self.prefetch, MAX_PREFETCH, self._fair_share(sources)))
        # Fresh leases start at the queue this consumer leased from last, and stay there while
        # it serves: consumers of a group that race for one queue move apart, each to a queue of
        # its own, instead of meeting again on every lease.
        turn = self._rotation
        self._rotation += 1
        tasks: list[tuple[bool, Source, int]] = [
            (True, (t, q, filters[(t, q)]), 0) for t, q in _rotated(expired, turn)
        ]
        if self._dry is None:
            tasks += [(False, s, turn + j) for j, s in enumerate(_rotated(sources, turn))]
        total = 0
        dry = self._dry is None
        until = _contention_until(deadline)
        for attempt in range(LEASE_ATTEMPTS):
            lost: list[tuple[bool, Source, int]] = []
            for i, (again, (topic, queue_id, selector), position) in enumerate(tasks):
                if again:
                    got = self._redeliver(topic, queue_id, selector, want - total, invisible_ms, n)
                else:
                    # The frontiers as of the _sync() above, then fresh ones for the queues lost
                    # (a stale frontier costs a lost race, never a wrong lease).
                    fresh = attempt > 0 and i == 0
                    got = self._lease_fresh(topic, queue_id, selector, want - total, invisible_ms, n, fresh)
                    dry = dry and got == 0
                    if got:
                        self._rotation = position
                if got is None:
                    lost.append((again, (topic, queue_id, selector), position))
                    continue
                total += got
                if total >= n:
                    return total
            if not lost or total > 0:
                break
            tasks = lost
            if not _pause_after_lost(until, attempt):
                break
        if dry and total == 0:
            self._dry = routes
        return total

    def _lease_fifo(self, sources: list[Source], n: int, invisible_ms: int, deadline: float | None) -> int:
        """:meth:`lease` for a FIFO group: per queue, the outstanding range again when it is free,
        else a fresh range when nothing is outstanding, else nothing (module docstring); exactly
        ``n`` messages at most. Queues lost to a race are tried again on a fresh read of the log.

        As :meth:`lease`'s "nothing new" shortcut: when the last pass found nothing to lease in
        any queue, and neither the consume queue nor this consumer's own writes moved since, the
        action log is not read again until the next scan (:data:`SCAN_INTERVAL_MS`): an idle FIFO
        consumer's long poll costs a look at the consume queue, not one at the log every pass. A
        queue another consumer's ack frees is seen by that scan."""
        routes = [(t, q) for t, q, _ in sources]
        moved = self._index.refresh()
        if not moved and self._fifo_dry == (routes, self._writes):
            return 0
        self._fifo_dry = None
        self._sync()
        turn = self._rotation
        self._rotation += 1
        tasks = _rotated(sources, turn)
        total = 0
        until = _contention_until(deadline)
        for attempt in range(LEASE_ATTEMPTS):
            lost: list[Source] = []
            for topic, queue_id, selector in tasks:
                if self._stale:
                    self._sync()
                got = self._lease_fifo_queue(topic, queue_id, selector, n - total, invisible_ms)
                if got is None:
                    lost.append((topic, queue_id, selector))
                    continue
                total += got
                if total >= n:
                    return total
            if not lost and total == 0:
                self._fifo_dry = (routes, self._writes)
            if not lost or total > 0:
                break
            tasks = lost
            if not _pause_after_lost(until, attempt):
                break
            self._sync()
        return total

    def _lease_fifo_queue(
        self, topic: str, queue_id: int, selector: MessageSelector, size: int, invisible_ms: int
    ) -> int | None:
        """One FIFO lease decision about a queue, on the book as of the version the commit is
        based on; how many were buffered, or None when another commit about the queue landed first."""
        book = self._book.queues.get((topic, queue_id))
        if book is not None:
            state, again = book.fifo_next(now_ms())
            if state == FIFO_HELD:
                return 0
            if state == FIFO_AGAIN:
                return self._redeliver(topic, queue_id, selector, size, invisible_ms, size, again)
        return self._lease_fresh(topic, queue_id, selector, size, invisible_ms, size, False)

    @staticmethod
    def _deadline(ts: int, invisible_ms: int, size: int, needed: int) -> int:
        """A lease taking more than is needed now lets the rest wait up to LEASE_HOLD_MS in the buffer."""
        return ts + invisible_ms + (LEASE_HOLD_MS if size > needed else 0)

    def _first_offset(self, topic: str, queue_id: int) -> int:
        if self._committed is None:
            self._committed = OffsetStore(self._store, self.group).read()
        committed = self._committed.get((topic, queue_id))
        if committed is not None:
            return committed
        if topic.startswith("%RETRY%"):
            return self._index.bounds(topic, queue_id)[0]  # a group's retries are never skipped
        return start_offset(
            self._index,
            topic,
            queue_id,
            self._consume_from,
            timestamp_ms=self._timestamp_ms,
            store=self._store,
            pop=True,
        )

    def _read(
        self, topic: str, queue_id: int, offsets: list[int], selector: MessageSelector
    ) -> tuple[list[tuple[int, MessageExt]], list[int]]:
        """The messages at ``offsets`` (ascending) of a queue that ``selector`` matches, as (offset,
        message) in queue order, and the offsets it does not match (consumed by filtering). Offsets
        with no entry (removed by retention meanwhile) are in neither list."""
        if not offsets:
            return [], []
        entries = self._index.entries(topic, queue_id, offsets[0], offsets[-1] + 1)
        if entries.num_rows != len(offsets):
            entries = entries.filter(pc.is_in(entries["queue_offset"], pa.array(offsets, pa.int64())))
        return self._read_entries(entries, selector)

    def _read_entries(
        self, entries: pa.Table, selector: MessageSelector
    ) -> tuple[list[tuple[int, MessageExt]], list[int]]:
        """The messages of consume-queue ``entries`` that ``selector`` matches, as (offset, message)
        in queue order, and the offsets of the entries it does not match."""
        rows, _ = self._index.select(entries, selector)
        offset_of = dict(
            zip(entries["physical_offset"].to_pylist(), entries["queue_offset"].to_pylist(), strict=True)
        )
        matched = [
            (offset_of[int(row["physical_offset"])], MessageExt.from_row(row)) for row in rows.to_pylist()
        ]
        taken = {offset for offset, _ in matched}
        return matched, [o for o in entries["queue_offset"].to_pylist() if o not in taken]

    def _fair_share(self, sources: list[Source]) -> int:
        """This consumer's share of what is left to lease in ``sources`` (unleased and expired, as
        of the book) among the group's consumers that lease now: a lease takes no more, so that
        no consumer sits on a buffer while the others find nothing."""
        left = 0
        for topic, queue_id, _ in sources:
            low, high = self._index.bounds(topic, queue_id)
            book = self._book.queues.get((topic, queue_id))
            left += max(0, high - max(low, book.frontier if book is not None else 0))
            left += len(self._expired.get((topic, queue_id), ()))
        active = self._book.active(now_ms() - ACTIVE_WINDOW_MS) | {self.consumer_id}
        return -(-left // len(active))

    def _lease_fresh(
        self,
        topic: str,
        queue_id: int,
        selector: MessageSelector,
        size: int,
        invisible_ms: int,
        needed: int,
        refresh: bool,
    ) -> int | None:
        """One lease commit of a queue's messages past the group's frontier; how many were buffered
        (0: none left), or None when another consumer's commit about the queue landed first."""
        writer = self._writer
        low, high = self._index.bounds(topic, queue_id)
        ts = now_ms()
        start, rows = writer.lease_start(
            topic, queue_id, low, lambda: self._first_offset(topic, queue_id), ts=ts, refresh=refresh
        )
        if start >= high:
            if rows:  # record where the group starts, so that it does not move on
                try:
                    self._commit(rows, topic, queue_id, start)
                except CommitConflictError:
                    self.conflicts += 1
            return 0
        end = min(high, start + size)
        entries = self._index.entries(topic, queue_id, start, end)
        # The tags-code stage before the commit: entries not for this subscription are acked by
        # the lease commit itself; the rest of the selector runs on the messages after it.
        codes = selector.match_codes(entries["tags_code"])
        passing = entries.filter(codes)
        filtered = entries.filter(pc.invert(codes))["queue_offset"].to_pylist()
        deadline = self._deadline(ts, invisible_ms, end - start, needed)
        sequence = writer.next_sequence()
        rows.append(
            writer.row(PULL, topic, queue_id, start, end=end, deadline_ms=deadline, ts=ts, sequence=sequence)
        )
        rows.extend(writer.row(ACK, topic, queue_id, s, end=e, ts=ts) for s, e in ranges(filtered))
        try:
            version = self._commit(rows, topic, queue_id, end)
        except CommitConflictError:
            self.conflicts += 1
            return None
        return self._buffer_leased(topic, queue_id, passing, selector, sequence, deadline, version)

    def _redeliver(
        self,
        topic: str,
        queue_id: int,
        selector: MessageSelector,
        size: int,
        invisible_ms: int,
        needed: int,
        fifo_offsets: list[int] | None = None,
    ) -> int | None:
        """One lease commit of a queue's expired leases noted by the last scan (a FIFO group:
        ``fifo_offsets``, the queue's outstanding range as the book had it, checked again here);
        how many were buffered (0: none left), or None when another consumer's commit about the
        queue landed first. Those not taken this time stay noted for the next receive."""
        writer = self._writer
        key = (topic, queue_id)
        # Decide from the state as of the snapshot the commit is based on: a lease of these
        # offsets committed by anyone after it makes the commit conflict (same queue app id).
        if fifo_offsets is None or self._stale:
            self._sync()
        book = self._book.queue(topic, queue_id)
        now = now_ms()
        if fifo_offsets is not None:
            state, free = book.fifo_next(now)
            if state != FIFO_AGAIN:
                return 0
        else:
            free = [o for o in self._expired.get(key, []) if book.available(o, now) and o in book.leases]
        offsets = free[:size]
        if not offsets:
            self._expired.pop(key, None)
            return 0
        messages, unmatched = self._read(topic, queue_id, offsets, selector)
        deadline = self._deadline(now, invisible_ms, len(offsets), needed)
        rows = [writer.row(ACK, topic, queue_id, s, end=e, ts=now) for s, e in ranges(unmatched)]
        counts: dict[int, int] = {}
        kept: list[tuple[int, MessageExt]] = []
        for offset, message in messages:
            reconsume = message.reconsume_times + book.leases[offset].deliveries
            if reconsume > self._max_reconsume(message):
                rows.append(
                    writer.row(
                        EXPIRED,
                        topic,
                        queue_id,
                        offset,
                        physical_offset=message.physical_offset,
                        msg_id=message.msg_id,
                        reconsume_times=reconsume - 1,
                        ts=now,
                    )
                )
                continue
            counts[offset] = reconsume
            kept.append((offset, message))
        sequences = {}
        for s, e in ranges(list(counts)):
            sequence = writer.next_sequence()
            rows.append(
                writer.row(
                    PULL,
                    topic,
                    queue_id,
                    s,
                    end=e,
                    reconsume_times=counts[s],
                    deadline_ms=deadline,
                    ts=now,
                    sequence=sequence,
                )
            )
            sequences.update(dict.fromkeys(range(s, e), sequence))
        if rows:
            try:
                version = self._commit(rows, topic, queue_id, writer.frontier(topic, queue_id, refresh=False))
            except CommitConflictError:
                self.conflicts += 1
                return None
            self._last_lease = len(kept)
            for offset, message in kept:
                self._buffer.append(
                    Leased(
                        message, sequences[offset], deadline, counts[offset], version, False, time.monotonic()
                    )
                )
        rest = free[len(offsets) :]
        if rest and fifo_offsets is None:  # a FIFO queue's range is read from the book each time
            self._expired[key] = rest
        else:
            self._expired.pop(key, None)
        self._drained_since = time.monotonic()
        return len(kept)

    def _buffer_leased(
        self,
        topic: str,
        queue_id: int,
        entries: pa.Table,
        selector: MessageSelector,
        sequence: int,
        deadline: int,
        version: int,
    ) -> int:
        """Buffer the messages of a lease just committed at ``version`` (``entries`` passed the
        tags-code stage); those the rest of the selector does not match are acked: consumed by
        filtering. If they cannot be read, the lease is given back (released) before the error
        goes on: a lease nobody can hand out would hide its messages until its deadline."""
        now = now_ms()
        try:
            messages, unmatched = self._read_entries(entries, selector)
        except BaseException:
            for offset in entries["queue_offset"].to_pylist():
                self._writer.buffer_ack(RELEASE, topic, queue_id, offset, deadline, now)
            raise
        for offset in unmatched:
            self._writer.buffer_ack(ACK, topic, queue_id, offset, deadline, now)
        self._last_lease = len(messages)
        for _, message in messages:
            self._buffer.append(
                Leased(message, sequence, deadline, message.reconsume_times, version, False, time.monotonic())
            )
        self._drained_since = time.monotonic()
        return len(messages)

    # ----------------------------------------------------------------- what the user holds
    def held(self, message: object) -> tuple[Key, Held]:
        """The delivery a received message names, checked against its receipt handle and deadline.

        Raises:
            InvalidArgumentError: not a message.
            InvalidReceiptHandleError: not a message this consumer holds.
            ReceiptHandleExpiredError: its invisible time has passed (it is forgotten).
        """
        if not isinstance(message, MessageExt):
            raise InvalidArgumentError(
                f"expected a message returned by receive(), got {type(message).__name__}"
            )
        if not isinstance(message, ReceivedMessage):
            raise InvalidReceiptHandleError(
                f"a {type(message).__name__} carries no receipt handle: it is not held by consumer "
                f"{self.consumer_id} (ack, nack and change_invisible_time take messages from receive())"
            )
        key = (message.topic, message.queue_id, message.queue_offset)
        where = f"{key[0]}:{key[1]}@{key[2]}"
        held = self._held.get(key)
        if held is None or message.receipt_handle not in held.handles:
            raise InvalidReceiptHandleError(
                f"receipt handle {message.receipt_handle!r} of message {where} is not held by consumer "
                f"{self.consumer_id}: it was not received here, was already acked or nacked, or was "
                "delivered again",
                topic=key[0],
                queue_id=key[1],
                offset=key[2],
            )
        if now_ms() >= held.deadline_ms:
            del self._held[key]
            raise ReceiptHandleExpiredError(
                f"receipt handle {message.receipt_handle!r} of message {where} expired at "
                f"{held.deadline_ms}: its invisible time ended (it may be delivered again)",
                topic=key[0],
                queue_id=key[1],
                offset=key[2],
            )
        return key, held

    def adopt(self, topic: str, queue_id: int, offset: int, handle: str) -> ReceivedMessage:
        """Hold a delivery this consumer id got through another process with the same id (a client
        that reconnected elsewhere): the message at ``offset`` as of the action log, held under
        ``handle`` when that is the live lease of this id on it.

        Raises:
            InvalidReceiptHandleError: not a handle of this id, or its lease ended, was superseded
                (delivered again, or changed under a newer handle) or the message is finished.
        """
        key = (topic, queue_id, offset)
        where = f"{topic}:{queue_id}@{offset}"
        owner, _, number = handle.rpartition("#")
        if owner != self.consumer_id or not number.isdigit():
            raise InvalidReceiptHandleError(
                f"receipt handle {handle!r} is not one of consumer {self.consumer_id}",
                topic=topic,
                queue_id=queue_id,
                offset=offset,
            )
        sequence = int(number)
        self.start()
        if self._writer.buffered_acks:  # an ack of it buffered here finishes it
            self.flush()
        self._sync()
        lease = self._book.lease(key)
        now = now_ms()
        if (
            lease is None
            or lease.consumer_id != self.consumer_id
            or lease.sequence != sequence
            or now >= lease.deadline_ms
            or self._book.is_done(key)
        ):
            raise InvalidReceiptHandleError(
                f"receipt handle {handle!r} of message {where} is not the live lease of consumer "
                f"{self.consumer_id}: its invisible time ended, it was delivered again or changed, "
                "or the message was acked",
                topic=topic,
                queue_id=queue_id,
                offset=offset,
            )
        self._index.refresh()
        messages, _ = self._read(topic, queue_id, [offset], MATCH_ALL)
        if not messages:
            raise InvalidReceiptHandleError(f"message {where} is gone", topic=topic, queue_id=queue_id)
        message = messages[0][1]
        reconsume = message.reconsume_times + lease.deliveries - 1
        held = self._held.get(key)
        if held is None or held.sequence != sequence:
            held = self._held[key] = Held(
                sequence,
                lease.deadline_ms,
                reconsume,
                message.msg_id,
                message.physical_offset,
                self._version,
                set(),
            )
        held.handles.add(handle)
        return received_message(message, held.reconsume_times, handle, held.deadline_ms)

    def ack(self, message: ReceivedMessage, attempts: int) -> None:
        """Acknowledge a held message: buffered, or committed at once less than a second before its
        deadline (under the queue's lease lock, so an ack never lands after another consumer's lease
        of the same message).

        Raises:
            InvalidReceiptHandleError, ReceiptHandleExpiredError: see :meth:`held`.
            CommitConflictError: a commit at once lost ``attempts`` races.
        """
        key, held = self.held(message)
        if held.deadline_ms - now_ms() < ACK_DEADLINE_MARGIN_MS:
            self.decide(ACK, message, None, attempts)
            return
        del self._held[key]
        self._writer.buffer_ack(ACK, key[0], key[1], key[2], held.deadline_ms, now_ms())

    def forget(self, message: ReceivedMessage) -> None:
        """Stop holding a received message (a FIFO nack made it visible again)."""
        self._held.pop((message.topic, message.queue_id, message.queue_offset), None)

    def decide(
        self,
        action: str,
        message: ReceivedMessage,
        invisible_ms: int | None,
        attempts: int,
        *,
        reconsume_times: int | None = None,
    ) -> ReceivedMessage | None:
        """Commit the holder's ``action`` about a held message (``ACK``, ``NACK``, or
        ``CHANGE_INVISIBLE`` to ``invisible_ms`` from now) under the queue's lease lock.

        Returns:
            For ``CHANGE_INVISIBLE``, the message with its new receipt handle (the old one stays
            valid); else None (the message is no longer held).

        Raises:
            InvalidReceiptHandleError, ReceiptHandleExpiredError: see :meth:`held`; also when the
                lease ended meanwhile.
            CommitConflictError: lost ``attempts`` races for the action log in a row.

        ``reconsume_times`` replaces the delivery count the row records (a count past the group's
        most deliveries makes the retry job dead-letter a ``NACK`` at once).
        """
        key, held = self.held(message)
        topic, queue_id, offset = key
        writer = self._writer
        for attempt in range(attempts):
            self._sync()
            lease = self._book.lease(key)
            ts = now_ms()
            if (
                lease is None
                or lease.consumer_id != self.consumer_id
                or lease.sequence != held.sequence
                or ts >= lease.deadline_ms
                or self._book.is_done(key)
            ):
                self._held.pop(key, None)
                raise ReceiptHandleExpiredError(
                    f"message {topic}:{queue_id}@{offset} is no longer held by {self.consumer_id}: "
                    "its invisible time ended (it may have been delivered again)",
                    topic=topic,
                    queue_id=queue_id,
                    offset=offset,
                )
            deadline = ts + invisible_ms if invisible_ms is not None else None
            sequence = writer.next_sequence()
            row = writer.row(
                action,
                topic,
                queue_id,
                offset,
                physical_offset=held.physical_offset,
                msg_id=held.msg_id,
                reconsume_times=held.reconsume_times if reconsume_times is None else reconsume_times,
                deadline_ms=deadline,
                ts=ts,
                sequence=sequence,
            )
            try:
                self._commit([row], topic, queue_id, writer.frontier(topic, queue_id, refresh=False))
            except CommitConflictError:
                backoff(attempt)
                continue
            if deadline is None:
                self._held.pop(key, None)
                return None
            handle = f"{self.consumer_id}#{sequence}"
            held.sequence, held.deadline_ms = sequence, deadline
            held.handles.add(handle)
            return received_message(message, held.reconsume_times, handle, deadline)
        raise CommitConflictError(
            f"{action.lower()} lost {attempts} races for the action log in a row; retry later",
            table=schemas.ACTION_LOG,
            group=self.group,
        )

    # ----------------------------------------------------------------- acks
    @property
    def buffered_acks(self) -> int:
        """Acks and releases waiting to be appended."""
        return self._writer.buffered_acks

    @property
    def ack_batch(self) -> float | None:
        """Names the batch of buffered acks and releases (when its first was buffered; None: none
        is buffered): a new value means a new batch began since the last flush."""
        return self._writer.oldest_ack

    def ack_flush_due_in(self, linger_s: float) -> float | None:
        """Seconds until the buffered acks are due (0: now; None: nothing buffered): after
        ``linger_s``, at :data:`ACK_FLUSH_ROWS`, or a margin before the earliest lease they end."""
        oldest = self._writer.oldest_ack
        if oldest is None:
            return None
        if self._writer.buffered_acks >= ACK_FLUSH_ROWS:
            return 0.0
        wait = oldest + linger_s - time.monotonic()
        earliest = self._writer.earliest_deadline
        if earliest is not None:
            wait = min(wait, (earliest - now_ms() - ACK_DEADLINE_MARGIN_MS) / 1000 - linger_s)
        return max(0.0, wait)

    def flush(self, *, offline: bool = False) -> int:
        """Append the buffered acks and releases; returns how many messages they cover. With
        ``offline`` an ``OFFLINE`` row goes with them (QMQ's FOREVER_OFFLINE: every lease of this
        consumer id ends now). Without ``offline`` only the writer is used, which is thread-safe:
        callable without the consumer's lock.

        Raises:
            StoreError, CommitConflictError: the write failed; they stay buffered.
        """
        extra = None
        if offline:
            if self._version < 0:
                self._sync()  # this id's last sequence
            extra = [self._writer.row(OFFLINE, "", 0, 0, ts=now_ms())]
        done = self._writer.flush(extra)
        if done or extra:
            self._writes += 1
        return done
