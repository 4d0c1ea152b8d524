"""One simple consumer's lease state, and its reads and commits of ``action_log``.

:class:`LeaseState` holds all that :class:`~engine.client.simple.leases.Leases` owns (the group's
lease book as of the action log's latest version read, the buffer of leased messages, what the user
holds, the consumer's writer, the pacing of its leases) and the steps every part of it takes: bring
the book up to the log's latest version, commit rows deciding about a queue's leases, read leased
messages from the consume queue. What acts on it: :mod:`.leasing` (taking leases), :mod:`.holding`
(what the user holds) and :mod:`.leases` (the scan, handing out, the protocol).
"""

from __future__ import annotations

import collections
import zlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.client.offsets import ConsumeFrom
from engine.client.simple.deliveries import Held, Key, Leased
from engine.errors import StoreError
from engine.model import MessageExt
from engine.protocol.actions import RESET
from engine.protocol.lease_book import LeaseBook
from engine.protocol.selectors import MessageSelector
from engine.store import schemas
from engine.store.action_log import ActionLogWriter
from engine.store.consume_queue import QueueIndex
from engine.store.delta import VERSION_COLUMN, read_versions
from engine.store.store import Store, sql_literal


class LeaseState:
    """The state of :class:`~engine.client.simple.leases.Leases` (its arguments) and the reads and
    commits of the log its parts make."""

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

    # ----------------------------------------------------------------- reading messages
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


__all__ = ["LeaseState"]
