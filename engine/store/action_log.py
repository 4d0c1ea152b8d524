"""The ``action_log`` table: consumer actions (:mod:`engine.protocol.actions`), written in micro-batches.

The action log is the consumers' side of the broker's bookkeeping, as QMQ's action log: the
retry/DLQ job turns NACKs (and unacked-past-deadline pulls) into re-puts, and the pull-log job
rebuilds each consumer's pull log from it. Every row carries ``(group, consumer_id, sequence)``;
the sequence increases per consumer, across restarts of the same consumer id.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engine.closing import Closing
from engine.errors import CommitConflictError, InvalidArgumentError
from engine.model import MessageExt
from engine.protocol.actions import ACTIONS, RESET
from engine.protocol.names import validate_group_name
from engine.store import schemas
from engine.store.commit_markers import lease_app
from engine.store.delta import Snapshot, backoff
from engine.store.store import Store, now_ms, sql_literal

ADMIN_CONSUMER_ID = "%ADMIN%"  # the consumer id of rows written by administration (offset resets)


def lease_frontier(snapshot: Snapshot, group: str, topic: str, queue_id: int) -> int:
    """A group's lease frontier in a queue (the next offset never leased; -1 before any lease), as
    of an ``action_log`` snapshot."""
    return snapshot.app_version(lease_app(group, topic, queue_id))


def reset_leases(
    store: Store, group: str, topic: str, offsets: Mapping[int, int], *, attempts: int = 64
) -> int:
    """Move a group's lease position in queues of ``topic`` (queue id -> offset): a live offset reset
    for consumers with per-message ack. Each queue the group has leased from gets one ``RESET`` row
    with its lease frontier set to the offset; the group's running consumers drop what they hold of
    it and lease from there on. Queues never leased from are left alone (their first lease starts at
    the group's committed offset). Returns the number of queues reset.

    Raises:
        CommitConflictError: lost ``attempts`` races with the group's lease commits on a queue.
        StoreError: the write failed.
    """
    snapshot = store.shared(schemas.ACTION_LOG)
    reset = 0
    for queue_id, offset in sorted(offsets.items()):
        if lease_frontier(snapshot, group, topic, queue_id) < 0:
            continue
        ts = now_ms()
        row = {
            "group": group,
            "consumer_id": ADMIN_CONSUMER_ID,
            "sequence": ts,
            "action": RESET,
            "topic": topic,
            "queue_id": queue_id,
            "queue_offset": offset,
            "physical_offset": -1,
            "reconsume_times": 0,
            "ts_ms": ts,
        }
        table = pa.Table.from_pylist([row], schema=schemas.ACTION_LOG_SCHEMA)
        app = lease_app(group, topic, queue_id)
        for attempt in range(attempts):
            try:
                store.append(schemas.ACTION_LOG, table, app_id=app, app_version=offset)
                break
            except CommitConflictError:
                backoff(attempt)
        else:
            raise CommitConflictError(
                f"offset reset of {group} on {topic}:{queue_id} lost {attempts} races with its consumers",
                table=schemas.ACTION_LOG,
                group=group,
            )
        reset += 1
    return reset


def last_sequence(store: Store, group: str, consumer_id: str) -> int:
    """Highest sequence recorded by one consumer of a group (-1 if none)."""
    table = store.read(
        schemas.ACTION_LOG,
        predicate=f"group = {sql_literal(group)}",
        filter=(ds.field("group") == group) & (ds.field("consumer_id") == consumer_id),
        columns=["sequence"],
    )
    if table.num_rows == 0:
        return -1
    return int(pc.max(table["sequence"]).as_py())


class ActionLogWriter(Closing):
    """Buffers one consumer's actions and appends them to ``action_log`` in micro-batches.

    Thread-safe. :meth:`record` only buffers (and flushes itself once ``batch_rows`` rows are
    waiting); call :meth:`flush` or :meth:`flush_if_due` from the consumer's loop, and
    :meth:`close` (or use it as a context manager) at shutdown. A failed flush keeps its rows
    buffered, so the next flush retries them in order.

    Args:
        store: an open store.
        group: the consumer group.
        consumer_id: the consumer instance; sequences continue from its last recorded one.
        batch_rows: buffered rows that trigger a flush from :meth:`record`.
        linger_ms: age of the oldest buffered row after which :meth:`flush_if_due` flushes.

    Raises:
        InvalidArgumentError: a bad group, consumer id or batch setting.
    """

    def __init__(
        self,
        store: Store,
        group: str,
        consumer_id: str,
        *,
        batch_rows: int = 1024,
        linger_ms: int = 200,
    ) -> None:
        self.group = validate_group_name(group)
        if not isinstance(consumer_id, str) or not consumer_id:
            raise InvalidArgumentError("consumer_id must be a non-empty string", consumer_id=consumer_id)
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise InvalidArgumentError(
                f"batch_rows {batch_rows!r} must be an int >= 1", batch_rows=batch_rows
            )
        if isinstance(linger_ms, bool) or not isinstance(linger_ms, int) or linger_ms < 0:
            raise InvalidArgumentError(f"linger_ms {linger_ms!r} must be an int >= 0", linger_ms=linger_ms)
        self.consumer_id = consumer_id
        self._store = store
        self._batch_rows = batch_rows
        self._linger_s = linger_ms / 1000
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._oldest = 0.0
        self._sequence: int | None = None  # last assigned; read lazily from the table

    def _next_sequence(self) -> int:
        if self._sequence is None:
            self._sequence = last_sequence(self._store, self.group, self.consumer_id)
        self._sequence += 1
        return self._sequence

    def record(
        self,
        action: str,
        message: MessageExt | None = None,
        *,
        topic: str | None = None,
        queue_id: int | None = None,
        queue_offset: int | None = None,
        physical_offset: int | None = None,
        msg_id: str | None = None,
        reconsume_times: int | None = None,
        deadline_ms: int | None = None,
        ts_ms: int | None = None,
    ) -> int:
        """Buffer one action and return its sequence.

        Position fields default to the message's; without a message, ``topic``, ``queue_id``,
        ``queue_offset`` and ``physical_offset`` are required.

        Args:
            action: one of :data:`ACTIONS`.
            message: the message the action is about.
            topic, queue_id, queue_offset, physical_offset, msg_id, reconsume_times: override
                (or, without a message, give) the message's position and attempt count.
            deadline_ms: for PULL / CHANGE_INVISIBLE: when the message becomes visible again.
            ts_ms: time of the action (default now).

        Raises:
            InvalidArgumentError: an unknown action or a missing position field.
        """
        if action not in ACTIONS:
            raise InvalidArgumentError(
                f"action {action!r} is unknown; actions: {', '.join(sorted(ACTIONS))}", action=action
            )
        row: dict[str, Any] = {
            "group": self.group,
            "consumer_id": self.consumer_id,
            "action": action,
            "topic": topic if topic is not None else (message.topic if message else None),
            "queue_id": queue_id if queue_id is not None else (message.queue_id if message else None),
            "queue_offset": queue_offset
            if queue_offset is not None
            else (message.queue_offset if message else None),
            "physical_offset": physical_offset
            if physical_offset is not None
            else (message.physical_offset if message else None),
            "msg_id": msg_id if msg_id is not None else (message.msg_id if message else None),
            "reconsume_times": reconsume_times
            if reconsume_times is not None
            else (message.reconsume_times if message else 0),
            "deadline_ms": deadline_ms,
        }
        missing = [k for k in ("topic", "queue_id", "queue_offset", "physical_offset") if row[k] is None]
        if missing:
            raise InvalidArgumentError(
                f"action {action} needs a message or {', '.join(missing)}", action=action, missing=missing
            )
        with self._lock:
            row["sequence"] = sequence = self._next_sequence()
            row["ts_ms"] = ts_ms if ts_ms is not None else now_ms()
            if not self._rows:
                self._oldest = time.monotonic()
            self._rows.append(row)
            full = len(self._rows) >= self._batch_rows
        if full:
            self.flush()
        return sequence

    @property
    def pending(self) -> int:
        """Rows buffered and not yet committed."""
        with self._lock:
            return len(self._rows)

    def flush_if_due(self) -> int:
        """Flush when the oldest buffered row has waited ``linger_ms``; returns rows written."""
        with self._lock:
            due = bool(self._rows) and time.monotonic() - self._oldest >= self._linger_s
        return self.flush() if due else 0

    def flush(self) -> int:
        """Append every buffered row in one Delta commit; returns the rows written.

        Raises:
            StoreError, CommitConflictError: the write failed; the rows stay buffered.
        """
        with self._flush_lock:
            with self._lock:
                rows, self._rows = self._rows, []
            if not rows:
                return 0
            try:
                self._store.append(
                    schemas.ACTION_LOG, pa.Table.from_pylist(rows, schema=schemas.ACTION_LOG_SCHEMA)
                )
            except BaseException:
                with self._lock:
                    self._rows[:0] = rows
                    self._oldest = time.monotonic()
                raise
            return len(rows)

    def close(self) -> None:
        """Flush what is buffered."""
        self.flush()


def read_actions(store: Store, group: str, action: str | None = None) -> list[dict[str, Any]]:
    """Every recorded action of a group (optionally one kind), ordered by consumer and sequence."""
    row_filter = ds.field("group") == group
    if action is not None:
        row_filter &= ds.field("action") == action
    rows = store.read(schemas.ACTION_LOG, predicate=f"group = {sql_literal(group)}", filter=row_filter)
    return sorted(rows.to_pylist(), key=lambda r: (r["consumer_id"], r["sequence"]))
