"""The ``action_log`` table: consumer actions (:mod:`engine.protocol.actions`), written in micro-batches.

The action log is the consumers' side of the broker's bookkeeping, as QMQ's action log: the
retry/DLQ job turns NACKs (and unacked-past-deadline pulls) into re-puts, and the pull-log job
rebuilds each consumer's pull log from it. Every row carries ``(group, consumer_id, sequence)``;
the sequence increases per consumer, across restarts of the same consumer id.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engine.closing import Closing
from engine.errors import CommitConflictError, InvalidArgumentError
from engine.model import MessageExt
from engine.protocol.actions import ACK, ACTIONS, RELEASE, RESET
from engine.protocol.lease_book import ranges
from engine.protocol.names import validate_group_name
from engine.store import schemas
from engine.store.commit_markers import lease_app
from engine.store.delta import FollowedLog, Snapshot, backoff, direct_append_enabled, follow_log
from engine.store.store import Store, now_ms, sql_literal

ADMIN_CONSUMER_ID = "%ADMIN%"  # the consumer id of rows written by administration (offset resets)
LEASE_COMMIT_RETRIES = 32  # rebases past other queues' leases and acks before a lease commit gives up


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
    """One consumer's writes to ``action_log``: its sequence, its rows, what it buffers, and the
    commits that decide a queue's leases. The one writer of the table for every consumer (push
    consumers and their queue workers, the simple consumer, the wire).

    Two ways to write:

    * Buffered, in micro-batches: :meth:`record` (a row per action: NACK, PULL, ...) and
      :meth:`buffer_ack` (ACK and RELEASE of single offsets, written as ranges). Nothing decides a
      lease, so a flush is a plain append (:meth:`flush`, :meth:`flush_if_due`, :meth:`close`). A
      failed flush keeps what it took, so the next flush retries it in order.
    * Lease decisions: :meth:`commit_lease` commits rows about one queue's leases (with whatever is
      buffered, first) with the group's lease frontier of that queue (the Delta app transaction
      :func:`~engine.store.commit_markers.lease_app`), so of two decisions about one queue exactly
      one lands; the loser reads again (:meth:`frontier`, :meth:`latest_version`) and decides again.
      A commit and the frontier it was decided from must come from one view of the log, which a
      handle shared with other users of the store cannot promise: on a local store the writer follows
      the log itself and commits directly (:mod:`engine.store.delta.followed_log`), elsewhere (or
      with ``MQ_DIRECT_APPEND=0``) through its own delta-rs handle.

    Thread-safe.

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
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._oldest = 0.0
        self._sequence: int | None = None  # last assigned; read lazily from the table
        self._acks = _Acks()
        self._snapshot: Snapshot | None = None  # the writer's own handle, for lease decisions
        # On a local store the writer follows the log itself and commits its decisions directly.
        self._direct = store.is_local and direct_append_enabled()
        self._log: FollowedLog | None = None

    # ----------------------------------------------------------------- sequences and rows
    def next_sequence(self) -> int:
        """The next action sequence of this consumer (past any the log shows for its id)."""
        with self._lock:
            if self._sequence is None:
                self._sequence = last_sequence(self._store, self.group, self.consumer_id)
            self._sequence += 1
            return self._sequence

    def known_sequence(self, last: int) -> None:
        """The caller read every row of this consumer's group (a lease book): the consumer's last
        sequence there is ``last`` (-1: none), so no read of the table is needed to go on."""
        with self._lock:
            self._sequence = max(-1 if self._sequence is None else self._sequence, last)

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
        """An action-log row of this consumer about ``[start, end)`` of a queue (one offset without
        ``end``), with the next sequence unless ``sequence`` is given."""
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

    # ----------------------------------------------------------------- buffered actions
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
            row["sequence"] = sequence = self.next_sequence()
            row["ts_ms"] = ts_ms if ts_ms is not None else now_ms()
            if not self._rows:
                self._oldest = time.monotonic()
            self._rows.append(row)
            full = len(self._rows) >= self._batch_rows
        if full:
            self.flush()
        return sequence

    def buffer_ack(
        self, action: str, topic: str, queue_id: int, offset: int, deadline_ms: int, ts: int
    ) -> None:
        """Keep an ``ACK`` (or ``RELEASE``) of one offset, leased until ``deadline_ms``, for the next
        flush or lease commit; consecutive offsets are written as one range.

        Raises:
            InvalidArgumentError: another action.
        """
        if action not in (ACK, RELEASE):
            raise InvalidArgumentError(f"buffer_ack takes ACK or RELEASE, not {action!r}", action=action)
        with self._lock:
            self._acks.add(action, topic, queue_id, offset, deadline_ms, ts)

    @property
    def pending(self) -> int:
        """Rows and acked or released offsets buffered and not yet committed."""
        with self._lock:
            return len(self._rows) + self._acks.count

    @property
    def buffered_acks(self) -> int:
        """Acked or released offsets buffered and not yet committed."""
        with self._lock:
            return self._acks.count

    @property
    def oldest_ack(self) -> float | None:
        """Monotonic time the oldest buffered ack was buffered (None: none is)."""
        with self._lock:
            return self._acks.oldest

    @property
    def earliest_deadline(self) -> int | None:
        """The earliest lease deadline among the buffered acks (None: none is buffered)."""
        with self._lock:
            return self._acks.earliest_deadline

    def _take(self) -> tuple[list[dict[str, Any]], _Acks, list[dict[str, Any]]]:
        """Everything buffered taken out of the buffers: as rows (acks and releases first, as
        ranges, then the recorded rows), and the two buffers as they were, to put back if the commit
        fails."""
        with self._lock:
            acks, recorded = self._acks, self._rows
            self._acks, self._rows = _Acks(), []
            rows = [
                self.row(action, topic, queue_id, start, end=end, deadline_ms=lease, ts=acks.ts)
                for action, topic, queue_id, start, end, lease in acks.ranges()
            ]
            return rows + recorded, acks, recorded

    def _put_back(self, acks: _Acks, recorded: list[dict[str, Any]]) -> None:
        """What :meth:`_take` took for a commit that failed, back in front of what came since."""
        with self._lock:
            acks.extend(self._acks)
            self._acks = acks
            if recorded:
                self._rows[:0] = recorded
                self._oldest = time.monotonic()

    def flush_if_due(self) -> int:
        """Flush when the oldest buffered row has waited ``linger_ms``; returns messages covered."""
        with self._lock:
            due = bool(self._rows) and time.monotonic() - self._oldest >= self._linger_s
        return self.flush() if due else 0

    def flush(self, extra: list[dict[str, Any]] | None = None) -> int:
        """Append everything buffered (and ``extra`` rows, which decide no lease either) in one Delta
        commit; returns the messages the buffered actions cover (a recorded row each, an acked or
        released offset each).

        Raises:
            StoreError, CommitConflictError: the write failed; what was buffered stays buffered.
        """
        with self._flush_lock:
            rows, acks, recorded = self._take()
            rows += extra or []
            if not rows:
                return 0
            try:
                self._store.append(
                    schemas.ACTION_LOG, pa.Table.from_pylist(rows, schema=schemas.ACTION_LOG_SCHEMA)
                )
            except BaseException:
                self._put_back(acks, recorded)
                raise
            return acks.count + len(recorded)

    def close(self) -> None:
        """Flush what is buffered."""
        self.flush()

    # ----------------------------------------------------------------- lease decisions
    def _followed(self, *, refresh: bool) -> FollowedLog | None:
        """The writer's own view of a local action log, followed through its commit files (moved on
        to the latest version when ``refresh``): lease decisions are then committed directly
        (:mod:`engine.store.delta.followed_log`). None where they go through delta-rs."""
        log = self._log
        if log is None:
            if not self._direct:
                return None
            snapshot = self._store.snapshot(schemas.ACTION_LOG)
            log = self._log = follow_log(
                snapshot,
                schemas.ACTION_LOG_SCHEMA,
                lambda version: self._store.snapshot(schemas.ACTION_LOG, version),
            )
            if log is None:
                self._direct = False
            return log
        if refresh and log.follow() is None:
            self._log = None  # the table changed under it, or its log was cleaned past it
            return self._followed(refresh=True)
        return log

    def _handle(self, *, refresh: bool) -> Snapshot:
        """The writer's own ``action_log`` handle, moved on to the latest version when ``refresh``
        (and opened anew once it has aged: a long-lived handle slows every commit)."""
        snap = self._snapshot
        if snap is None or (refresh and snap.aged):
            snap = self._snapshot = self._store.snapshot(schemas.ACTION_LOG)
        elif refresh:
            snap.refresh()
        return snap

    def latest_version(self) -> int:
        """The table's latest version, read through the writer's own handle (which it moves on)."""
        with self._flush_lock:
            log = self._followed(refresh=True)
            return log.version if log is not None else self._handle(refresh=True).version()

    def frontier(self, topic: str, queue_id: int, *, refresh: bool) -> int:
        """The group's lease frontier in a queue (-1: never leased) as of the writer's own handle,
        moved on to the latest version first when ``refresh``: what a lease decision is based on."""
        with self._flush_lock:
            log = self._followed(refresh=refresh)
            if log is not None:
                return log.app_version(lease_app(self.group, topic, queue_id))
            return lease_frontier(self._handle(refresh=refresh), self.group, topic, queue_id)

    def lease_start(
        self,
        topic: str,
        queue_id: int,
        low: int,
        first_offset: Callable[[], int],
        *,
        ts: int,
        refresh: bool,
    ) -> tuple[int, list[dict[str, Any]]]:
        """Where the group's next lease of a queue starts, and the rows that must go with it: past
        its :meth:`frontier`, or, in a queue it never leased, at ``first_offset()`` with a RESET row
        recording that start; never below the queue's lowest offset ``low`` (retention)."""
        frontier = self.frontier(topic, queue_id, refresh=refresh)
        rows: list[dict[str, Any]] = []
        start = frontier
        if frontier < 0:
            start = first_offset()
            rows.append(self.row(RESET, topic, queue_id, start, ts=ts))
        return max(start, low), rows

    def commit_lease(
        self, rows: list[dict[str, Any]], topic: str, queue_id: int, frontier: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """Commit rows deciding about a queue's leases, with everything buffered first (it was
        decided before them: a release must not reach a lease of the same offset committed here),
        and the queue's lease frontier set to ``frontier``.

        Returns:
            The version committed and every row it holds, in order.

        Raises:
            CommitConflictError: another commit about the same queue landed first (read again and
                decide again); the buffered actions stay buffered.
            StoreError: the write failed; nothing was committed.
        """
        with self._flush_lock:
            taken, acks, recorded = self._take()
            committed = taken + rows
            table = pa.Table.from_pylist(committed, schema=schemas.ACTION_LOG_SCHEMA)
            app = lease_app(self.group, topic, queue_id)
            try:
                log = self._followed(refresh=False)
                if log is None:
                    version = self._store.append(
                        schemas.ACTION_LOG,
                        table,
                        app_id=app,
                        app_version=frontier,
                        max_retries=LEASE_COMMIT_RETRIES,
                        snapshot=self._handle(refresh=False),
                    )
                else:
                    landed = log.commit(table, app, frontier, attempts=LEASE_COMMIT_RETRIES + 1)
                    if landed is None:
                        self._log = None
                        raise CommitConflictError(
                            f"the action log changed under {self.consumer_id}'s decision about "
                            f"{topic}:{queue_id}: read again",
                            table=schemas.ACTION_LOG,
                            group=self.group,
                        )
                    version = landed
            except BaseException:
                self._put_back(acks, recorded)
                raise
            return version, committed


class _Acks:
    """Buffered acks and releases of single offsets, kept so that consecutive offsets are written
    as one range."""

    def __init__(self) -> None:
        # (topic, queue, action, released lease's deadline or 0) -> offsets
        self.offsets: dict[tuple[str, int, str, int], list[int]] = {}
        self.ts = 0  # the time the rows carry: the newest buffered
        self.oldest: float | None = None  # monotonic time the oldest was buffered
        self.earliest_deadline: int | None = None  # of the leases they belong to
        self.count = 0

    def add(self, action: str, topic: str, queue_id: int, offset: int, deadline_ms: int, ts: int) -> None:
        if self.oldest is None:
            self.oldest = time.monotonic()
        # A release names the lease it gives back (its deadline), so it can never end a later lease.
        key = (topic, queue_id, action, deadline_ms if action == RELEASE else 0)
        self.offsets.setdefault(key, []).append(offset)
        self.ts = max(self.ts, ts)
        if self.earliest_deadline is None or deadline_ms < self.earliest_deadline:
            self.earliest_deadline = deadline_ms
        self.count += 1

    def extend(self, newer: _Acks) -> None:
        """Append the acks buffered after these."""
        for key, offsets in newer.offsets.items():
            self.offsets.setdefault(key, []).extend(offsets)
        self.ts = max(self.ts, newer.ts)
        if self.oldest is None:
            self.oldest = newer.oldest
        if newer.earliest_deadline is not None and (
            self.earliest_deadline is None or newer.earliest_deadline < self.earliest_deadline
        ):
            self.earliest_deadline = newer.earliest_deadline
        self.count += newer.count

    def ranges(self) -> list[tuple[str, str, int, int, int, int | None]]:
        """(action, topic, queue_id, start, end, released lease's deadline or None) per run."""
        return [
            (action, topic, queue_id, start, end, deadline if action == RELEASE else None)
            for (topic, queue_id, action, deadline), offsets in self.offsets.items()
            for start, end in ranges(offsets)
        ]


def read_actions(store: Store, group: str, action: str | None = None) -> list[dict[str, Any]]:
    """Every recorded action of a group (optionally one kind), ordered by consumer and sequence."""
    row_filter = ds.field("group") == group
    if action is not None:
        row_filter &= ds.field("action") == action
    rows = store.read(schemas.ACTION_LOG, predicate=f"group = {sql_literal(group)}", filter=row_filter)
    return sorted(rows.to_pylist(), key=lambda r: (r["consumer_id"], r["sequence"]))
