"""One consumer's view of its group's leases in ``action_log``: reading it, committing leases, acks.

Lease protocol (QMQ's pull / ack / action log, with Delta as the broker; no lock service):

* Every action is a row of ``action_log`` for ``(group, consumer_id, sequence)``; the rules that
  evaluate them are :mod:`engine.client.claims`. One ``PULL`` row leases a range of a queue to one
  consumer until its deadline; acks travel as ``ACK`` ranges.
* The group's lease frontier in a queue (the next offset never leased) is the Delta app transaction
  :func:`~engine.store.commit_markers.lease_app` of ``action_log``. Every commit that decides about
  the queue's leases (a fresh lease, a redelivery, ``CHANGE_INVISIBLE``, ``NACK``, ``EXPIRED``, a
  reset) carries it, so Delta's conflict check lets exactly one of two such commits on one queue
  land; the loser reads again and decides again. Commits for other queues and acks carry no such
  id and are rebased by Delta without a conflict: consumers of one group do not serialise on one
  log, only on one queue.
* A fresh lease needs nothing but the frontier (a table snapshot, no data read): the consumer
  leases ``[frontier, frontier + n)``. Redelivering an expired lease needs the lease state, kept
  by :class:`ClaimLog` from the log (one snapshot scan, then only the new versions).
* Acks change no lease and are valid only before their lease's deadline (the consumer refuses an
  expired receipt), so they are buffered briefly and appended blindly, or ride along with the
  consumer's next lease commit.

Not thread-safe: :class:`~engine.client.simple.SimpleConsumer` calls it under its lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.client.claims import ClaimBook
from engine.errors import StoreError
from engine.model import MessageExt
from engine.protocol.actions import RELEASE, RESET
from engine.store import schemas
from engine.store.action_log import lease_frontier
from engine.store.commit_markers import lease_app
from engine.store.delta import read_versions
from engine.store.store import Store, sql_literal

LEASE_COMMIT_RETRIES = 32  # rebases past other queues' leases and acks before giving up


@dataclass
class Held:
    """A message this consumer handed to its user and that is not acked or nacked yet."""

    sequence: int  # the lease's (the receipt handle's) action sequence
    deadline_ms: int
    reconsume_times: int
    msg_id: str
    physical_offset: int
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
    values = {f.name: getattr(message, f.name) for f in fields(MessageExt)}
    values["reconsume_times"] = reconsume_times
    return ReceivedMessage(**values, receipt_handle=receipt_handle, invisible_until_ms=until_ms)


def ranges(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted offsets as half-open runs: [1, 2, 3, 7] -> [(1, 4), (7, 8)]."""
    out: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if out and out[-1][1] == offset:
            out[-1] = (out[-1][0], offset + 1)
        else:
            out.append((offset, offset + 1))
    return out


