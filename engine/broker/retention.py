"""Consumer-aware retention: which old messages every consumer is done with, and deleting them.

:func:`retain` deletes commit-log messages older than the retention window that every consumer of
their topic has consumed, keeps the consume queue's minimum offsets ahead of the deletion, and drops
index files that only point at deleted messages. The file rewrites and commits are
:mod:`engine.store.delta.data_files`'s; what to delete and the order of the commits are decided here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs

from engine.broker.compaction import check_int, dispatched_physical
from engine.broker.schedule_state import schedule_progress
from engine.errors import CommitStateUnknownError, InvalidArgumentError
from engine.protocol import SCHEDULE_TOPIC
from engine.protocol.shards import SHARD_SHIFT
from engine.store import schemas
from engine.store import store as _store_module
from engine.store.commit_log import COMMIT_LOG_ROW_GROUP_ROWS, read_hwm
from engine.store.commit_markers import CQ_KEY
from engine.store.consume_queue import QueueMarks, queue_marks
from engine.store.delta import (
    Action,
    DataFile,
    Snapshot,
    StatsColumns,
    data_files_of,
    delete_files,
    int_column,
    read_columns,
    read_file,
    remove_action,
    str_column,
    table_filesystem,
    write_file,
)
from engine.store.maintenance import Commit, commit_planned
from engine.store.store import Store

HOUR_MS = 3_600_000


def check_hours(name: str, value: object) -> float:
    """``value`` as hours if it is a finite number >= 0; raises :class:`InvalidArgumentError` otherwise
    (the retention window, and vacuum's)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise InvalidArgumentError(f"{name} must be a number of hours >= 0, got {value!r}", **{name: value})
    return float(value)


class RetentionReport(TypedDict):
    """What :func:`retain` did."""

    cutoff_ms: int
    forced: bool
    files_removed: int  # commit-log files deleted whole
    files_rewritten: int  # commit-log files rewritten without their deleted rows
    rows_removed: int
    bytes_removed: int
    consume_queue_entries_removed: int
    index_files_removed: int
    min_offsets: dict[str, dict[int, int]]  # queues whose minimum offset rose -> the new minimum
    protected_topics: list[str]  # topics with expired messages kept because no group consumes them
    versions: dict[str, int]  # commits made, per table


def protected_offsets(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, int]]:
    """Per topic that has committed offsets, per queue, the smallest offset a consumer still needs.

    ``rows`` are ``consumer_offset`` rows; the latest (by ``ts_ms``) per group, consumer id, topic and
    queue counts. A consumer (group and consumer id) that committed offsets for a topic but never for
    one of its queues needs that queue from 0. Pure function.
    """
    latest: dict[tuple[str, str, str, int], tuple[int, int]] = {}
    for r in rows:
        key = (str(r["group"]), str(r["consumer_id"]), str(r["topic"]), int(r["queue_id"]))
        ts, offset = int(r["ts_ms"]), int(r["offset"])
        if key not in latest or ts >= latest[key][0]:
            latest[key] = (ts, offset)
    members: dict[str, set[tuple[str, str]]] = {}
    by_queue: dict[str, dict[int, dict[tuple[str, str], int]]] = {}
    for (group, consumer, topic, queue_id), (_, offset) in latest.items():
        members.setdefault(topic, set()).add((group, consumer))
        by_queue.setdefault(topic, {}).setdefault(queue_id, {})[(group, consumer)] = offset
    out: dict[str, dict[int, int]] = {}
    for topic, queues in by_queue.items():
        need = members[topic]
        out[topic] = {q: (min(offs.values()) if set(offs) == need else 0) for q, offs in queues.items()}
    return out


def consumed_offsets(store: Store) -> dict[str, dict[int, int]]:
    """:func:`protected_offsets` of the store's consumer offsets, plus the schedule's progress.

    The schedule job is the consumer of ``SCHEDULE_TOPIC_XXXX``: its queues are needed from just past
    what it delivered (level queues) or handled (the timer queue's prefix).
    """
    consumed = protected_offsets(store.read(schemas.CONSUMER_OFFSET).to_pylist())
    progress = {qid: last + 1 for qid, last in schedule_progress(store).items() if last >= 0}
    if progress:
        consumed[SCHEDULE_TOPIC] = progress
    return consumed


