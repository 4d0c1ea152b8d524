"""The lease book: lease state of a group's messages, evaluated from ``action_log`` rows (pure: no I/O).

Consumers with per-message ack (QMQ's pull / ack / action log; RocketMQ 5's ``SimpleConsumer``) lease
ranges of a queue through the action log; the protocol as a whole is described in
:mod:`engine.client.simple.leases`. The rules that evaluate the rows:

* ``RESET`` moves the group's position in a queue to ``queue_offset``: everything below is finished,
  nothing at or above it is finished or leased.
* ``PULL`` leases the offsets of ``[queue_offset, end_offset)`` to its consumer until ``deadline_ms``:
  an offset not finished and not leased, or whose lease ended at or before the row's ``ts_ms``. Each
  lease counts one delivery of the offset.
* ``CHANGE_INVISIBLE`` from the current holder, before its deadline, sets a new deadline; the row's
  sequence becomes the lease's (a new receipt handle).
* ``RELEASE`` from the current holder, before its deadline, ends the lease named by the row's
  ``deadline_ms`` and takes back its delivery (the consumer leased the message but never handed it
  to its user).
* ``OFFLINE`` (QMQ's FOREVER_OFFLINE) ends every lease of its consumer at the row's time.
* ``ACK`` finishes the offsets of its range; ``NACK`` from the current holder and ``EXPIRED`` finish
  one offset (the retry job re-puts or dead-letters it).

FIFO groups (RocketMQ 5's orderly POP, ``consumeMessageOrderly`` / the 5.x ``fifo`` subscription; the
rule is :meth:`QueueBook.fifo_next`, the consumer side :mod:`engine.client.simple.leases`):

* a queue holds at most one outstanding lease range: its next range is not leased while any offset
  below the group's frontier is unfinished, and a held one blocks the whole queue;
* when every unfinished offset below the frontier is free again (its lease ended, was released or
  made visible at once by a FIFO ``nack``), those same offsets are leased again first, in queue
  order, to whoever receives next, each delivery counted (``reconsume_times`` + 1); past the most
  deliveries an ``EXPIRED`` row finishes the head (the retry job dead-letters it) and the queue moves on;
* so a queue's messages are handed out in queue order, the next range only after every message of
  the one before is acked or dead-lettered. The guarantee is per queue, hence per message group:
  a producer sends a group's messages to one queue (:func:`engine.protocol.messages.message_group_queue`).

An ack is written only before its lease's deadline (the consumer refuses later ones), so the
offsets finished do not depend on whether an ack or a later lease of the same offset is applied
first: rows may be applied in commit order (new versions) or, from a snapshot, in time order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine.protocol.actions import ACK, CHANGE_INVISIBLE, EXPIRED, NACK, OFFLINE, PULL, RELEASE, RESET

# Order of actions with the same time in a snapshot: a reset first, then leases, then the rest.
_RANK = {RESET: 0, PULL: 1, CHANGE_INVISIBLE: 2, RELEASE: 3, OFFLINE: 4, NACK: 5, EXPIRED: 6, ACK: 7}

Key = tuple[str, int, int]  # topic, queue_id, queue_offset

# What a FIFO group may lease of a queue now (QueueBook.fifo_next).
FIFO_HELD = "HELD"  # an unfinished offset is under a live lease: nothing
FIFO_AGAIN = "AGAIN"  # the unfinished offsets below the frontier, all free: lease them again first
FIFO_FRESH = "FRESH"  # nothing outstanding: the next range from the frontier


@dataclass
class OffsetLease:
    """The lease of one offset: who holds it (``sequence`` names the receipt), until when, and how
    often the offset was delivered."""

    consumer_id: str
    sequence: int
    deadline_ms: int
    deliveries: int


@dataclass
class QueueBook:
    """Lease state of one queue for one group: offsets below ``floor`` are all finished; none at
    or above ``frontier`` was ever leased (since the last reset)."""

    floor: int = 0
    frontier: int = 0
    done: set[int] = field(default_factory=set)
    leases: dict[int, OffsetLease] = field(default_factory=dict)

    def is_done(self, offset: int) -> bool:
        return offset < self.floor or offset in self.done

    def available(self, offset: int, now: int) -> bool:
        """Not finished and not held by an unexpired lease at ``now``."""
        if self.is_done(offset):
            return False
        lease = self.leases.get(offset)
        return lease is None or now >= lease.deadline_ms

    def expired(self, now: int) -> list[int]:
        """Leased offsets, not finished, whose lease ended at or before ``now``, ascending."""
        return sorted(o for o, c in self.leases.items() if c.deadline_ms <= now and not self.is_done(o))

    def fifo_next(self, now: int) -> tuple[str, list[int]]:
        """What a FIFO group may lease of this queue at ``now`` (module docstring): ``(FIFO_HELD,
        [])`` while an unfinished offset below the frontier is under a lease that has not ended;
        ``(FIFO_AGAIN, offsets)`` the unfinished offsets below the frontier, ascending, when all
        of them are free; ``(FIFO_FRESH, [])`` when none is unfinished."""
        outstanding: list[int] = []
        done = self.done
        leases = self.leases
        for offset in range(self.floor, self.frontier):
            if offset in done:
                continue
            lease = leases.get(offset)
            if lease is not None and now < lease.deadline_ms:
                return FIFO_HELD, []
            outstanding.append(offset)
        return (FIFO_AGAIN, outstanding) if outstanding else (FIFO_FRESH, [])

    def held_by(self, consumer_id: str, now: int) -> list[tuple[int, OffsetLease]]:
        """Offsets ``consumer_id`` holds an unexpired lease on at ``now``, ascending."""
        return sorted(
            (o, c) for o, c in self.leases.items() if c.consumer_id == consumer_id and c.deadline_ms > now
        )

    def finish(self, offset: int) -> None:
        self.leases.pop(offset, None)
        if offset < self.floor:
            return
        self.done.add(offset)
        while self.floor in self.done:
            self.done.remove(self.floor)
            self.floor += 1

    def finish_range(self, start: int, end: int) -> None:
        """:meth:`finish` every offset of ``[start, end)`` (acks travel as ranges, mostly at the
        floor: the floor then jumps over the range)."""
        leases = self.leases
        for offset in range(start, end):
            leases.pop(offset, None)
        if start > self.floor:
            self.done.update(range(start, end))
            return
        self.floor = max(self.floor, end)
        done = self.done
        if done:
            self.done = done = {o for o in done if o >= self.floor}
        while self.floor in done:
            done.remove(self.floor)
            self.floor += 1

    def reset(self, offset: int) -> None:
        """The group's position moves to ``offset``: forget every lease and ack."""
        self.floor = offset
        self.frontier = offset
        self.done = set()
        self.leases = {}

    def raise_floor(self, offset: int) -> None:
        """Offsets below ``offset`` are gone from the queue (retention): nothing left to lease there."""
        if offset <= self.floor:
            return
        self.floor = offset
        self.frontier = max(self.frontier, offset)
        self.done = {o for o in self.done if o >= offset}
        self.leases = {o: c for o, c in self.leases.items() if o >= offset}
        while self.floor in self.done:
            self.done.remove(self.floor)
            self.floor += 1


