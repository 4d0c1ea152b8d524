"""A ``SimpleConsumer``'s leases: taking ranges of queues, the prefetch buffer, redelivery, resets.

:class:`Leaser` decides what to lease and commits it through :class:`~engine.client.claim_log.ClaimLog`:

* fresh leases: ``[frontier, frontier + n)`` of a queue, decided from the queue's lease frontier
  alone (no data of the action log read); a group's first lease of a queue also records where the
  group starts (a ``RESET`` row: the committed offset, else RocketMQ's rule for new groups);
* redelivery: leases that ended without an ack (found in the lease state, refreshed every
  :data:`SCAN_INTERVAL_MS`) are leased again, with ``reconsume_times`` + 1; past the group's most
  deliveries an ``EXPIRED`` row hands the message to the retry job, which dead-letters it;
* recovery: a consumer starting with an id that holds unexpired leases gets those messages back
  at once (QMQ: a consumer that pulls again with its id first gets what it did not ack);
* resets: a queue reset by an administrator (:func:`~engine.store.action_log.reset_leases`) drops
  what this consumer holds of it.

Leased messages wait in a buffer until :meth:`Leaser.take` hands them out; the lease size grows
while the buffer drains quickly and shrinks when leased messages wait too long. Not thread-safe:
the consumer calls it under its lock.
"""

from __future__ import annotations

import collections
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from engine.client.claim_log import ClaimLog, Held, ReceivedMessage, ranges, received_message
from engine.client.leases import MATCH_ALL, Entries, Source, read_entries, read_messages
from engine.client.offsets import ConsumeFrom, start_offset
from engine.errors import CommitConflictError
from engine.model import MessageExt
from engine.protocol.actions import ACK, EXPIRED, PULL, RELEASE, RESET
from engine.protocol.selectors import MessageSelector
from engine.store.consume_queue import QueueIndex
from engine.store.consumer_offset import OffsetStore
from engine.store.store import Store, now_ms

Key = tuple[str, int, int]

LEASE_HOLD_MS = 1000  # a leased message may wait this long in the buffer and still get its full time
MAX_PREFETCH = 1024  # most messages one lease takes
SCAN_INTERVAL_MS = 1000  # how often the lease state is read for expired leases and resets
LEASE_ATTEMPTS = 8  # lease commits tried on one queue before moving to the next


@dataclass
class Leased:
    """A leased message waiting in the buffer."""

    message: MessageExt
    sequence: int
    deadline_ms: int
    reconsume_times: int
    recovered: bool = False
    leased_at: float = 0.0  # monotonic


