"""Transactional messages: half messages, decisions and check-back, as RocketMQ's.

A transaction is a *half message* in ``commit_log``: topic ``RMQ_SYS_TRANS_HALF_TOPIC`` (queue 0),
``sys_flag`` PREPARED (never dispatched, no queue offset), with the real destination in properties
``REAL_TOPIC`` / ``REAL_QID``, ``TRAN_MSG=true`` and the producer group in ``PGROUP``.

Its *decision* is also a commit-log row, appended with the Delta app transaction
``mq.tx.<half physical offset>`` = 0 in the same commit
(:func:`engine.store.transactions.end_transaction`):

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
(:data:`engine.store.table_properties.TXN_RETENTION`, 7 days), so a decision older than that is found
by content (its ``TRAN_HALF_OFFSET``), and a new decision on such a half writes a fresh guard.

The ``transactions`` table is the conversation with producers and an audit trail: the check job
(:func:`check_transactions`) appends CHECK requests for halves older than the timeout that have no
decision (again every check interval, at most ``max_checks`` times, then it rolls them back); each
producer group's check-back thread reads its CHECK rows, asks its checker and decides. A half whose
checks ran out is rolled back and, in the same commit, copied to ``TRANS_CHECK_MAX_TIME_TOPIC`` for
inspection (RocketMQ's ``resolveDiscardMsg``); a half's ``CHECK_IMMUNITY_TIME_IN_SECONDS`` replaces
the timeout before its first check. Decisions are
recorded there too (COMMIT / ROLLBACK with the reason), for SQL over the table; a missing decision
row never changes an outcome. The check job keeps, in the table's commitInfo (:data:`TX_FLOOR_KEY`), the
physical offset below which every half is decided, so scans stay short.

On a sharded store the halves are read from the shard of ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, and
each half's guard and decision from the shard of its real queue
(:func:`engine.store.transactions.decision_shard`).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds

from engine.errors import StoreError
from engine.model import SysFlag
from engine.protocol.names import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC
from engine.protocol.shards import shard_of_queue
from engine.protocol.topics import system_topic_config
from engine.protocol.transactions import (
    DEFAULT_CHECK_INTERVAL_MS,
    DEFAULT_MAX_CHECKS,
    DEFAULT_TIMEOUT_MS,
    EVENT_CHECK,
    EVENT_ROLLBACK,
    REASON_MAX_CHECKS,
    HalfMessage,
    LocalTransactionState,
    check_int,
    check_timeout_ms,
    next_check,
    transaction_record,
    validate_check_settings,
)
from engine.store import schemas
from engine.store.commit_log import CommitLogs, CommitLogWriter
from engine.store.commit_markers import TX_FLOOR_KEY, transaction_app
from engine.store.delta import Snapshot, read_version, stats_range
from engine.store.store import Store, sql_literal
from engine.store.store import now_ms as _clock_ms
from engine.store.transactions import (
    append_records,
    check_floor,
    check_max_time_copy,
    check_requests,
    decision_record,
    decision_shard,
    end_transaction,
    guard_may_have_expired_now,
    load_half,
)


def undecided_halves(store: Store, *, floor: int | None = None) -> tuple[list[HalfMessage], int]:
    """Half messages without a decision, oldest first, and the new floor.

    The halves come without their bodies (:func:`~engine.store.transactions.load_half` reads
    one); the floor is as :func:`~engine.store.transactions.check_floor`.
    """
    low = check_floor(store) if floor is None else floor
    table = store.read(
        schemas.commit_log_table(shard_of_queue(TRANS_HALF_TOPIC, 0, store.commit_log_shards)),
        columns=[n for n in schemas.COMMIT_LOG_SCHEMA.names if n != "body"],
        predicate=f"topic = {sql_literal(TRANS_HALF_TOPIC)} AND physical_offset >= {low}",
        filter=(ds.field("topic") == TRANS_HALF_TOPIC)
        & (ds.field("physical_offset") >= low)
        & (ds.field("sys_flag") == int(SysFlag.PREPARED)),
    )
    if table.num_rows == 0:
        return [], low
    table = table.sort_by("physical_offset")
    logs: dict[int, Snapshot] = {}
    halves = []
    for row in table.to_pylist():
        half = HalfMessage.from_row(row)
        shard = decision_shard(store, half)  # the guard is on the commit that writes the real message
        log = logs.get(shard)
        if log is None:
            log = logs[shard] = store.shared(schemas.commit_log_table(shard))
        if log.app_version(transaction_app(half.physical_offset)) >= 0:
            continue
        if guard_may_have_expired_now(half.store_ts_ms) and decision_record(store, half):
            continue  # decided more than TXN_RETENTION ago
        halves.append(half)
    if halves:
        return halves, halves[0].physical_offset
    return [], int(pc.max(table["physical_offset"]).as_py()) + 1


def check_transactions(
    store: Store,
    now_ms: int | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    max_checks: int = DEFAULT_MAX_CHECKS,
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS,
    *,
    writer: CommitLogWriter | CommitLogs | None = None,
) -> int:
    """One pass of the transaction check: ask producers about old undecided halves, or give up.

    For every half message without a decision stored at least ``timeout_ms`` before ``now_ms``: if it
    was never checked, or its last check is ``check_interval_ms`` old, append a CHECK request (the
    producer group's check-back thread answers it); once it has been checked ``max_checks`` times and
    the last answer is overdue, roll it back and keep a copy in ``TRANS_CHECK_MAX_TIME_TOPIC``
    (RocketMQ discards it there). A half's ``CHECK_IMMUNITY_TIME_IN_SECONDS`` property, when set,
    replaces ``timeout_ms`` for that half. Safe to run repeatedly and from
    several places: a second pass at the same time does nothing, and decisions are exclusive.

    Args:
        store: the store.
        now_ms: the clock (default now).
        timeout_ms: age of a half before its first check.
        max_checks: checks before the rollback.
        check_interval_ms: time between checks of one half.
        writer: the commit-log writer(s) to reuse for rollbacks (a rollback is written on the shard
            of the half's real queue).

    Returns:
        Halves acted on: CHECK requests written plus rollbacks.

    Raises:
        InvalidArgumentError: a negative time or ``max_checks``.
        StoreError, CommitConflictError: a read or write failed.
    """
    return _check(store, now_ms, timeout_ms, max_checks, check_interval_ms, writer=writer)[0]


def _check(
    store: Store,
    now_ms: int | None,
    timeout_ms: int,
    max_checks: int,
    check_interval_ms: int,
    *,
    writer: CommitLogWriter | CommitLogs | None,
) -> tuple[int, int]:
    """:func:`check_transactions`: (halves acted on, undecided halves found, due or not)."""
    now = check_int("now_ms", now_ms, 0) if now_ms is not None else _clock_ms()
    validate_check_settings(timeout_ms, max_checks, check_interval_ms)
    old_floor = check_floor(store)
    halves, floor = undecided_halves(store, floor=old_floor)
    # A half's CHECK_IMMUNITY_TIME_IN_SECONDS replaces the timeout for that half, as in RocketMQ.
    due = [h for h in halves if h.store_ts_ms <= now - check_timeout_ms(h.properties, timeout_ms)]
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
            requests.append(transaction_record(half, EVENT_CHECK, check_times=times + 1, ts_ms=now))
        elif action == EVENT_ROLLBACK:
            rollbacks.append((half, times))
    if requests or floor != old_floor:
        append_records(store, requests, {TX_FLOOR_KEY: json.dumps(floor)})
    if rollbacks:
        writer = writer or CommitLogs(store)
        if store.topic_configs(refresh=True).get(TRANS_CHECK_MAX_TIME_TOPIC) is None:
            store.put_topic(system_topic_config(TRANS_CHECK_MAX_TIME_TOPIC, _clock_ms()))
        for half, times in rollbacks:
            full = load_half(store, half.physical_offset) or half  # the scan left the body out
            end_transaction(
                store,
                writer,
                full,
                LocalTransactionState.ROLLBACK,
                reason=REASON_MAX_CHECKS,
                check_times=times,
                extra=[check_max_time_copy(full)],
            )
    return len(requests) + len(rollbacks), len(halves)


# Commit-log versions a :class:`TransactionCheck` looks through for a new half before it just runs
# the whole check (a loop that fell far behind, or started on a long log).
_LOOK_VERSIONS = 2000
# A maximum string statistic this long may be a truncated one (Delta writers cut long strings):
# then it bounds nothing.
_CUT_STAT = 32


def _may_hold(stats: str | None, topic: str) -> bool:
    """Whether a data file whose Delta statistics are ``stats`` may hold rows of ``topic``."""
    found = stats_range(stats, "topic")
    if found is None:
        return True
    low, high = found
    if not (isinstance(low, str) and isinstance(high, str)) or len(high) >= _CUT_STAT:
        return True
    return low <= topic <= high


class TransactionCheck:
    """:func:`check_transactions` as the broker loop runs it, every round: the whole check (a read of
    the commit log for halves, which catches its snapshot up through delta-rs) only while there are
    undecided halves, or when a commit-log version since the last check may hold a new half (the
    statistics of a file it added span the half topic). Otherwise a pass reads nothing but the new
    commits' file lists, which dispatch has parsed already (:func:`read_version` keeps them).

    A half becomes due with time only while it is undecided, so with none found, only a new half can
    give the check work. Under load the whole check cost about 360 ms a round (the delta-rs catch-up
    of some 250 commits), with no half anywhere.
    """

    def __init__(
        self,
        store: Store,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        max_checks: int = DEFAULT_MAX_CHECKS,
        check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS,
    ) -> None:
        validate_check_settings(timeout_ms, max_checks, check_interval_ms)
        self._store = store
        self._settings = (timeout_ms, max_checks, check_interval_ms)
        self._seen = -1  # the commit-log version the last whole check read up to
        self._undecided = True  # what that check found (before any: assume some)

    def __call__(self, now_ms: int | None = None) -> int:
        """One pass (the clock: ``now_ms``, default now); returns the halves acted on.

        Raises:
            StoreError, CommitConflictError: as :func:`check_transactions`.
        """
        store = self._store
        table = schemas.commit_log_table(shard_of_queue(TRANS_HALF_TOPIC, 0, store.commit_log_shards))
        latest = store.latest_version_hint(table, self._seen)
        if not self._undecided and not self._maybe_new_half(table, latest):
            self._seen = latest
            return 0
        acted, undecided = _check(store, now_ms, *self._settings, writer=None)
        # the check read a snapshot at least as new as ``latest``: any half up to it was found
        self._seen, self._undecided = latest, undecided > 0
        return acted

    def _maybe_new_half(self, table: str, latest: int) -> bool:
        if self._seen < 0 or latest - self._seen > _LOOK_VERSIONS:
            return True
        uri, options = self._store.uri(table), self._store.storage_options
        try:
            for version in range(self._seen + 1, latest + 1):
                added = read_version(uri, version, options)
                if any(_may_hold(stats, TRANS_HALF_TOPIC) for stats in added.stats):
                    return True
        except StoreError:
            return True  # a commit gone or unreadable: the whole check says what there is
        return False
