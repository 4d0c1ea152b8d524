"""Transaction records: half messages and decisions in ``commit_log``, check requests and the audit
trail in the ``transactions`` table.

Both the transactional producer (which decides its own transactions and answers check requests)
and the check job (which asks, and gives up) use these; the record shapes and rules are pure, in
:mod:`engine.protocol.transactions`. A decision is a commit-log row appended with the Delta app
transaction ``mq.tx.<half physical offset>`` = 0 in the same commit (:func:`end_transaction`), so
COMMIT and ROLLBACK of one half exclude each other and a commit re-puts the message exactly once.

Shards: the half lives on the shard of ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 (its physical offset
names it); the decision, and so the guard, goes to the shard of the half's real topic and queue
(:func:`decision_shard`): a COMMIT re-put must be in the guarded commit, and a ROLLBACK's op record
is put in the queue of ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` that lives on that same shard, so the two
decisions of one half always race on one sequencer. Every check that a half was decided looks there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from engine.errors import InvalidArgumentError, StoreError
from engine.model import MessageExt, SysFlag
from engine.protocol.names import (
    PROPERTY_TRANSACTION_PREPARED,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from engine.protocol.shards import shard_of_offset, shard_of_queue
from engine.protocol.transactions import (
    EVENT_CHECK,
    EVENT_COMMIT,
    EVENT_ROLLBACK,
    OP_TAG_REMOVE,
    PROPERTY_HALF_OFFSET,
    REASON_LOCAL,
    HalfMessage,
    LocalTransactionState,
    committed_properties,
    decides,
    guard_may_have_expired,
    half_properties,
    rollback_properties,
    transaction_record,
)
from engine.store import schemas
from engine.store.commit_log import CommitLogs, CommitLogWriter, PendingMessage, Stamped, shared_commit_logs
from engine.store.commit_markers import TX_FLOOR_KEY, transaction_app
from engine.store.store import Store, sql_literal
from engine.store.store import now_ms as _clock_ms

_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- records
def half_message(message: PendingMessage, producer_group: str) -> PendingMessage:
    """The half message that stands for ``message`` (bound for its real topic and queue) until decided."""
    return message._replace(
        topic=TRANS_HALF_TOPIC,
        queue_id=0,
        properties=half_properties(message.properties, message.topic, message.queue_id, producer_group),
        sys_flag=int(SysFlag.PREPARED),
        delay_level=0,
        deliver_at_ms=None,
        tags_code=None,
    )


def stored_half(half: PendingMessage, stamped: Stamped) -> HalfMessage:
    """The :class:`HalfMessage` of a half (from :func:`half_message`) that was just stored as ``stamped``."""
    return HalfMessage.from_row(
        {
            **half._asdict(),
            "physical_offset": stamped.physical_offset,
            "msg_id": stamped.msg_id,
            "uniq_key": stamped.uniq_key,
            "store_ts_ms": stamped.store_ts_ms,
        }
    )


def committed_message(half: HalfMessage) -> PendingMessage:
    """The re-put of a committed half into its real topic and queue (same uniq key, body, born time)."""
    return PendingMessage(
        topic=half.topic,
        queue_id=half.queue_id,
        body=half.body,
        uniq_key=half.uniq_key,
        tags=half.tags,
        keys=half.keys,
        properties=committed_properties(half),
        born_ts_ms=half.born_ts_ms,
        sys_flag=int(SysFlag.COMMIT),
    )


def op_queue(shard: int, shards: int) -> int:
    """The queue of ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` that lives on ``shard`` (0 with one shard)."""
    return (shard - shard_of_queue(TRANS_OP_HALF_TOPIC, 0, shards)) % shards


def rollback_record(half: HalfMessage, shards: int = 1) -> PendingMessage:
    """The op record of a rolled-back half (never dispatched), in the op queue on the shard of the
    half's real queue (a store of ``shards`` shards)."""
    return PendingMessage(
        topic=TRANS_OP_HALF_TOPIC,
        queue_id=op_queue(shard_of_queue(half.topic, half.queue_id, shards), shards),
        body=str(half.physical_offset).encode(),
        uniq_key=half.uniq_key,
        tags=OP_TAG_REMOVE,
        properties=rollback_properties(half),
        born_ts_ms=half.born_ts_ms,
        sys_flag=int(SysFlag.ROLLBACK),
    )


def check_max_time_copy(half: HalfMessage) -> PendingMessage:
    """The copy of a half whose check-backs ran out, kept in ``TRANS_CHECK_MAX_TIME_TOPIC`` (queue 0)
    for inspection, as RocketMQ's ``resolveDiscardMsg``: body, tags, keys, uniq key, born time and
    the half's properties (``REAL_TOPIC`` / ``REAL_QID`` say where it was bound), naming the half in
    ``TRAN_HALF_OFFSET``. An ordinary message of a system topic: pullable, never delivered to groups
    that do not subscribe it."""
    props = {k: v for k, v in half.properties.items() if k != PROPERTY_TRANSACTION_PREPARED}
    props[PROPERTY_HALF_OFFSET] = str(half.physical_offset)
    return PendingMessage(
        topic=TRANS_CHECK_MAX_TIME_TOPIC,
        queue_id=0,
        body=half.body,
        uniq_key=half.uniq_key,
        tags=half.tags,
        keys=half.keys,
        properties=props,
        born_ts_ms=half.born_ts_ms,
    )


# ----------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class Decision:
    """How a half message was decided."""

    state: LocalTransactionState  # COMMIT or ROLLBACK
    committed: MessageExt | None  # the re-put message (COMMIT), when it could be read
    won: bool  # this call made the decision (False: another decider got there first)


def decision_shard(store: Store, half: HalfMessage) -> int:
    """The shard whose commit log holds a half's decision and its guard: its real queue's."""
    return shard_of_queue(half.topic, half.queue_id, store.commit_log_shards)


def _decision_table(store: Store, half: HalfMessage) -> str:
    return schemas.commit_log_table(decision_shard(store, half))


def _guarded(store: Store, half: HalfMessage) -> bool:
    return store.app_version(_decision_table(store, half), transaction_app(half.physical_offset)) >= 0


def guard_may_have_expired_now(store_ts_ms: int) -> bool:
    return guard_may_have_expired(store_ts_ms, _clock_ms())


def decision_record(store: Store, half: HalfMessage) -> dict[str, Any] | None:
    """The commit-log row that decided a half (its COMMIT re-put or ROLLBACK op record), or None.

    Found by content, not by the guard: decision rows keep the half's unique key and name its
    physical offset in ``TRAN_HALF_OFFSET``. A scan of the decision's shard: only for halves whose
    guard may have expired.
    """
    po, uniq_key = int(half.physical_offset), half.uniq_key
    # On the half's own shard the decision comes after it; another shard's offsets say nothing.
    after = po if decision_shard(store, half) == shard_of_offset(po) else -1
    rows = store.read(
        _decision_table(store, half),
        columns=[n for n in schemas.COMMIT_LOG_SCHEMA.names if n != "body"],
        predicate=f"uniq_key = {sql_literal(uniq_key)} AND physical_offset > {after}",
        filter=(ds.field("uniq_key") == uniq_key)
        & (ds.field("physical_offset") > after)
        & ds.field("sys_flag").isin([int(SysFlag.COMMIT), int(SysFlag.ROLLBACK)]),
    ).to_pylist()
    for row in sorted(rows, key=lambda r: int(r["physical_offset"])):
        if decides(dict(row.get("properties") or {}), po):
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
    if store.commit_log_shards == 1 and _guarded_offset(store, half_physical_offset):
        return True  # one shard: the guard is found without reading the half
    half = half if half is not None else load_half(store, half_physical_offset)
    if half is None:
        return False
    if _guarded(store, half):
        return True
    if not guard_may_have_expired_now(half.store_ts_ms):
        return False
    return decision_record(store, half) is not None


def _guarded_offset(store: Store, half_physical_offset: int) -> bool:
    return store.app_version(schemas.COMMIT_LOG, transaction_app(half_physical_offset)) >= 0


def load_half(store: Store, half_physical_offset: int) -> HalfMessage | None:
    """The half message at a physical offset (read from the shard the offset names), or None if
    there is none (wrong offset, a shard the store does not have, retention)."""
    po = int(half_physical_offset)
    shard = shard_of_offset(po) if po >= 0 else -1
    if not 0 <= shard < store.commit_log_shards:
        return None
    rows = store.read(
        schemas.commit_log_table(shard),
        predicate=f"physical_offset = {po}",
        filter=(ds.field("physical_offset") == po) & (ds.field("topic") == TRANS_HALF_TOPIC),
    ).to_pylist()
    return HalfMessage.from_row(rows[0]) if rows else None


def find_decision(store: Store, half: HalfMessage) -> Decision | None:
    """The decision already taken on a half, or None while it is undecided."""
    if not is_decided(store, half.physical_offset, half=half):
        return None
    rows = store.read(
        _decision_table(store, half),
        predicate=f"topic = {sql_literal(half.topic)} AND uniq_key = {sql_literal(half.uniq_key)}",
        filter=(ds.field("topic") == half.topic)
        & (ds.field("uniq_key") == half.uniq_key)
        & (ds.field("sys_flag") == int(SysFlag.COMMIT)),
    ).to_pylist()
    for row in rows:
        if decides(dict(row.get("properties") or {}), half.physical_offset):
            return Decision(LocalTransactionState.COMMIT, MessageExt.from_row(row), won=False)
    return Decision(LocalTransactionState.ROLLBACK, None, won=False)


def append_records(
    store: Store, rows: list[dict[str, Any]], metadata: Mapping[str, str] | None = None
) -> None:
    """Append ``transactions`` rows (from :func:`~engine.protocol.transactions.transaction_record`)."""
    store.append(
        schemas.TRANSACTIONS,
        pa.Table.from_pylist(rows, schema=schemas.TRANSACTIONS_SCHEMA),
        custom_metadata=metadata,
    )


def end_transaction(
    store: Store,
    writer: CommitLogWriter | CommitLogs,
    half: HalfMessage,
    state: LocalTransactionState,
    *,
    reason: str = REASON_LOCAL,
    check_times: int = 0,
    extra: Sequence[PendingMessage] = (),
) -> Decision:
    """Decide a half message: COMMIT re-puts it into its real queue, ROLLBACK records an op record.

    ``writer`` appends the decision when it writes the decision's shard (:func:`decision_shard`);
    otherwise that shard's writer is taken from ``writer`` (a
    :class:`~engine.store.commit_log.shards.CommitLogs`) or from the process's shared ones.

    ``extra`` messages are appended only if this call decides (the check job's copy of a half whose
    checks ran out, :func:`check_max_time_copy`): in the same commit when their queues live on the
    decision's shard, otherwise right after it, once (guarded by the same app id on their shard;
    a crash in between loses the copy, never the decision).

    Exactly once: the decision is committed with the app transaction ``mq.tx.<half offset>``; if
    another decider recorded one first, nothing is written and its decision is returned
    (``won=False``) — which may differ from ``state``.

    Raises:
        InvalidArgumentError: ``state`` is not COMMIT or ROLLBACK.
        CommitConflictError, StoreError, CommitStateUnknownError: as :meth:`CommitLogWriter.append`.
    """
    shards = store.commit_log_shards
    if state is LocalTransactionState.COMMIT:
        record = committed_message(half)
    elif state is LocalTransactionState.ROLLBACK:
        record = rollback_record(half, shards)
    else:
        raise InvalidArgumentError(f"a transaction ends with COMMIT or ROLLBACK, not {state!r}", state=state)
    if guard_may_have_expired_now(half.store_ts_ms) and not _guarded(store, half):
        existing = find_decision(store, half)  # decided before its guard expired
        if existing is not None:
            return existing
    shard = decision_shard(store, half)
    together = [m for m in extra if shard_of_queue(m.topic, m.queue_id, shards) == shard]
    after = [m for m in extra if shard_of_queue(m.topic, m.queue_id, shards) != shard]
    guard = {transaction_app(half.physical_offset): 0}
    stamped = _writer_of(store, writer, shard).append([record, *together], app_transactions=guard)
    if not stamped:
        existing = find_decision(store, half)
        if existing is None:  # pragma: no cover - the sequencer only refuses when it is recorded
            raise StoreError("transaction decision refused but none is recorded", offset=half.physical_offset)
        return existing
    for m in after:
        _writer_of(store, writer, shard_of_queue(m.topic, m.queue_id, shards)).append(
            [m], app_transactions=guard
        )
    event = EVENT_COMMIT if state is LocalTransactionState.COMMIT else EVENT_ROLLBACK
    committed = stamped[0] if state is LocalTransactionState.COMMIT else None
    try:
        append_records(
            store,
            [
                transaction_record(
                    half,
                    event,
                    ts_ms=_clock_ms(),
                    check_times=check_times,
                    reason=reason,
                    physical_offset=committed.physical_offset if committed else None,
                    queue_offset=committed.queue_offset if committed else None,
                )
            ],
        )
    except Exception as exc:  # the decision of record is in the commit log; this row is the audit trail
        _log.warning(
            "transaction %s decided but not recorded in the transactions table: %s", half.msg_id, exc
        )
    view = None
    if committed is not None:
        view = MessageExt.from_row({**record._asdict(), **committed._asdict()})
    return Decision(state, view, won=True)


def half_writer(store: Store, writer: CommitLogWriter | CommitLogs) -> CommitLogWriter:
    """The writer for half messages: that of the shard of ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0."""
    return _writer_of(store, writer, shard_of_queue(TRANS_HALF_TOPIC, 0, store.commit_log_shards))


def _writer_of(store: Store, writer: CommitLogWriter | CommitLogs, shard: int) -> CommitLogWriter:
    if isinstance(writer, CommitLogs):
        return writer.writer(shard)
    return writer if writer.shard == shard else shared_commit_logs(store).writer(shard)


# ----------------------------------------------------------------------------- check requests
def check_floor(store: Store) -> int:
    """Physical offset below which every half message is decided (0 before the first check run)."""
    raw = store.shared(schemas.TRANSACTIONS).commit_value(TX_FLOOR_KEY)
    return 0 if raw is None else int(json.loads(raw))


def check_requests(store: Store, *, producer_group: str | None = None, floor: int = 0) -> pa.Table:
    """CHECK rows of the ``transactions`` table (one producer group's, or all) at or above ``floor``."""
    predicate = f"event = {sql_literal(EVENT_CHECK)} AND half_physical_offset >= {int(floor)}"
    row_filter = (ds.field("event") == EVENT_CHECK) & (ds.field("half_physical_offset") >= int(floor))
    if producer_group is not None:
        predicate += f" AND producer_group = {sql_literal(producer_group)}"
        row_filter &= ds.field("producer_group") == producer_group
    return store.read(schemas.TRANSACTIONS, predicate=predicate, filter=row_filter)


class CheckBack:
    """Which check requests a door sent to its producers (a request is sent once per check number):
    the remoting door's CHECK_TRANSACTION_STATE and the gRPC door's RecoverOrphanedTransactionCommand."""

    def __init__(self) -> None:
        self.sent: dict[int, int] = {}  # half physical offset -> check number last sent
        self.seen_version = -1

    def pending(self, store: Store, groups: set[str]) -> list[tuple[str, HalfMessage, int]]:
        """(group, half, check number) of every undecided check request not sent yet."""
        latest = store.latest_version_hint(schemas.TRANSACTIONS, self.seen_version)
        if latest <= self.seen_version or not groups:
            return []
        floor = check_floor(store)
        out = []
        requests = check_requests(store, floor=floor).to_pylist()
        for row in requests:
            group, po, n = row["producer_group"], int(row["half_physical_offset"]), int(row["check_times"])
            if group not in groups or self.sent.get(po, -1) >= n:
                continue
            half = load_half(store, po)
            if half is not None and not is_decided(store, po, half=half):
                out.append((group, half, n))
            self.sent[po] = n
        self.sent = {po: n for po, n in self.sent.items() if po >= floor}
        self.seen_version = latest
        return out
