"""Transactional messages: half messages, decisions and check-back, as RocketMQ's.

A transaction is a *half message* in ``commit_log``: topic ``RMQ_SYS_TRANS_HALF_TOPIC`` (queue 0),
``sys_flag`` PREPARED (never dispatched, no queue offset), with the real destination in properties
``REAL_TOPIC`` / ``REAL_QID``, ``TRAN_MSG=true`` and the producer group in ``PGROUP``.

Its *decision* is also a commit-log row, appended with the Delta app transaction
``mq.tx.<half physical offset>`` = 0 in the same commit (:func:`end_transaction`):

* COMMIT re-puts the message into its real topic and queue with ``sys_flag`` COMMIT (dispatched),
  without ``REAL_*`` / ``TRAN_MSG`` and with ``TRAN_HALF_OFFSET`` naming the half;
* ROLLBACK appends an op record in ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` with ``sys_flag`` ROLLBACK (never
  dispatched; body and ``TRAN_HALF_OFFSET`` name the half), and the message never becomes visible.

The sequencer refuses a commit whose app transaction is already recorded, so COMMIT and ROLLBACK of
one half exclude each other and a commit re-puts the message exactly once, however many deciders
race (the producer's own decision, its check-back thread, a second producer of the group, the check
job's rollback after too many checks). A half is *decided* iff that app transaction exists, or,
for a half older than :data:`GUARD_TRUSTED_MS`, iff its decision record is in the commit log: the
guards carry ``lastUpdated`` and expire after the commit log's ``delta.setTransactionRetentionDuration``
(:data:`engine.store.store.TXN_RETENTION`, 7 days), so a decision older than that is found by content
(its ``TRAN_HALF_OFFSET``), and a new decision on such a half writes a fresh guard.

The ``transactions`` table is the conversation with producers and an audit trail: the check job
(:func:`check_transactions`) appends CHECK requests for halves older than the timeout that have no
decision (again every check interval, at most ``max_checks`` times, then it rolls them back); each
producer group's check-back thread reads its CHECK rows, asks its checker and decides. Decisions are
recorded there too (COMMIT / ROLLBACK with the reason), for SQL over the table; a missing decision
row never changes an outcome. The check job keeps, in the table's commitInfo (:data:`FLOOR_KEY`), the
physical offset below which every half is decided, so scans stay short.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engine.errors import InvalidArgumentError, StoreError
from engine.model import MessageExt, SysFlag
from engine.protocol import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.stamping import PendingMessage, Stamped
from engine.store.store import Store, sql_literal
from engine.store.store import now_ms as _clock_ms

_log = logging.getLogger(__name__)

PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_HALF_OFFSET = "TRAN_HALF_OFFSET"  # physical offset of the half a decision belongs to
TX_APP_PREFIX = "mq.tx."
FLOOR_KEY = "mq.tx.floor"
OP_TAG_REMOVE = "d"  # RocketMQ's op-record tag for a removed (decided) half

EVENT_CHECK = "CHECK"
EVENT_COMMIT = "COMMIT"
EVENT_ROLLBACK = "ROLLBACK"
REASON_LOCAL = "LOCAL"  # the producer's local transaction decided
REASON_CHECK = "CHECK"  # the producer's checker decided, answering a check request
REASON_MAX_CHECKS = "MAX_CHECKS"  # no decision after the maximum number of checks

DEFAULT_TIMEOUT_MS = 6_000
# A decision comes after its half, and its guard lives 7 days (TXN_RETENTION) from the decision: the
# guard of a half younger than this cannot have expired, so its absence means "undecided".
GUARD_TRUSTED_MS = 6 * 24 * 3600 * 1000
DEFAULT_MAX_CHECKS = 15
DEFAULT_CHECK_INTERVAL_MS = 30_000


class LocalTransactionState(enum.StrEnum):
    """Outcome of a local transaction, as RocketMQ's ``LocalTransactionState``."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


def tx_app_id(half_physical_offset: int) -> str:
    """App transaction id that guards the decision on one half message."""
    return f"{TX_APP_PREFIX}{half_physical_offset}"


