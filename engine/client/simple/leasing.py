"""Taking leases: a simple consumer's buffer filled with fresh leases and redeliveries, under contention.

:class:`Leasing` leases a queue past the group's frontier, leases again what the last scan found
expired (past the group's most deliveries an ``EXPIRED`` row hands the message to the retry job
instead), and for a FIFO group the one outstanding range of each queue. Contention: a lease takes
no more than a fair share of what is left among the group's consumers that lease
(:data:`ACTIVE_WINDOW_MS`), starts at a queue of its own, moves on from a queue lost to a race, and
tries the queues lost again after a jittered, growing pause (:data:`LEASE_ATTEMPTS` passes, for at
least :data:`CONTENTION_WAIT_MS`). The protocol: :mod:`engine.client.simple.leases`.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.client.offsets import start_offset
from engine.client.simple.deliveries import Leased, Source
from engine.client.simple.lease_state import LeaseState
from engine.errors import CommitConflictError
from engine.model import MessageExt
from engine.protocol.actions import ACK, EXPIRED, PULL, RELEASE
from engine.protocol.lease_book import FIFO_AGAIN, FIFO_HELD, ranges
from engine.protocol.selectors import MessageSelector
from engine.store.consumer_offset import OffsetStore
from engine.store.store import now_ms

LEASE_HOLD_MS = 1000  # a leased message may wait this long in the buffer and still get its full time
MAX_PREFETCH = 1024  # most messages one lease takes
LEASE_ATTEMPTS = 8  # passes over the queues whose lease commits lost a race, in one lease()
# A receive whose lease commits all lost their races tries again for up to this long, even when it
# does not wait for new messages (wait_ms=0): there are messages, only contended.
CONTENTION_WAIT_MS = 50
# A consumer of the group that leased within this long shares what is left of a queue (fair share).
ACTIVE_WINDOW_MS = 10_000


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


class Leasing(LeaseState):
    """What :class:`~engine.client.simple.leases.Leases` leases into its buffer (module docstring)."""

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
        nothing is tried until the next scan (:data:`~.leases.SCAN_INTERVAL_MS`), so an idle consumer's
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
        action log is not read again until the next scan (:data:`~.leases.SCAN_INTERVAL_MS`): an idle FIFO
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


__all__ = ["LEASE_HOLD_MS", "MAX_PREFETCH", "Leasing"]
