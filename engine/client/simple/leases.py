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
thread-safe: the consumer calls it under its lock. Its parts: the state and its reads and commits
of the log (:mod:`.lease_state`), taking leases and redeliveries under contention (:mod:`.leasing`),
what the user holds, its decisions and acks (:mod:`.holding`), the records of a delivery
(:mod:`.deliveries`); here, the scan (:meth:`Leases.maintain`), handing out (:meth:`Leases.take`)
and giving back the buffer (:meth:`Leases.release_all`).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from engine.client.simple.deliveries import Held, Leased, ReceivedMessage, Source, received_message, topic_of
from engine.client.simple.holding import Holding
from engine.client.simple.leasing import LEASE_HOLD_MS, MAX_PREFETCH, Leasing
from engine.protocol.actions import RELEASE
from engine.store.store import now_ms

PREFETCH_GROWTH = 4  # the lease size grows by this factor while the buffer drains quickly
SCAN_INTERVAL_MS = 1000  # how often the lease state is read for expired leases and resets


class Leases(Leasing, Holding):
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

    # ----------------------------------------------------------------- scanning
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
        for this very request and go out whatever time their lease has left, even none: their
        delivery is counted (the lease's end makes it a redelivery), so the user sees it, as a
        RocketMQ POP hands out what it popped however long the pop took (an ack after the lease
        ended is refused, as there). With ``topic``, only messages of that
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
            if not just_leased and left < (1 if item.recovered else enough):
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


__all__ = ["SCAN_INTERVAL_MS", "Leases"]