def ranges(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted offsets as half-open runs, as acks travel: [1, 2, 3, 7] -> [(1, 4), (7, 8)]."""
    out: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if out and out[-1][1] == offset:
            out[-1] = (out[-1][0], offset + 1)
        else:
            out.append((offset, offset + 1))
    return out


def _end(row: dict[str, Any]) -> int:
    """The end (exclusive) of the offsets a row is about: ``end_offset``, or one offset."""
    end = row.get("end_offset")
    return int(end) if end is not None else int(row["queue_offset"]) + 1


def _offsets(row: dict[str, Any]) -> Iterator[int]:
    return iter(range(int(row["queue_offset"]), _end(row)))


class LeaseBook:
    """Lease state of a group's messages, evaluated from ``action_log`` rows (module docstring).

    Pure: no I/O. Rows are mappings by action-log column name.
    """

    def __init__(self, group: str) -> None:
        self.group = group
        self.queues: dict[tuple[str, int], QueueBook] = {}
        self.sequences: dict[str, int] = {}  # consumer_id -> highest sequence seen
        self.leased_at: dict[str, int] = {}  # consumer_id -> time of its latest lease (not offline)

    def queue(self, topic: str, queue_id: int) -> QueueBook:
        key = (topic, queue_id)
        book = self.queues.get(key)
        if book is None:
            book = self.queues[key] = QueueBook()
        return book

    def lease(self, key: Key) -> OffsetLease | None:
        book = self.queues.get((key[0], key[1]))
        return None if book is None else book.leases.get(key[2])

    def is_done(self, key: Key) -> bool:
        book = self.queues.get((key[0], key[1]))
        return book is not None and book.is_done(key[2])

    def active(self, since_ms: int) -> set[str]:
        """Consumers that leased something at or after ``since_ms`` and did not go offline since."""
        return {consumer for consumer, ts in self.leased_at.items() if ts >= since_ms}

    def apply(self, rows: list[dict[str, Any]]) -> None:
        """Apply rows in commit order."""
        for row in rows:
            if row["group"] != self.group:
                continue
            consumer = row["consumer_id"]
            sequence = int(row["sequence"])
            if sequence > self.sequences.get(consumer, -1):
                self.sequences[consumer] = sequence
            action = row["action"]
            ts = int(row["ts_ms"])
            if action == OFFLINE:
                if self.leased_at.get(consumer, ts + 1) <= ts:
                    del self.leased_at[consumer]
                for book in self.queues.values():
                    for lease in book.leases.values():
                        # Changed in place: a lease object shared by a range is all this consumer's.
                        if lease.consumer_id == consumer and lease.deadline_ms > ts:
                            lease.deadline_ms = ts
                continue
            book = self.queue(row["topic"], int(row["queue_id"]))
            if action == RESET:
                book.reset(int(row["queue_offset"]))
            elif action in (ACK, EXPIRED):
                book.finish_range(int(row["queue_offset"]), _end(row))
            elif action == PULL:
                self.leased_at[consumer] = max(ts, self.leased_at.get(consumer, ts))
                deadline = int(row["deadline_ms"] or ts)
                start, end = int(row["queue_offset"]), _end(row)
                if start >= book.frontier and not any(o >= start for o in book.done):
                    # A fresh range (the common case): no offset of it was leased or finished.
                    # One lease object for the range; holder actions replace, never change, it.
                    book.frontier = end
                    shared = OffsetLease(consumer, sequence, deadline, 1)
                    book.leases.update(dict.fromkeys(range(max(start, book.floor), end), shared))
                    continue
                book.frontier = max(book.frontier, end)
                for offset in range(start, end):
                    if book.is_done(offset):
                        continue
                    earlier = book.leases.get(offset)
                    if earlier is None:
                        book.leases[offset] = OffsetLease(consumer, sequence, deadline, 1)
                    elif ts >= earlier.deadline_ms:
                        deliveries = earlier.deliveries + 1
                        book.leases[offset] = OffsetLease(consumer, sequence, deadline, deliveries)
            else:
                self._holder_action(book, row, action, consumer, sequence, ts)

    @staticmethod
    def _holder_action(
        book: QueueBook, row: dict[str, Any], action: str, consumer: str, sequence: int, ts: int
    ) -> None:
        """CHANGE_INVISIBLE, RELEASE and NACK: valid from the current holder before its deadline."""
        for offset in _offsets(row):
            lease = book.leases.get(offset)
            if lease is None or lease.consumer_id != consumer or book.is_done(offset):
                continue
            if action == NACK:
                book.finish(offset)
            elif ts < lease.deadline_ms:
                # Replaced, not changed: a lease object may stand for a whole range.
                if action == CHANGE_INVISIBLE:
                    deadline = int(row["deadline_ms"] or ts)
                    book.leases[offset] = replace(lease, deadline_ms=deadline, sequence=sequence)
                elif action == RELEASE and row.get("deadline_ms") in (None, lease.deadline_ms):
                    book.leases[offset] = replace(lease, deadline_ms=ts, deliveries=lease.deliveries - 1)

    def bootstrap(self, rows: list[dict[str, Any]]) -> None:
        """Apply a snapshot's rows (no commit order): by time, then action, consumer and sequence."""
        rows = [r for r in rows if r["group"] == self.group]
        rows.sort(
            key=lambda r: (int(r["ts_ms"]), _RANK.get(r["action"], 9), r["consumer_id"], int(r["sequence"]))
        )
        self.apply(rows)
