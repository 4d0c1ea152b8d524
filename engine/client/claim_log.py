"""One consumer's view of its group's claims in ``action_log``: reading it, writing claim rows, acks.

:class:`ClaimLog` keeps a :class:`~engine.client.claims.ClaimBook` in step with the action log (a
snapshot scan once, then only the new versions), commits claim rows as exactly the next version of
the log (the optimistic claim protocol below), and buffers acks, which change no claim and are
appended blindly or ride along with the next claim commit.

Claim protocol (all state is in ``action_log``; no lock service):

* Every action is a row of ``action_log`` for ``(group, consumer_id, sequence)``: ``PULL`` (a claim,
  with ``deadline_ms``), ``CHANGE_INVISIBLE`` (a new deadline), ``ACK`` and ``NACK``.
* The claim state of a message is a pure function of those rows, evaluated in commit order
  (:class:`ClaimBook`): a ``PULL`` is valid when the message is not finished and has no claim, or
  the current claim's deadline is at or before the row's ``ts_ms``; ``CHANGE_INVISIBLE`` is valid from
  the current claimant before its deadline; ``NACK`` from the current claimant finishes the message
  (the retry job re-puts it into ``%RETRY%<group>``); ``ACK`` finishes it.
* Claim-changing rows (``PULL``, ``CHANGE_INVISIBLE``, ``NACK``) are committed optimistically: the
  consumer reads the action log up to version ``v``, decides against the state at ``v``, and commits
  exactly version ``v + 1`` with Delta's automatic retries disabled. If anyone else committed ``v + 1``
  first the commit fails, the consumer reads the newer versions and decides again. So a claim is
  only ever committed against the complete state before it: two consumers never both hold a
  message while its invisibility lasts, and nothing is claimed after its ack is committed.
* Those commits stamp ``ts_ms`` strictly increasing per group (``max(now, last claim ts + 1)``), so
  commit order can be recovered from the rows alone: a consumer starting up reads the group's rows
  from one snapshot scan, orders claim rows by ``(ts_ms, consumer_id, sequence)`` and applies acks
  after them (an ack is always committed after every claim of its message, so its position does not
  matter). Steady state reads only the new versions of the log.
* Acks change no claim, so they are buffered briefly and appended blindly (or ride along with the
  consumer's next claim commit). An ack is accepted from any consumer that received the message,
  even after its invisibility ended (the message is then not delivered again, though a consumer that
  took it over may still be processing it — at least once).

Not thread-safe: :class:`~engine.client.simple.SimpleConsumer` calls it under its lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.client.claims import ClaimBook, Key
from engine.errors import CommitConflictError, StoreError
from engine.model import MessageExt
from engine.store import schemas
from engine.store.delta_log import read_versions
from engine.store.store import Store, sql_literal


@dataclass
class Held:
    """A message this consumer received and has not acked or nacked yet."""

    sequence: int
    deadline_ms: int
    reconsume_times: int
    msg_id: str
    physical_offset: int

    @classmethod
    def of(cls, received: ReceivedMessage) -> Held:
        """What this consumer keeps of a message it just received."""
        sequence = int(received.receipt_handle.rsplit("#", 1)[1])
        return cls(
            sequence,
            received.invisible_until_ms,
            received.reconsume_times,
            received.msg_id,
            received.physical_offset,
        )


@dataclass(frozen=True)
class ReceivedMessage(MessageExt):
    """A message returned by :meth:`SimpleConsumer.receive`: a :class:`MessageExt` with its claim.

    ``receipt_handle`` names the claim (consumer id and action sequence); ``invisible_until_ms`` is
    when the message becomes visible to the group again unless acked or extended.
    """

    receipt_handle: str = ""
    invisible_until_ms: int = 0


def received_message(
    message: MessageExt, reconsume_times: int, receipt_handle: str, until_ms: int
) -> ReceivedMessage:
    """``message`` as handed to the consumer that claimed it: its delivery count and its claim."""
    values = {f.name: getattr(message, f.name) for f in fields(MessageExt)}
    values["reconsume_times"] = reconsume_times
    return ReceivedMessage(**values, receipt_handle=receipt_handle, invisible_until_ms=until_ms)


class ClaimLog:
    """The claim state of ``group`` as of the action log's latest version read, and this consumer's
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
        # Private table handles: the claim commit must land on exactly the version the state was read
        # at, which a handle shared with other users of ``store`` cannot promise.
        self._writer = Store(store.root, store.storage_options, store.config)
        self.book = ClaimBook(group)
        self.version = -1
        self._sequence = -1
        self._acks: list[dict[str, Any]] = []
        self.oldest_ack: float | None = None  # monotonic time of the oldest buffered ack

    # ----------------------------------------------------------------- reading
    def sync(self) -> bool:
        """Bring the claim state up to the action log's latest version (held by the private handle).

        Returns whether the state moved on.
        """
        version = self._writer.shared(schemas.ACTION_LOG).version()
        if self.version < 0:
            snapshot = self._store.dataset(
                schemas.ACTION_LOG, f"group = {sql_literal(self.group)}", version=version
            ).to_table()
            snapshot = snapshot.filter(pc.equal(snapshot["group"], self.group))
            self.book.bootstrap(snapshot.to_pylist())
        elif version > self.version:
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
                return self.sync()
            if rows.num_rows:
                rows = rows.filter(pc.equal(rows["group"], self.group))
                self.book.apply(rows.to_pylist())
        else:
            return False
        self.version = version
        return True

    # ----------------------------------------------------------------- writing
    def next_sequence(self) -> int:
        """The next action sequence of this consumer (past any the log shows for its id)."""
        self._sequence = max(self._sequence, self.book.sequences.get(self.consumer_id, -1)) + 1
        return self._sequence

    def row(
        self,
        action: str,
        where: MessageExt | Key,
        sequence: int,
        ts: int,
        reconsume_times: int,
        deadline_ms: int | None,
        held: Held | None = None,
    ) -> dict[str, Any]:
        """An action-log row of this consumer about a message (or a held message's key)."""
        if isinstance(where, MessageExt):
            topic, queue_id, offset = where.topic, where.queue_id, where.queue_offset
            physical, msg_id = where.physical_offset, where.msg_id
        else:
            topic, queue_id, offset = where
            assert held is not None
            physical, msg_id = held.physical_offset, held.msg_id
        return {
            "group": self.group,
            "consumer_id": self.consumer_id,
            "sequence": sequence,
            "action": action,
            "topic": topic,
            "queue_id": queue_id,
            "queue_offset": offset,
            "physical_offset": physical,
            "msg_id": msg_id,
            "reconsume_times": reconsume_times,
            "deadline_ms": deadline_ms,
            "ts_ms": ts,
        }

    def commit(self, rows: list[dict[str, Any]]) -> bool:
        """Commit claim rows (and buffered acks) as exactly the next action-log version.

        Returns False when another writer took that version (nothing written).
        """
        acks = self._acks
        table = pa.Table.from_pylist(rows + acks, schema=schemas.ACTION_LOG_SCHEMA)
        try:
            version = self._writer.append(schemas.ACTION_LOG, table, max_retries=0)
        except CommitConflictError:
            return False
        self._acks = []
        self.oldest_ack = None
        if version == self.version + 1:
            self.book.apply(rows + acks)
            self.version = version
        return True

    # ----------------------------------------------------------------- acks
    def buffer_ack(self, row: dict[str, Any]) -> None:
        """Keep an ``ACK`` row for the next :meth:`flush_acks` or claim commit."""
        if not self._acks:
            self.oldest_ack = time.monotonic()
        self._acks.append(row)

    def flush_acks(self) -> int:
        """Append the buffered acks; returns how many were written."""
        acks = self._acks
        if not acks:
            return 0
        # Acks change no claim, so they need no particular version: a plain append.
        self._writer.append(schemas.ACTION_LOG, pa.Table.from_pylist(acks, schema=schemas.ACTION_LOG_SCHEMA))
        self._acks = []
        self.oldest_ack = None
        return len(acks)
