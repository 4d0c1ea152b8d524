"""Claim state of a group's messages, evaluated from ``action_log`` rows (pure: no I/O).

The rules (see :mod:`engine.client.simple` for the whole protocol): a ``PULL`` claims a message that
is not finished and has no claim, or whose claim's deadline is at or before the row's ``ts_ms``;
``CHANGE_INVISIBLE`` moves the deadline of the current claimant's claim before it ends; ``NACK`` from
the current claimant finishes the message (the retry job re-puts it); ``ACK`` finishes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.protocol.actions import ACK, CHANGE_INVISIBLE, NACK, PULL

CLAIM_ACTIONS = frozenset({PULL, CHANGE_INVISIBLE, NACK})

Key = tuple[str, int, int]  # topic, queue_id, queue_offset


@dataclass
class Claim:
    """The current claim of a message: who holds it, until when, and how often it was delivered."""

    consumer_id: str
    sequence: int
    deadline_ms: int
    deliveries: int


@dataclass
class QueueBook:
    """Claim state of one queue for one group: offsets below ``floor`` are all finished."""

    floor: int = 0
    done: set[int] = field(default_factory=set)
    claims: dict[int, Claim] = field(default_factory=dict)

    def is_done(self, offset: int) -> bool:
        return offset < self.floor or offset in self.done

    def available(self, offset: int, now: int) -> bool:
        """Not finished and not held by an unexpired claim at ``now``."""
        if self.is_done(offset):
            return False
        claim = self.claims.get(offset)
        return claim is None or now >= claim.deadline_ms

    def finish(self, offset: int) -> None:
        self.claims.pop(offset, None)
        if offset < self.floor:
            return
        self.done.add(offset)
        while self.floor in self.done:
            self.done.remove(self.floor)
            self.floor += 1

    def raise_floor(self, offset: int) -> None:
        """Offsets below ``offset`` are gone from the queue (retention): nothing left to claim there."""
        if offset <= self.floor:
            return
        self.floor = offset
        self.done = {o for o in self.done if o >= offset}
        self.claims = {o: c for o, c in self.claims.items() if o >= offset}
        while self.floor in self.done:
            self.done.remove(self.floor)
            self.floor += 1


class ClaimBook:
    """Claim state of a group's messages, evaluated from ``action_log`` rows (see the module docstring).

    Pure: no I/O. Rows are mappings by action-log column name.
    """

    def __init__(self, group: str) -> None:
        self.group = group
        self.queues: dict[tuple[str, int], QueueBook] = {}
        self.last_claim_ts = 0
        self.sequences: dict[str, int] = {}  # consumer_id -> highest sequence seen

    def queue(self, topic: str, queue_id: int) -> QueueBook:
        key = (topic, queue_id)
        book = self.queues.get(key)
        if book is None:
            book = self.queues[key] = QueueBook()
        return book

    def claim(self, key: Key) -> Claim | None:
        book = self.queues.get((key[0], key[1]))
        return None if book is None else book.claims.get(key[2])

    def is_done(self, key: Key) -> bool:
        book = self.queues.get((key[0], key[1]))
        return book is not None and book.is_done(key[2])

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
            book = self.queue(row["topic"], int(row["queue_id"]))
            offset = int(row["queue_offset"])
            if action == ACK:
                book.finish(offset)
                continue
            if action not in CLAIM_ACTIONS:
                continue
            ts = int(row["ts_ms"])
            self.last_claim_ts = max(self.last_claim_ts, ts)
            if book.is_done(offset):
                continue
            claim = book.claims.get(offset)
            if action == PULL:
                if claim is None or ts >= claim.deadline_ms:
                    deliveries = claim.deliveries + 1 if claim is not None else 1
                    deadline = int(row["deadline_ms"] or ts)
                    book.claims[offset] = Claim(consumer, sequence, deadline, deliveries)
            elif action == CHANGE_INVISIBLE:
                if claim is not None and claim.consumer_id == consumer and ts < claim.deadline_ms:
                    claim.deadline_ms = int(row["deadline_ms"] or ts)
            elif claim is not None and claim.consumer_id == consumer:  # NACK
                book.finish(offset)

    def bootstrap(self, rows: list[dict[str, Any]]) -> None:
        """Apply a snapshot's rows (no commit order): claims by their stamped order, then acks."""
        claims = [r for r in rows if r["action"] in CLAIM_ACTIONS]
        claims.sort(key=lambda r: (int(r["ts_ms"]), r["consumer_id"], int(r["sequence"])))
        others = [r for r in rows if r["action"] not in CLAIM_ACTIONS]
        self.apply(claims + others)