@dataclass(frozen=True)
class HalfMessage:
    """A stored half message: what a decision or a check needs of it."""

    physical_offset: int
    msg_id: str
    uniq_key: str
    topic: str  # the real topic
    queue_id: int  # the real queue
    producer_group: str
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    born_ts_ms: int
    store_ts_ms: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> HalfMessage:
        """From a commit-log row of the half topic.

        Raises:
            StoreError: the row is not a half message.
        """
        props: dict[str, str] = dict(row.get("properties") or {})  # Arrow maps read as pairs
        if row["topic"] != TRANS_HALF_TOPIC or PROPERTY_REAL_TOPIC not in props:
            raise StoreError(
                f"commit-log row at {row['physical_offset']} is not a transaction half message",
                offset=row["physical_offset"],
            )
        return cls(
            physical_offset=int(row["physical_offset"]),
            msg_id=str(row["msg_id"]),
            uniq_key=str(row["uniq_key"]),
            topic=props[PROPERTY_REAL_TOPIC],
            queue_id=int(props.get(PROPERTY_REAL_QUEUE_ID, "0")),
            producer_group=props.get(PROPERTY_PRODUCER_GROUP, ""),
            body=bytes(row.get("body") or b""),  # a scan may leave bodies out
            tags=row.get("tags"),
            keys=tuple(row.get("keys") or ()),
            properties=props,
            born_ts_ms=int(row["born_ts_ms"]),
            store_ts_ms=int(row["store_ts_ms"]),
        )

    def view(self) -> MessageExt:
        """The message as a checker sees it: real topic and queue, the half's offsets and id."""
        return MessageExt(
            topic=self.topic,
            queue_id=self.queue_id,
            queue_offset=-1,
            physical_offset=self.physical_offset,
            msg_id=self.msg_id,
            uniq_key=self.uniq_key,
            body=self.body,
            tags=self.tags,
            keys=self.keys,
            properties=dict(self.properties),
            born_ts_ms=self.born_ts_ms,
            store_ts_ms=self.store_ts_ms,
            reconsume_times=0,
            sys_flag=int(SysFlag.PREPARED),
        )


# ----------------------------------------------------------------------------- pure rules
def half_message(message: PendingMessage, producer_group: str) -> PendingMessage:
    """The half message that stands for ``message`` (bound for its real topic and queue) until decided."""
    props = dict(message.properties)
    props[PROPERTY_REAL_TOPIC] = message.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    props[PROPERTY_PRODUCER_GROUP] = producer_group
    return message._replace(
        topic=TRANS_HALF_TOPIC,
        queue_id=0,
        properties=props,
        sys_flag=int(SysFlag.PREPARED),
        delay_level=0,
        deliver_at_ms=None,
        tags_code=None,
    )


def committed_message(half: HalfMessage) -> PendingMessage:
    """The re-put of a committed half into its real topic and queue (same uniq key, body, born time)."""
    props = {
        k: v
        for k, v in half.properties.items()
        if k not in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED)
    }
    props[PROPERTY_HALF_OFFSET] = str(half.physical_offset)
    return PendingMessage(
        topic=half.topic,
        queue_id=half.queue_id,
        body=half.body,
        uniq_key=half.uniq_key,
        tags=half.tags,
        keys=half.keys,
        properties=props,
        born_ts_ms=half.born_ts_ms,
        sys_flag=int(SysFlag.COMMIT),
    )


def rollback_record(half: HalfMessage) -> PendingMessage:
    """The op record of a rolled-back half (never dispatched)."""
    return PendingMessage(
        topic=TRANS_OP_HALF_TOPIC,
        queue_id=0,
        body=str(half.physical_offset).encode(),
        uniq_key=half.uniq_key,
        tags=OP_TAG_REMOVE,
        properties={
            PROPERTY_HALF_OFFSET: str(half.physical_offset),
            PROPERTY_PRODUCER_GROUP: half.producer_group,
        },
        born_ts_ms=half.born_ts_ms,
        sys_flag=int(SysFlag.ROLLBACK),
    )


def next_check(
    check_times: int, last_check_ms: int | None, now: int, max_checks: int, check_interval_ms: int
) -> str | None:
    """What the check job does with an undecided half past its timeout; pure.

    Returns ``EVENT_CHECK`` (ask the producer again), ``EVENT_ROLLBACK`` (asked ``max_checks`` times
    already, and the last answer is overdue) or None (the last check is younger than the interval).
    """
    if last_check_ms is not None and now - last_check_ms < check_interval_ms:
        return None
    return EVENT_ROLLBACK if check_times >= max_checks else EVENT_CHECK