class ClaimLog:
    """The lease state of ``group`` as of the action log's latest version read, and this consumer's
    writes to the log.

    Args:
        store: the store (reads).
        group: the consumer group.
        consumer_id: this consumer's id (stamped on every row it writes).
    """

    def __init__(self, store: Store, group: str, consumer_id: str) -> None:
        self.group = group
        self.consumer_id = consumer_id
        self._store = store
        # Private table handles: a commit and the frontier it was decided from must come from one
        # snapshot, which a handle shared with other users of ``store`` cannot promise.
        self._writer = Store(store.root, store.storage_options, store.config)
        self.book = ClaimBook(group)
        self.version = -1
        self.resets: set[tuple[str, int]] = set()  # queues reset by others, seen by sync()
        self._sequence = -1
        # (topic, queue, action, released lease's deadline or 0) -> offsets
        self._acks: dict[tuple[str, int, str, int], list[int]] = {}
        self._ack_ts = 0
        self.oldest_ack: float | None = None  # monotonic time of the oldest buffered ack
        self.earliest_deadline: int | None = None  # of the leases the buffered acks belong to

    # ----------------------------------------------------------------- reading
    @property
    def started(self) -> bool:
        return self.version >= 0

    def sync(self) -> set[tuple[str, int]]:
        """Bring the lease state up to the action log's latest version.

        Returns the queues other writers reset in the versions read (empty on the first read);
        they also accumulate in :attr:`resets` until the caller takes them.
        """
        version = self._writer.shared(schemas.ACTION_LOG).version()
        if self.version < 0:
            snapshot = self._store.dataset(
                schemas.ACTION_LOG, f"group = {sql_literal(self.group)}", version=version
            ).to_table()
            snapshot = snapshot.filter(pc.equal(snapshot["group"], self.group))
            self.book.bootstrap(snapshot.to_pylist())
            self.version = version
            self._sequence = max(self._sequence, self.book.sequences.get(self.consumer_id, -1))
            return set()
        if version <= self.version:
            return set()
        try:
            rows = read_versions(
                self._store.uri(schemas.ACTION_LOG),
                self.version + 1,
                version,
                schemas.ACTION_LOG_SCHEMA,
                self._store.storage_options,
            )
        except StoreError:
            # The log files we need are gone (log cleanup): rebuild the state from a snapshot.
            self.book = ClaimBook(self.group)
            self.version = -1
            self.sync()
            return set()
        reset: set[tuple[str, int]] = set()
        if rows.num_rows:
            mine = rows.filter(pc.equal(rows["group"], self.group)).to_pylist()
            self.book.apply(mine)
            reset = {
                (r["topic"], int(r["queue_id"]))
                for r in mine
                if r["action"] == RESET and r["consumer_id"] != self.consumer_id
            }
        self.version = version
        self.resets |= reset
        return reset

    def frontier(self, topic: str, queue_id: int, *, refresh: bool) -> int:
        """The group's lease frontier in a queue as of the private snapshot (-1: never leased)."""
        return lease_frontier(
            self._writer.shared(schemas.ACTION_LOG, fresh=refresh), self.group, topic, queue_id
        )

    # ----------------------------------------------------------------- writing
    def next_sequence(self) -> int:
        """The next action sequence of this consumer (past any the log shows for its id)."""
        self._sequence = max(self._sequence, self.book.sequences.get(self.consumer_id, -1)) + 1
        return self._sequence

    def row(
        self,
        action: str,
        topic: str,
        queue_id: int,
        start: int,
        *,
        end: int | None = None,
        physical_offset: int = -1,
        msg_id: str | None = None,
        reconsume_times: int = 0,
        deadline_ms: int | None = None,
        ts: int,
        sequence: int | None = None,
    ) -> dict[str, Any]:
        """An action-log row of this consumer about ``[start, end)`` (one offset without ``end``)."""
        return {
            "group": self.group,
            "consumer_id": self.consumer_id,
            "sequence": self.next_sequence() if sequence is None else sequence,
            "action": action,
            "topic": topic,
            "queue_id": queue_id,
            "queue_offset": start,
            "end_offset": end,
            "physical_offset": physical_offset,
            "msg_id": msg_id,
            "reconsume_times": reconsume_times,
            "deadline_ms": deadline_ms,
            "ts_ms": ts,
        }

    def commit(self, rows: list[dict[str, Any]], topic: str, queue_id: int, frontier: int) -> int:
        """Commit rows deciding about a queue's leases (and the buffered acks) with the queue's lease
        frontier set to ``frontier``; returns the version.

        Raises:
            CommitConflictError: another commit about the same queue landed first (read again).
            StoreError: the write failed; nothing was committed.
        """
        # Buffered acks and releases first: they were decided before these rows (a release must not
        # reach a lease of the same offset committed here).
        acks = self._ack_rows()
        table = pa.Table.from_pylist(acks + rows, schema=schemas.ACTION_LOG_SCHEMA)
        version = self._writer.append(
            schemas.ACTION_LOG,
            table,
            app_id=lease_app(self.group, topic, queue_id),
            app_version=frontier,
            max_retries=LEASE_COMMIT_RETRIES,
        )
        self._clear_acks()
        if version == self.version + 1:
            self.book.apply(acks + rows)
            self.version = version
        return version

    # ----------------------------------------------------------------- acks and releases
    def buffer(self, action: str, topic: str, queue_id: int, offset: int, deadline_ms: int, ts: int) -> None:
        """Keep an ``ACK`` (or ``RELEASE``) of one offset for the next flush or lease commit."""
        if not self._acks:
            self.oldest_ack = time.monotonic()
        # A release names the lease it gives back (its deadline), so it can never end a later lease.
        self._acks.setdefault((topic, queue_id, action, deadline_ms if action == RELEASE else 0), []).append(
            offset
        )
        self._ack_ts = max(self._ack_ts, ts)
        if self.earliest_deadline is None or deadline_ms < self.earliest_deadline:
            self.earliest_deadline = deadline_ms

    @property
    def buffered(self) -> int:
        return sum(len(v) for v in self._acks.values())

    def _ack_rows(self) -> list[dict[str, Any]]:
        rows = []
        for (topic, queue_id, action, deadline), offsets in self._acks.items():
            for start, end in ranges(offsets):
                lease = deadline if action == RELEASE else None
                rows.append(
                    self.row(action, topic, queue_id, start, end=end, deadline_ms=lease, ts=self._ack_ts)
                )
        return rows

    def _clear_acks(self) -> None:
        self._acks = {}
        self.oldest_ack = None
        self.earliest_deadline = None

    def flush_acks(self, extra: list[dict[str, Any]] | None = None) -> int:
        """Append the buffered acks and releases (with ``extra`` rows that decide no lease either);
        returns how many offsets the acks and releases cover.

        Raises:
            StoreError, CommitConflictError: the write failed; they stay buffered.
        """
        count = self.buffered
        if not count and not extra:
            return 0
        # Acks decide no lease, so they need no particular version: a plain append.
        rows = self._ack_rows() + (extra or [])
        self._writer.append(schemas.ACTION_LOG, pa.Table.from_pylist(rows, schema=schemas.ACTION_LOG_SCHEMA))
        self._clear_acks()
        return count