def _queue_keys(table: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(table["topic"], pc.cast(table["queue_id"], pa.string()), "\x1f")


def _per_row(keys: pa.Array, values: Mapping[str, int], default: int) -> np.ndarray:
    """``values[key]`` for every row's key (``default`` where missing)."""
    names = list(values)
    lookup = np.asarray([values[n] for n in names] + [default], dtype=np.int64)
    index = pc.index_in(keys, value_set=pa.array(names, pa.string())).fill_null(len(names))
    picked: np.ndarray = lookup[index.to_numpy(zero_copy_only=False)]
    return picked


@dataclass
class _RetentionPlan:
    table: str
    fs: pa_fs.FileSystem
    removes: list[DataFile] = field(default_factory=list)
    rewrites: list[tuple[DataFile, Action]] = field(default_factory=list)
    deleted_max: dict[tuple[str, int], int] = field(default_factory=dict)
    rows: int = 0
    bytes: int = 0
    protected: set[str] = field(default_factory=set)


def _plan_commit_log(
    store: Store,
    shard: int,
    cutoff: int,
    force: bool,
    marks: QueueMarks,
    consumed: Mapping[str, Mapping[int, int]],
) -> _RetentionPlan:
    """Which files of commit-log shard ``shard`` to delete or rewrite; rewritten files are written
    already."""
    name = schemas.commit_log_table(shard)
    log = store.snapshot(name)
    fs = table_filesystem(store.uri(name), store.storage_options)
    watermark = dispatched_physical(store, shard)
    indexed = log.indexed_columns()
    files = sorted(
        (f for f in log.files("physical_offset") if f.lo is not None),
        key=lambda f: (f.lo, f.path),
    )
    plan = _RetentionPlan(name, fs)
    try:
        for f in files:
            if f.hi is None or f.hi > watermark:
                break  # not dispatched yet: nothing here or after it is consumed
            cols = read_columns(fs, f.path, ["topic", "queue_id", "queue_offset", "store_ts_ms"])
            if cols.num_rows == 0:
                plan.removes.append(f)
                continue
            keys = _queue_keys(cols)
            limits: dict[str, int] = {}
            old_mins: dict[str, int] = {}
            uniq = cols.select(["topic", "queue_id"]).group_by(["topic", "queue_id"]).aggregate([])
            for topic, qid in zip(uniq["topic"].to_pylist(), uniq["queue_id"].to_pylist(), strict=True):
                key = f"{topic}\x1f{qid}"
                dispatched = marks.max_offset(topic, qid)
                if force:
                    limits[key] = dispatched
                elif topic in consumed:
                    limits[key] = min(consumed[topic].get(qid, 0), dispatched)
                else:
                    limits[key] = 0
                old_mins[key] = marks.min_offset(topic, qid)
            limit = _per_row(keys, limits, 0)
            old_min = _per_row(keys, old_mins, 0)
            offsets = cols["queue_offset"].to_numpy()
            expired = cols["store_ts_ms"].to_numpy() < cutoff
            indexed_rows = offsets >= 0
            deletable = np.where(indexed_rows, (expired & (offsets < limit)) | (offsets < old_min), expired)
            if not force:
                kept_old = expired & indexed_rows & ~deletable
                if kept_old.any():
                    topics = set(pc.filter(cols["topic"], pa.array(kept_old)).to_pylist())
                    plan.protected.update(t for t in topics if t not in consumed)
            if not expired.any() and not deletable.any():
                break  # store times only grow with physical offsets: every later file is newer
            if not deletable.any():
                continue
            gone = deletable & indexed_rows
            if gone.any():
                topic_col = cols["topic"].to_numpy(zero_copy_only=False)
                qid_col = cols["queue_id"].to_numpy()
                for i in np.flatnonzero(gone):
                    qkey = (str(topic_col[i]), int(qid_col[i]))
                    if offsets[i] > plan.deleted_max.get(qkey, -1):
                        plan.deleted_max[qkey] = int(offsets[i])
            removed_rows = int(deletable.sum())
            plan.rows += removed_rows
            if deletable.all():
                plan.removes.append(f)
                plan.bytes += f.size
                continue
            rows, codec = read_file(fs, f.path, schemas.COMMIT_LOG_SCHEMA)
            kept = rows.filter(pa.array(~deletable))
            add = write_file(fs, kept, codec, COMMIT_LOG_ROW_GROUP_ROWS, indexed)
            plan.rewrites.append((f, add))
            plan.bytes += max(0, f.size - int(add.size))
    except BaseException:
        delete_files(fs, [a.path for _, a in plan.rewrites])
        raise
    return plan


def _trim_consume_queue(
    fs: pa_fs.FileSystem, dt: Snapshot, mins: Mapping[str, int], indexed: StatsColumns, written: list[str]
) -> tuple[list[Action], int]:
    """Actions deleting consume-queue entries below their queue's minimum; returns them and the count."""
    if not mins:
        return [], 0
    queues = [(k.split("\x1f")[0], int(k.split("\x1f")[1]), m) for k, m in mins.items()]
    actions_table = dt.add_actions()
    files = data_files_of(actions_table, "queue_offset")
    stats = {
        side: (str_column(actions_table, f"{side}.topic"), int_column(actions_table, f"{side}.queue_id"))
        for side in ("min", "max")
    }
    actions: list[Action] = []
    removed = 0
    for i, f in enumerate(files):
        t_lo, t_hi = stats["min"][0][i], stats["max"][0][i]
        q_lo, q_hi = stats["min"][1][i], stats["max"][1][i]
        # Statistics rule a file out when no queue it may hold has its minimum above the file's first offset.
        if f.lo is not None and not any(
            m > f.lo
            and (t_lo is None or t_lo <= topic)
            and (t_hi is None or topic <= t_hi)
            and (q_lo is None or q_lo <= qid)
            and (q_hi is None or qid <= q_hi)
            for topic, qid, m in queues
        ):
            continue
        cols = read_columns(fs, f.path, ["topic", "queue_id", "queue_offset"])
        below = cols["queue_offset"].to_numpy() < _per_row(_queue_keys(cols), mins, 0)
        if not below.any():
            continue
        removed += int(below.sum())
        actions.append(remove_action(f, True))
        if not below.all():
            rows, codec = read_file(fs, f.path, schemas.CONSUME_QUEUE_SCHEMA)
            add = write_file(fs, rows.filter(pa.array(~below)), codec, None, indexed)
            written.append(add.path)
            actions.append(add)
    return actions, removed


def retain(
    store: Store,
    file_reserved_hours: float | None = None,
    force: bool = False,
    now_ms: int | None = None,
) -> RetentionReport:
    """Delete commit-log messages stored more than ``file_reserved_hours`` ago that are consumed.

    Protection rule. A message is deleted only when it is older than the window *and* below, in its
    queue, the smallest committed offset of every consumer (group, consumer id) with offsets for its
    topic (a consumer without an offset for that queue needs it from 0). Unlike RocketMQ, which
    deletes by age alone, messages of a topic no group has offsets for are kept: they may not have
    been read yet. ``force=True`` restores RocketMQ's rule (age alone, for dispatched messages).
    Transaction halves and rollbacks, which no consumer reads, go by age alone.

    Steps, in the order that keeps concurrent pulls correct:

    1. commit-log files whose rows are all deletable are chosen whole; a file with some deletable
       rows is rewritten without them (the kept rows are added with ``dataChange = false``);
    2. the consume queue gets a commit raising each affected queue's minimum offset (``mq.cq``) and
       deleting its entries below it, so a pull below the minimum now gets OFFSET_ILLEGAL with next =
       the new minimum before any message it could point at is gone;
    3. the commit log gets a commit removing the files (the sequencer's marks carried forward):
       one per commit-log shard with something to delete, each shard planned against its own
       dispatch watermark;
    4. index files whose every entry points below its shard's first remaining offset are removed.

    Files leave the disk only when :func:`vacuum` runs after its window.

    Args:
        store: the store.
        file_reserved_hours: the age window; default the config's ``file_reserved_hours`` (72).
        force: delete by age alone, even messages no group has consumed.
        now_ms: the current time (tests); default the clock.

    Returns:
        What was deleted and the new minimum offsets.

    Raises:
        InvalidArgumentError: negative hours or a bad ``now_ms``; nothing was changed.
        CommitConflictError, CommitStateUnknownError, StoreError: a commit failed (rerun to finish).
    """
    hours = check_hours(
        "file_reserved_hours",
        store.config.file_reserved_hours if file_reserved_hours is None else file_reserved_hours,
    )
    if now_ms is not None:
        check_int("now_ms", now_ms, 0)
    now = _store_module.now_ms() if now_ms is None else now_ms
    cutoff = now - int(hours * HOUR_MS)
    report = RetentionReport(
        cutoff_ms=cutoff,
        forced=bool(force),
        files_removed=0,
        files_rewritten=0,
        rows_removed=0,
        bytes_removed=0,
        consume_queue_entries_removed=0,
        index_files_removed=0,
        min_offsets={},
        protected_topics=[],
        versions={},
    )
    marks = queue_marks(store.snapshot(schemas.CONSUME_QUEUE))
    consumed = consumed_offsets(store)
    plans: list[_RetentionPlan] = []
    try:
        for shard in range(store.commit_log_shards):
            plans.append(_plan_commit_log(store, shard, cutoff, bool(force), marks, consumed))
        report["protected_topics"] = sorted(set().union(*(p.protected for p in plans)))
        _retain_consume_queue(store, plans, report)
        for plan in plans:
            _retain_commit_log(store, plan, report)
    except CommitStateUnknownError:
        raise
    except BaseException:
        for plan in plans:
            delete_files(plan.fs, [a.path for _, a in plan.rewrites])
        raise
    _retain_index(store, report)
    return report


def _retain_consume_queue(store: Store, plans: list[_RetentionPlan], report: RetentionReport) -> None:
    fs = table_filesystem(store.uri(schemas.CONSUME_QUEUE), store.storage_options)
    written: list[str] = []
    result: dict[str, Any] = {}

    def plan_cq(dt: Snapshot) -> Commit | None:
        delete_files(fs, written)
        written.clear()
        marks = queue_marks(dt)
        raised: dict[str, dict[int, int]] = {}
        for (topic, qid), last in (item for plan in plans for item in plan.deleted_max.items()):
            if last + 1 > marks.min_offset(topic, qid):
                marks.set_min(topic, qid, last + 1)
                raised.setdefault(topic, {})[qid] = last + 1
        mins = {f"{t}\x1f{q}": m for t, values in marks.min.items() for q, m in enumerate(values) if m > 0}
        actions, removed = _trim_consume_queue(fs, dt, mins, dt.indexed_columns(), written)
        if not raised and not actions:
            return None
        result.update(raised=raised, removed=removed)
        return Commit(actions, {CQ_KEY: marks.to_json()})

    try:
        version = commit_planned(store, schemas.CONSUME_QUEUE, plan_cq, "retain")
    except CommitStateUnknownError:
        raise
    except BaseException:
        delete_files(fs, written)
        raise
    if version is not None:
        report["versions"][schemas.CONSUME_QUEUE] = version
        report["min_offsets"] = result["raised"]
        report["consume_queue_entries_removed"] = result["removed"]


def _retain_commit_log(store: Store, plan: _RetentionPlan, report: RetentionReport) -> None:
    if not plan.removes and not plan.rewrites:
        return
    needed = {f.path for f in plan.removes} | {f.path for f, _ in plan.rewrites}

    def plan_log(dt: Snapshot) -> Commit | None:
        live = dt.live_paths()
        if not needed <= live:
            return None  # compacted meanwhile: the rows are below the new minimums; the next run deletes them
        actions: list[Action] = [remove_action(f, True) for f in plan.removes]
        for f, add in plan.rewrites:
            actions.extend([add, remove_action(f, True)])
        return Commit(actions)

    version = commit_planned(store, plan.table, plan_log, "retain")
    if version is None:
        delete_files(plan.fs, [a.path for _, a in plan.rewrites])
        return
    report["versions"][plan.table] = version
    report["files_removed"] += len(plan.removes)
    report["files_rewritten"] += len(plan.rewrites)
    report["rows_removed"] += plan.rows
    report["bytes_removed"] += plan.bytes


def _first_offsets(store: Store) -> list[int]:
    """Per commit-log shard, the first physical offset still stored (its next offset when the shard
    holds no file): every offset of the shard below it is deleted."""
    firsts = []
    for name in store.commit_logs:
        log = store.snapshot(name)
        starts = [f.lo for f in log.files("physical_offset") if f.lo is not None]
        firsts.append(min(starts) if starts else read_hwm(log).physical)
    return firsts


def _only_deleted(offsets: np.ndarray, firsts: list[int]) -> bool:
    """Whether every offset is below its shard's first stored offset (offsets of no shard: kept)."""
    shards = offsets >> SHARD_SHIFT
    bound = np.asarray([*firsts, -1], dtype=np.int64)[np.clip(shards, 0, len(firsts))]
    return bool(np.all(offsets < bound))


def _retain_index(store: Store, report: RetentionReport) -> None:
    fs = table_filesystem(store.uri(schemas.INDEX), store.storage_options)

    def plan_index(dt: Snapshot) -> Commit | None:
        firsts = _first_offsets(store)
        gone = []
        for f in dt.files("physical_offset"):
            if f.lo is None or f.hi is None:
                continue
            ends = np.asarray([f.lo, f.hi], dtype=np.int64)
            if not _only_deleted(ends, firsts):
                continue  # its first or last entry points at a stored message
            if f.lo >> SHARD_SHIFT != f.hi >> SHARD_SHIFT:  # entries of several shards: look at each
                offsets = read_columns(fs, f.path, ["physical_offset"])["physical_offset"].to_numpy()
                if not _only_deleted(offsets, firsts):
                    continue
            gone.append(f)
        if not gone:
            return None
        report["index_files_removed"] = len(gone)
        return Commit([remove_action(f, True) for f in gone])

    version = commit_planned(store, schemas.INDEX, plan_index, "retain")
    if version is not None:
        report["versions"][schemas.INDEX] = version
    else:
        report["index_files_removed"] = 0