# ----------------------------------------------------------------------------- store level
@dataclass(frozen=True)
class Decision:
    """How a half message was decided."""

    state: LocalTransactionState  # COMMIT or ROLLBACK
    committed: MessageExt | None  # the re-put message (COMMIT), when it could be read
    won: bool  # this call made the decision (False: another decider got there first)


def _guarded(store: Store, half_physical_offset: int) -> bool:
    return store.app_version(schemas.COMMIT_LOG, tx_app_id(half_physical_offset)) >= 0


def _guard_may_have_expired(store_ts_ms: int) -> bool:
    return _clock_ms() - store_ts_ms > GUARD_TRUSTED_MS


def decision_record(store: Store, half_physical_offset: int, uniq_key: str) -> dict[str, Any] | None:
    """The commit-log row that decided a half (its COMMIT re-put or ROLLBACK op record), or None.

    Found by content, not by the guard: decision rows keep the half's unique key and name its
    physical offset in ``TRAN_HALF_OFFSET``. A scan of the commit log: only for halves whose guard
    may have expired.
    """
    po = int(half_physical_offset)
    rows = store.read(
        schemas.COMMIT_LOG,
        columns=[n for n in schemas.COMMIT_LOG_SCHEMA.names if n != "body"],
        predicate=f"uniq_key = {sql_literal(uniq_key)} AND physical_offset > {po}",
        filter=(ds.field("uniq_key") == uniq_key)
        & (ds.field("physical_offset") > po)
        & ds.field("sys_flag").isin([int(SysFlag.COMMIT), int(SysFlag.ROLLBACK)]),
    ).to_pylist()
    for row in sorted(rows, key=lambda r: int(r["physical_offset"])):
        if dict(row.get("properties") or {}).get(PROPERTY_HALF_OFFSET) == str(po):
            found: dict[str, Any] = row
            return found
    return None


def is_decided(store: Store, half_physical_offset: int, *, half: HalfMessage | None = None) -> bool:
    """True once a COMMIT or ROLLBACK of the half is in the commit log.

    Args:
        store: the store.
        half_physical_offset: the half's physical offset.
        half: the half, if already loaded (saves reading it when its guard is missing).
    """
    if _guarded(store, half_physical_offset):
        return True
    half = half if half is not None else load_half(store, half_physical_offset)
    if half is None or not _guard_may_have_expired(half.store_ts_ms):
        return False
    return decision_record(store, half.physical_offset, half.uniq_key) is not None


def load_half(store: Store, half_physical_offset: int) -> HalfMessage | None:
    """The half message at a physical offset, or None if there is none (wrong offset, retention)."""
    po = int(half_physical_offset)
    rows = store.read(
        schemas.COMMIT_LOG,
        predicate=f"physical_offset = {po}",
        filter=(ds.field("physical_offset") == po) & (ds.field("topic") == TRANS_HALF_TOPIC),
    ).to_pylist()
    return HalfMessage.from_row(rows[0]) if rows else None


def find_decision(store: Store, half: HalfMessage) -> Decision | None:
    """The decision already taken on a half, or None while it is undecided."""
    if not is_decided(store, half.physical_offset, half=half):
        return None
    rows = store.read(
        schemas.COMMIT_LOG,
        predicate=f"topic = {sql_literal(half.topic)} AND uniq_key = {sql_literal(half.uniq_key)}",
        filter=(ds.field("topic") == half.topic)
        & (ds.field("uniq_key") == half.uniq_key)
        & (ds.field("sys_flag") == int(SysFlag.COMMIT)),
    ).to_pylist()
    for row in rows:
        props = dict(row.get("properties") or {})
        if props.get(PROPERTY_HALF_OFFSET) == str(half.physical_offset):
            return Decision(LocalTransactionState.COMMIT, MessageExt.from_row(row), won=False)
    return Decision(LocalTransactionState.ROLLBACK, None, won=False)


def _record(
    half: HalfMessage,
    event: str,
    *,
    check_times: int = 0,
    reason: str | None = None,
    committed: Stamped | None = None,
    ts_ms: int | None = None,
) -> dict[str, Any]:
    return {
        "half_physical_offset": half.physical_offset,
        "half_msg_id": half.msg_id,
        "uniq_key": half.uniq_key,
        "producer_group": half.producer_group,
        "topic": half.topic,
        "queue_id": half.queue_id,
        "event": event,
        "check_times": check_times,
        "physical_offset": committed.physical_offset if committed else None,
        "queue_offset": committed.queue_offset if committed else None,
        "reason": reason,
        "ts_ms": _clock_ms() if ts_ms is None else ts_ms,
    }