class Leaser:
    """Leases of one consumer (module docstring).

    Args:
        store: the store.
        log: the consumer's view of the action log.
        consume_from: where the group starts a queue it has no position in.
        consume_from_timestamp_ms: the time for ``ConsumeFrom.TIMESTAMP``.
        max_reconsume: deliveries allowed for a message (its properties) before it is dead-lettered.
    """

    def __init__(
        self,
        store: Store,
        log: ClaimLog,
        consume_from: ConsumeFrom,
        consume_from_timestamp_ms: int,
        max_reconsume: Callable[[MessageExt], int],
    ) -> None:
        self._store = store
        self._log = log
        self._index = QueueIndex(store)
        self._consume_from = consume_from
        self._timestamp_ms = consume_from_timestamp_ms
        self._max_reconsume = max_reconsume
        self.buffer: collections.deque[Leased] = collections.deque()
        self.prefetch = 1
        self._drained_since: float | None = None  # monotonic time the last lease was taken
        self._scanned_at: float | None = None  # monotonic; None: never
        self._expired: dict[tuple[str, int], list[int]] = {}
        self._committed: dict[tuple[str, int], int] | None = None
        self._rotation = zlib.crc32(log.consumer_id.encode())
        self.conflicts = 0

    # ----------------------------------------------------------------- state
    def start(self, held: dict[Key, Held]) -> None:
        """Read the lease state once and take back the messages this consumer id still holds."""
        if self._log.started:
            return
        self._log.sync()
        now = now_ms()
        recovered: list[Leased] = []
        for (topic, queue_id), book in self._log.book.queues.items():
            mine = [
                (o, c)
                for o, c in book.held_by(self._log.consumer_id, now)
                if (topic, queue_id, o) not in held
            ]
            if not mine:
                continue
            self._index.refresh()
            entries = read_entries(self._index, topic, queue_id, [o for o, _ in mine], MATCH_ALL)
            messages = read_messages(self._index, entries.physical)
            claims = dict(mine)
            for offset, phys in zip(entries.offsets, entries.physical, strict=True):
                message = messages.get(phys)
                if message is not None:
                    claim = claims[offset]
                    reconsume = message.reconsume_times + claim.deliveries - 1
                    recovered.append(Leased(message, claim.sequence, claim.deadline_ms, reconsume, True))
        self.buffer.extendleft(reversed(recovered))

    def maintain(self, sources: Callable[[], list[Source]], held: dict[Key, Held]) -> None:
        """Every :data:`SCAN_INTERVAL_MS`: read the new lease state, drop what an
        administrator reset, and note the expired leases of ``sources()`` (asked for only then)
        for redelivery."""
        due = self._scanned_at is None or time.monotonic() - self._scanned_at >= SCAN_INTERVAL_MS / 1000
        if not due:
            return
        self._log.sync()
        reset, self._log.resets = self._log.resets, set()
        self._scanned_at = time.monotonic()
        now = now_ms()
        for key in [k for k, h in held.items() if h.deadline_ms <= now]:
            del held[key]  # expired: no longer counts against max_unacked
        if reset:
            self.buffer = collections.deque(
                x for x in self.buffer if (x.message.topic, x.message.queue_id) not in reset
            )
            for key in [k for k in held if (k[0], k[1]) in reset]:
                del held[key]
        self._index.refresh()
        self._expired = {}
        for topic, queue_id, _ in sources():
            book = self._log.book.queues.get((topic, queue_id))
            if book is None:
                continue
            book.raise_floor(self._index.bounds(topic, queue_id)[0])
            expired = book.expired(now)
            if expired:
                self._expired[(topic, queue_id)] = expired[:MAX_PREFETCH]

    # ----------------------------------------------------------------- handing out
    def take(
        self, n: int, invisible_ms: int, held: dict[Key, Held], *, leased_since: float | None = None
    ) -> list[ReceivedMessage]:
        """Up to ``n`` buffered messages with about ``invisible_ms`` of their lease left (less at
        most LEASE_HOLD_MS or half of it; a recovered one: any time left); the others are released
        to the group. Messages leased at or after ``leased_since`` (monotonic) were leased for this
        very request and go out with any time left."""
        now = now_ms()
        out: list[ReceivedMessage] = []
        enough = invisible_ms - min(LEASE_HOLD_MS, invisible_ms // 2)
        while self.buffer and len(out) < n:
            item = self.buffer.popleft()
            m = item.message
            key = (m.topic, m.queue_id, m.queue_offset)
            if key in held and held[key].sequence == item.sequence:
                continue  # recovered, and handed out already
            left = item.deadline_ms - now
            just_leased = leased_since is not None and item.leased_at >= leased_since
            if left < (1 if item.recovered or just_leased else enough):
                if not item.recovered and left > 0:
                    self._log.buffer(RELEASE, m.topic, m.queue_id, m.queue_offset, item.deadline_ms, now)
                    self.prefetch = max(1, self.prefetch // 2)
                continue
            handle = f"{self._log.consumer_id}#{item.sequence}"
            held[key] = Held(
                item.sequence, item.deadline_ms, item.reconsume_times, m.msg_id, m.physical_offset, {handle}
            )
            out.append(received_message(m, item.reconsume_times, handle, item.deadline_ms))
        if not self.buffer and self._drained_since is not None:
            if time.monotonic() - self._drained_since < LEASE_HOLD_MS / 2000:
                self.prefetch = min(MAX_PREFETCH, self.prefetch * 2)
            self._drained_since = None
        return out

    def release_all(self) -> None:
        """Give every buffered (never handed out) message back to the group."""
        now = now_ms()
        while self.buffer:
            item = self.buffer.popleft()
            m = item.message
            if item.deadline_ms > now and not item.recovered:
                self._log.buffer(RELEASE, m.topic, m.queue_id, m.queue_offset, item.deadline_ms, now)

    # ----------------------------------------------------------------- leasing
    def lease(self, sources: list[Source], n: int, invisible_ms: int) -> int:
        """Lease at least ``n`` messages if there are (up to the prefetch size): expired leases
        first, then fresh ones, queue after queue; returns how many were buffered."""
        if not sources:
            return 0
        want = max(n, min(self.prefetch, MAX_PREFETCH))
        filters = {(t, q): f for t, q, f in sources}
        total = 0
        for key in list(self._expired):
            if key in filters:
                total += self._redeliver(key[0], key[1], filters[key], want - total, invisible_ms, n)
                if total >= n:
                    return total
        self._index.refresh()
        start = self._rotation % len(sources)
        self._rotation += 1
        for i, (topic, queue_id, selector) in enumerate(sources[start:] + sources[:start]):
            total += self._lease_fresh(topic, queue_id, selector, want - total, invisible_ms, n, i == 0)
            if total >= n:
                break
        return total

    @staticmethod
    def _deadline(ts: int, invisible_ms: int, size: int, needed: int) -> int:
        """A lease taking more than is needed now lets the rest wait up to LEASE_HOLD_MS in the buffer."""
        return ts + invisible_ms + (LEASE_HOLD_MS if size > needed else 0)

    def _first_offset(self, topic: str, queue_id: int) -> int:
        if self._committed is None:
            self._committed = OffsetStore(self._store, self._log.group).read()
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
            in_memory_age_ms=self._store.config.in_memory_age_ms,
            now_ms=now_ms(),
            pop=True,
        )

    def _lease_fresh(
        self,
        topic: str,
        queue_id: int,
        selector: MessageSelector,
        size: int,
        invisible_ms: int,
        needed: int,
        refresh: bool,
    ) -> int:
        log = self._log
        for attempt in range(LEASE_ATTEMPTS):
            frontier = log.frontier(topic, queue_id, refresh=refresh or attempt > 0)
            low, high = self._index.bounds(topic, queue_id)
            ts = now_ms()
            rows = []
            start = frontier
            if frontier < 0:
                start = self._first_offset(topic, queue_id)
                rows.append(log.row(RESET, topic, queue_id, start, ts=ts))
            start = max(start, low)
            if start >= high:
                if rows and attempt == 0:  # record where the group starts, so it does not move on
                    try:
                        log.commit(rows, topic, queue_id, start)
                    except CommitConflictError:
                        self.conflicts += 1
                return 0
            end = min(high, start + size)
            entries = read_entries(self._index, topic, queue_id, list(range(start, end)), selector)
            deadline = self._deadline(ts, invisible_ms, end - start, needed)
            sequence = log.next_sequence()
            rows.append(
                log.row(PULL, topic, queue_id, start, end=end, deadline_ms=deadline, ts=ts, sequence=sequence)
            )
            rows.extend(log.row(ACK, topic, queue_id, s, end=e, ts=ts) for s, e in ranges(entries.filtered))
            try:
                log.commit(rows, topic, queue_id, end)
            except CommitConflictError:
                self.conflicts += 1
                continue
            return self._buffer(topic, queue_id, entries, selector, sequence, deadline)
        return 0

    def _redeliver(
        self, topic: str, queue_id: int, selector: MessageSelector, size: int, invisible_ms: int, needed: int
    ) -> int:
        log = self._log
        wanted = self._expired.pop((topic, queue_id))
        for _ in range(LEASE_ATTEMPTS):
            # Decide from the state as of the snapshot the commit is based on: a lease of these
            # offsets committed by anyone after it makes the commit conflict (same queue app id).
            log.sync()
            book = log.book.queue(topic, queue_id)
            now = now_ms()
            offsets = [o for o in wanted if book.available(o, now) and o in book.claims][:size]
            if not offsets:
                return 0
            entries = read_entries(self._index, topic, queue_id, offsets, selector)
            messages = read_messages(self._index, entries.physical, selector)
            deadline = self._deadline(now, invisible_ms, len(offsets), needed)
            unmatched = entries.filtered + [
                o
                for o, p in zip(entries.offsets, entries.physical, strict=True)
                if p in messages and not messages[p]
            ]
            rows = [log.row(ACK, topic, queue_id, s, end=e, ts=now) for s, e in ranges(unmatched)]
            counts: dict[int, int] = {}
            leased: list[int] = []
            for offset, phys in zip(entries.offsets, entries.physical, strict=True):
                message = messages.get(phys)
                if message is None:
                    continue  # gone (retention), or consumed by filtering above
                reconsume = message.reconsume_times + book.claims[offset].deliveries
                if reconsume > self._max_reconsume(message):
                    rows.append(
                        log.row(
                            EXPIRED,
                            topic,
                            queue_id,
                            offset,
                            physical_offset=phys,
                            msg_id=message.msg_id,
                            reconsume_times=reconsume - 1,
                            ts=now,
                        )
                    )
                    continue
                counts[offset] = reconsume
                leased.append(offset)
            sequences = {}
            for s, e in ranges(leased):
                sequence = log.next_sequence()
                rows.append(
                    log.row(
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
            if not rows:
                return 0
            try:
                log.commit(rows, topic, queue_id, log.frontier(topic, queue_id, refresh=False))
            except CommitConflictError:
                self.conflicts += 1
                continue
            kept = [(o, p) for o, p in zip(entries.offsets, entries.physical, strict=True) if o in counts]
            for offset, phys in kept:
                item = messages[phys]
                assert item is not None
                self.buffer.append(
                    Leased(item, sequences[offset], deadline, counts[offset], False, time.monotonic())
                )
            return len(kept)
        return 0

    def _buffer(
        self,
        topic: str,
        queue_id: int,
        entries: Entries,
        selector: MessageSelector,
        sequence: int,
        deadline: int,
    ) -> int:
        messages = read_messages(self._index, entries.physical, selector)
        now = now_ms()
        before = len(self.buffer)
        for offset, phys in zip(entries.offsets, entries.physical, strict=True):
            message = messages.get(phys)
            if message is None:  # not matched by its tags or properties: consumed by filtering
                self._log.buffer(ACK, topic, queue_id, offset, deadline, now)
                continue
            leased_at = time.monotonic()
            self.buffer.append(Leased(message, sequence, deadline, message.reconsume_times, False, leased_at))
        self._drained_since = time.monotonic()
        return len(self.buffer) - before
