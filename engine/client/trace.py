"""The life of one message, read from the logs themselves (``Admin.trace`` / ``mq message trace``).

RocketMQ needs a separate trace topic that clients write to; here every step already left a row:

- ``commit_log`` (every shard): every copy of the message. A copy keeps the uniq key through the
  schedule topic (delays, retries) and transactions; a retry or dead-letter copy records the first
  failed copy's offset id in ``ORIGIN_MESSAGE_ID``, and a dead letter resent to its topic keeps
  that property under a new uniq key. The family of copies is closed over both links.
- ``consume_queue``: each copy's dispatch into its queue; ``index``: its keys.
- ``action_log``: PULL (a lease to one consumer of a group), ACK, NACK, CHANGE_INVISIBLE, EXPIRED.
- ``pull_log``: the consumer's pull sequence for it.
- ``consumer_offset``: the first commit of each group (or broadcasting instance) past the copy's
  queue offset: the group consumed it then.

Reads are pruned by store time (a copy is never stored before the first one) and by topic; the
family search reads the commit log's id columns, never its bodies.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engine.client.queries import find_message
from engine.model import MessageExt
from engine.protocol.names import (
    DLQ_PREFIX,
    PROPERTY_ORIGIN_MESSAGE_ID,
    RETRY_PREFIX,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
)
from engine.store import schemas
from engine.store.commit_log import read_commit_logs
from engine.store.consume_queue import QueueIndex
from engine.store.store import Store, sql_literal


class TraceKind(enum.StrEnum):
    """What happened to a message, in the order a message usually lives it."""

    STORED = "STORED"  # the first copy in a user topic
    HALF = "HALF"  # a transaction's half message, waiting for its decision
    SCHEDULED = "SCHEDULED"  # waiting in the schedule topic (delay, timer or retry back-off)
    REPUT = "REPUT"  # stored again in a user topic (delivered from the schedule, committed transaction)
    RETRY = "RETRY"  # stored in a group's %RETRY% topic
    DEAD_LETTERED = "DEAD_LETTERED"  # stored in a group's %DLQ% topic
    RESENT = "RESENT"  # a dead letter sent back to its topic (a new uniq key)
    DISPATCHED = "DISPATCHED"  # entered its consume queue: pullable
    INDEXED = "INDEXED"  # its keys are in the index
    PULLED = "PULLED"  # leased to one consumer of a group
    PULL_LOGGED = "PULL_LOGGED"  # in the consumer's pull log
    ACKED = "ACKED"
    NACKED = "NACKED"
    INVISIBLE_CHANGED = "INVISIBLE_CHANGED"
    EXPIRED = "EXPIRED"
    CONSUMED = "CONSUMED"  # the group's committed offset moved past it


_ORDER = {kind: i for i, kind in enumerate(TraceKind)}
_ACTIONS = {
    "PULL": TraceKind.PULLED,
    "ACK": TraceKind.ACKED,
    "NACK": TraceKind.NACKED,
    "CHANGE_INVISIBLE": TraceKind.INVISIBLE_CHANGED,
    "EXPIRED": TraceKind.EXPIRED,
}
_ID_COLUMNS = ["physical_offset", "msg_id", "uniq_key", "properties"]


@dataclass(frozen=True)
class TraceEvent:
    """One step of a message's life: what, when (epoch ms; None when the log has no time), which
    copy (topic, queue, offsets, the message's id and the copy's offset msg id), and for
    consumption which group and consumer."""

    kind: TraceKind
    ts_ms: int | None
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    msg_id: str
    offset_msg_id: str
    group: str | None = None
    consumer_id: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class MessageTrace:
    """A message's copies (in store order) and every event, in time order.

    ``msg_id`` is the message's id (the unique id its producer got, :attr:`MessageExt.msg_id`),
    whichever id the trace was asked for; ``uniq_key`` is the same id (RocketMQ's name for it).
    """

    msg_id: str
    uniq_key: str
    copies: tuple[MessageExt, ...]
    events: tuple[TraceEvent, ...]

    def kinds(self) -> list[TraceKind]:
        """The kinds of the events, in order (handy for checks)."""
        return [e.kind for e in self.events]


# ----------------------------------------------------------------- finding the copies
def _start(store: Store, msg_id: str, index: QueueIndex) -> tuple[set[str], int]:
    """The uniq key to start from and a lower bound on the store time of its copies."""
    message = find_message(store, msg_id, index=index)
    return {message.uniq_key}, min(message.born_ts_ms, message.store_ts_ms)


def _family(store: Store, uniq_keys: set[str], since_ms: int | None) -> list[int]:
    """Physical offsets of every copy linked to ``uniq_keys`` (same uniq key, or an
    ``ORIGIN_MESSAGE_ID`` naming a copy, either way), closed over both links. Rows stored before
    ``since_ms`` are read only when a copy names an origin that is not found after it."""
    predicate = None if since_ms is None else f"store_ts_ms >= {int(since_ms)}"
    row_filter = None if since_ms is None else ds.field("store_ts_ms") >= since_ms
    ids = read_commit_logs(store, predicate=predicate, filter=row_filter, columns=_ID_COLUMNS)
    origin = pc.map_lookup(ids["properties"], pa.scalar(PROPERTY_ORIGIN_MESSAGE_ID), "first")
    keys, msg_ids = set(uniq_keys), set[str]()
    chosen = 0
    while True:
        wanted_ids = pa.array(sorted(msg_ids), pa.string())
        mask = pc.or_(
            pc.or_(
                pc.is_in(ids["uniq_key"], value_set=pa.array(sorted(keys), pa.string())),
                pc.is_in(ids["msg_id"], value_set=wanted_ids),
            ),
            pc.fill_null(pc.is_in(origin, value_set=wanted_ids), False),
        )
        picked = ids.filter(mask)
        origins = {o for o in origin.filter(mask).to_pylist() if o}
        keys |= set(picked["uniq_key"].to_pylist())
        msg_ids |= set(picked["msg_id"].to_pylist()) | origins
        if picked.num_rows == chosen:
            break
        chosen = picked.num_rows
    if since_ms is not None and not origins <= set(picked["msg_id"].to_pylist()):
        return _family(store, keys, None)  # an origin was stored before the first copy found
    return sorted(int(p) for p in picked["physical_offset"].to_pylist())


# ----------------------------------------------------------------- events
def _copy_kind(message: MessageExt, first_user_key: str | None, seen_user: bool, seen_dlq: bool) -> TraceKind:
    topic = message.topic
    if topic == SCHEDULE_TOPIC:
        return TraceKind.SCHEDULED
    if topic == TRANS_HALF_TOPIC:
        return TraceKind.HALF
    if topic.startswith(RETRY_PREFIX):
        return TraceKind.RETRY
    if topic.startswith(DLQ_PREFIX):
        return TraceKind.DEAD_LETTERED
    # A resend keeps the message's id (older resends took a new one): a user-topic copy after a
    # dead letter is one.
    if seen_dlq or (first_user_key is not None and message.uniq_key != first_user_key):
        return TraceKind.RESENT
    return TraceKind.REPUT if seen_user else TraceKind.STORED


def _event(kind: TraceKind, ts: int | None, m: MessageExt, **extra: Any) -> TraceEvent:
    return TraceEvent(
        kind, ts, m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.msg_id, m.offset_msg_id, **extra
    )


def _copy_events(copies: list[MessageExt]) -> list[TraceEvent]:
    events = []
    first_user_key: str | None = None
    seen_user = seen_dlq = False
    for m in copies:
        kind = _copy_kind(m, first_user_key, seen_user, seen_dlq)
        seen_dlq = seen_dlq or kind is TraceKind.DEAD_LETTERED
        user = kind in (TraceKind.STORED, TraceKind.REPUT, TraceKind.RESENT)
        if user and first_user_key is None:
            first_user_key = m.uniq_key
        # A copy that waited (delay, transaction) enters its topic as a re-put, not a first store.
        seen_user = seen_user or user or kind in (TraceKind.SCHEDULED, TraceKind.HALF)
        detail = f"reconsume_times {m.reconsume_times}" if m.reconsume_times else ""
        events.append(_event(kind, m.store_ts_ms, m, detail=detail))
    return events


def _rows_about(
    store: Store, table: str, copies: list[MessageExt], columns: list[str] | None = None
) -> list[dict[str, Any]]:
    """Rows of ``table`` whose ``physical_offset`` is one of the copies', files pruned by topic."""
    topics = sorted({m.topic for m in copies})
    predicate = "topic IN (" + ", ".join(sql_literal(t) for t in topics) + ")"
    offsets = pa.array([m.physical_offset for m in copies], pa.int64())
    row_filter = ds.field("topic").isin(topics) & ds.field("physical_offset").isin(offsets)
    rows: list[dict[str, Any]] = store.read(
        table, predicate=predicate, filter=row_filter, columns=columns
    ).to_pylist()
    return rows


def _action_rows(store: Store, copies: list[MessageExt]) -> list[tuple[dict[str, Any], MessageExt]]:
    """``action_log`` rows about the copies: single-message rows by physical offset, and leased or
    acked ranges (``[queue_offset, end_offset)``) covering a copy's queue offset."""
    topics = sorted({m.topic for m in copies})
    predicate = "topic IN (" + ", ".join(sql_literal(t) for t in topics) + ")"
    offsets = pa.array([m.physical_offset for m in copies], pa.int64())
    ranged = ds.field("end_offset").is_valid() & (
        ds.field("queue_offset") <= max(m.queue_offset for m in copies)
    )
    row_filter = ds.field("topic").isin(topics) & (ds.field("physical_offset").isin(offsets) | ranged)
    by_offset = {m.physical_offset: m for m in copies}
    out = []
    for row in store.read(schemas.ACTION_LOG, predicate=predicate, filter=row_filter).to_pylist():
        end = row.get("end_offset")
        if end is None:
            found = by_offset.get(int(row["physical_offset"]))
            if found is not None:
                out.append((row, found))
            continue
        out.extend(
            (row, m)
            for m in copies
            if (m.topic, m.queue_id) == (row["topic"], row["queue_id"])
            and int(row["queue_offset"]) <= m.queue_offset < int(end)
        )
    return out


def _log_events(store: Store, copies: list[MessageExt]) -> list[TraceEvent]:
    by_offset = {m.physical_offset: m for m in copies}
    events = []
    for row in _rows_about(store, schemas.CONSUME_QUEUE, copies):
        m = by_offset[int(row["physical_offset"])]
        events.append(
            _event(
                TraceKind.DISPATCHED,
                int(row["store_ts_ms"]),
                m,
                detail=f"commit-log version {row['log_version']}",
            )
        )
    for row in _rows_about(store, schemas.INDEX, copies):
        m = by_offset[int(row["physical_offset"])]
        events.append(
            _event(TraceKind.INDEXED, int(row["store_ts_ms"]), m, detail=f"{row['kind']} {row['key']}")
        )
    for row, m in _action_rows(store, copies):
        kind = _ACTIONS.get(str(row["action"]))
        if kind is None:
            continue
        deadline = row.get("deadline_ms")
        detail = f"sequence {row['sequence']}" + (f", invisible until {deadline}" if deadline else "")
        if row.get("end_offset") is not None:
            detail += f", range {row['queue_offset']}..{int(row['end_offset']) - 1}"
        events.append(
            _event(
                kind, int(row["ts_ms"]), m, group=row["group"], consumer_id=row["consumer_id"], detail=detail
            )
        )
    for row in _rows_about(store, schemas.PULL_LOG, copies):
        m = by_offset[int(row["physical_offset"])]
        events.append(
            _event(
                TraceKind.PULL_LOGGED,
                int(row["ts_ms"]),
                m,
                group=row["group"],
                consumer_id=row["consumer_id"],
                detail=f"pull sequence {row['pull_sequence']}",
            )
        )
    return events


def _consumed_events(store: Store, copies: Iterable[MessageExt]) -> list[TraceEvent]:
    """Per copy, each group's (or broadcasting instance's) first committed offset past it."""
    events = []
    for m in copies:
        rows = store.read(
            schemas.CONSUMER_OFFSET,
            predicate=f"topic = {sql_literal(m.topic)} AND queue_id = {int(m.queue_id)}",
            filter=(ds.field("topic") == m.topic)
            & (ds.field("queue_id") == m.queue_id)
            & (ds.field("offset") > m.queue_offset)
            & (ds.field("ts_ms") >= m.store_ts_ms),
            columns=["group", "consumer_id", "offset", "ts_ms"],
        ).to_pylist()
        first: dict[tuple[str, str], dict[str, Any]] = {}
        for row in rows:
            key = (row["group"], row["consumer_id"])
            if key not in first or row["ts_ms"] < first[key]["ts_ms"]:
                first[key] = row
        for (group, consumer_id), row in sorted(first.items()):
            events.append(
                _event(
                    TraceKind.CONSUMED,
                    int(row["ts_ms"]),
                    m,
                    group=group,
                    consumer_id=consumer_id or None,
                    detail=f"committed offset {row['offset']}",
                )
            )
    return events


def trace_message(store: Store, msg_id: str, *, index: QueueIndex | None = None) -> MessageTrace:
    """Every copy of the message ``msg_id`` (offset id or uniq key) and what happened to each.

    Raises:
        InvalidArgumentError: an empty id or one with whitespace.
        MessageNotFoundError: no stored message has that id (never written, or removed by retention).
    """
    reader = index or QueueIndex(store)
    keys, since = _start(store, msg_id, reader)
    offsets = _family(store, keys, since)
    rows = reader.messages(offsets).to_pylist()
    copies = sorted((MessageExt.from_row(r) for r in rows), key=lambda m: m.physical_offset)
    events = _copy_events(copies) + _log_events(store, copies) + _consumed_events(store, copies)
    events.sort(key=lambda e: (e.ts_ms if e.ts_ms is not None else 2**63, e.physical_offset, _ORDER[e.kind]))
    first = copies[0]
    return MessageTrace(first.msg_id, first.uniq_key, tuple(copies), tuple(events))