def _append_records(
    store: Store, rows: list[dict[str, Any]], metadata: Mapping[str, str] | None = None
) -> None:
    store.append(
        schemas.TRANSACTIONS,
        pa.Table.from_pylist(rows, schema=schemas.TRANSACTIONS_SCHEMA),
        custom_metadata=metadata,
    )


def end_transaction(
    store: Store,
    writer: CommitLogWriter,
    half: HalfMessage,
    state: LocalTransactionState,
    *,
    reason: str = REASON_LOCAL,
    check_times: int = 0,
) -> Decision:
    """Decide a half message: COMMIT re-puts it into its real queue, ROLLBACK records an op record.

    Exactly once: the decision is committed with the app transaction ``mq.tx.<half offset>``; if
    another decider recorded one first, nothing is written and its decision is returned
    (``won=False``) — which may differ from ``state``.

    Raises:
        InvalidArgumentError: ``state`` is not COMMIT or ROLLBACK.
        CommitConflictError, StoreError, CommitStateUnknownError: as :meth:`CommitLogWriter.append`.
    """
    if state is LocalTransactionState.COMMIT:
        record = committed_message(half)
    elif state is LocalTransactionState.ROLLBACK:
        record = rollback_record(half)
    else:
        raise InvalidArgumentError(f"a transaction ends with COMMIT or ROLLBACK, not {state!r}", state=state)
    if _guard_may_have_expired(half.store_ts_ms) and not _guarded(store, half.physical_offset):
        existing = find_decision(store, half)  # decided before its guard expired
        if existing is not None:
            return existing
    stamped = writer.append([record], app_transactions={tx_app_id(half.physical_offset): 0})
    if not stamped:
        existing = find_decision(store, half)
        if existing is None:  # pragma: no cover - the sequencer only refuses when it is recorded
            raise StoreError("transaction decision refused but none is recorded", offset=half.physical_offset)
        return existing
    event = EVENT_COMMIT if state is LocalTransactionState.COMMIT else EVENT_ROLLBACK
    committed = stamped[0] if state is LocalTransactionState.COMMIT else None
    try:
        _append_records(
            store, [_record(half, event, check_times=check_times, reason=reason, committed=committed)]
        )
    except Exception as exc:  # the decision of record is in the commit log; this row is the audit trail
        _log.warning(
            "transaction %s decided but not recorded in the transactions table: %s", half.msg_id, exc
        )
    view = None
    if committed is not None:
        view = MessageExt(
            topic=committed.topic,
            queue_id=committed.queue_id,
            queue_offset=committed.queue_offset,
            physical_offset=committed.physical_offset,
            msg_id=committed.msg_id,
            uniq_key=committed.uniq_key,
            body=record.body,
            tags=record.tags,
            keys=record.keys,
            properties=dict(record.properties),
            born_ts_ms=record.born_ts_ms,
            store_ts_ms=committed.store_ts_ms,
            reconsume_times=0,
            sys_flag=int(SysFlag.COMMIT),
        )
    return Decision(state, view, won=True)


def check_floor(store: Store) -> int:
    """Physical offset below which every half message is decided (0 before the first check run)."""
    raw = store.shared(schemas.TRANSACTIONS).commit_value(FLOOR_KEY)
    return 0 if raw is None else int(json.loads(raw))


def undecided_halves(store: Store, *, floor: int | None = None) -> tuple[list[HalfMessage], int]:
    """Half messages without a decision, oldest first (without their bodies: use :func:`load_half`),
    and the new floor (see :func:`check_floor`)."""
    low = check_floor(store) if floor is None else floor
    table = store.read(
        schemas.COMMIT_LOG,
        columns=[n for n in schemas.COMMIT_LOG_SCHEMA.names if n != "body"],
        predicate=f"topic = {sql_literal(TRANS_HALF_TOPIC)} AND physical_offset >= {low}",
        filter=(ds.field("topic") == TRANS_HALF_TOPIC)
        & (ds.field("physical_offset") >= low)
        & (ds.field("sys_flag") == int(SysFlag.PREPARED)),
    )
    if table.num_rows == 0:
        return [], low
    table = table.sort_by("physical_offset")
    log = store.shared(schemas.COMMIT_LOG)
    halves = []
    for row in table.to_pylist():
        po = int(row["physical_offset"])
        if log.app_version(tx_app_id(po)) >= 0:
            continue
        if _guard_may_have_expired(int(row["store_ts_ms"])) and decision_record(store, po, row["uniq_key"]):
            continue  # decided more than TXN_RETENTION ago
        halves.append(HalfMessage.from_row(row))
    if halves:
        return halves, halves[0].physical_offset
    return [], int(pc.max(table["physical_offset"]).as_py()) + 1


def check_requests(store: Store, *, producer_group: str | None = None, floor: int = 0) -> pa.Table:
    """CHECK rows of the ``transactions`` table (one producer group's, or all) at or above ``floor``."""
    predicate = f"event = {sql_literal(EVENT_CHECK)} AND half_physical_offset >= {int(floor)}"
    row_filter = (ds.field("event") == EVENT_CHECK) & (ds.field("half_physical_offset") >= int(floor))
    if producer_group is not None:
        predicate += f" AND producer_group = {sql_literal(producer_group)}"
        row_filter &= ds.field("producer_group") == producer_group
    return store.read(schemas.TRANSACTIONS, predicate=predicate, filter=row_filter)


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{name} {value!r} must be an int >= {low}", **{name: value})
    return value


def validate_check_settings(timeout_ms: object, max_checks: object, check_interval_ms: object) -> None:
    """Check the settings of :func:`check_transactions` (ints >= 0).

    Raises:
        InvalidArgumentError: a negative or non-int setting.
    """
    _check_int("timeout_ms", timeout_ms, 0)
    _check_int("max_checks", max_checks, 0)
    _check_int("check_interval_ms", check_interval_ms, 0)


def check_transactions(
    store: Store,
    now_ms: int | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    max_checks: int = DEFAULT_MAX_CHECKS,
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS,
    *,
    writer: CommitLogWriter | None = None,
) -> int:
    """One pass of the transaction check: ask producers about old undecided halves, or give up.

    For every half message without a decision stored at least ``timeout_ms`` before ``now_ms``: if it
    was never checked, or its last check is ``check_interval_ms`` old, append a CHECK request (the
    producer group's check-back thread answers it); once it has been checked ``max_checks`` times and
    the last answer is overdue, roll it back (RocketMQ discards it). Safe to run repeatedly and from
    several places: a second pass at the same time does nothing, and decisions are exclusive.

    Args:
        store: the store.
        now_ms: the clock (default now).
        timeout_ms: age of a half before its first check.
        max_checks: checks before the rollback.
        check_interval_ms: time between checks of one half.
        writer: a commit-log writer to reuse for rollbacks.

    Returns:
        Halves acted on: CHECK requests written plus rollbacks.

    Raises:
        InvalidArgumentError: a negative time or ``max_checks``.
        StoreError, CommitConflictError: a read or write failed.
    """
    now = _check_int("now_ms", now_ms, 0) if now_ms is not None else _clock_ms()
    validate_check_settings(timeout_ms, max_checks, check_interval_ms)
    old_floor = check_floor(store)
    halves, floor = undecided_halves(store, floor=old_floor)
    due = [h for h in halves if h.store_ts_ms <= now - timeout_ms]
    history: dict[int, tuple[int, int]] = {}  # half -> (checks so far, last check time)
    if due:
        checks = check_requests(store, floor=old_floor).select(
            ["half_physical_offset", "check_times", "ts_ms"]
        )
        for row in checks.to_pylist():
            po, times, ts = int(row["half_physical_offset"]), int(row["check_times"]), int(row["ts_ms"])
            before = history.get(po, (0, -1))
            history[po] = (max(before[0], times), max(before[1], ts))
    requests: list[dict[str, Any]] = []
    rollbacks: list[tuple[HalfMessage, int]] = []
    for half in due:
        times, last = history.get(half.physical_offset, (0, -1))
        action = next_check(times, None if last < 0 else last, now, max_checks, check_interval_ms)
        if action == EVENT_CHECK:
            requests.append(_record(half, EVENT_CHECK, check_times=times + 1, ts_ms=now))
        elif action == EVENT_ROLLBACK:
            rollbacks.append((half, times))
    if requests or floor != old_floor:
        _append_records(store, requests, {FLOOR_KEY: json.dumps(floor)})
    if rollbacks:
        writer = writer or CommitLogWriter(store)
        for half, times in rollbacks:
            end_transaction(
                store,
                writer,
                half,
                LocalTransactionState.ROLLBACK,
                reason=REASON_MAX_CHECKS,
                check_times=times,
            )
    return len(requests) + len(rollbacks)
