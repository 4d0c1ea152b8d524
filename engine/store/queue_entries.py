"""Consume-queue entries planned from commit-log rows: what dispatch commits, and what a pull reads
before dispatch has committed it (the queue's tail).

A commit-log row carries its queue and queue offset from the moment it is written (the sequencer
stamps them), so the consume-queue entry dispatch will commit for it is known as soon as the row is:
:func:`plan_entries` is that decision, pure, and dispatch commits exactly what it plans. RocketMQ's
broker makes a message pullable about a millisecond after it is stored (its reput service builds
the consume queue from the commit log in memory); here the dispatch job commits the consume queue
in micro-batches, which made a message pullable only a trigger interval and a Delta commit after its
send. :class:`QueueTail` closes the gap for readers: it reads the commit-log versions the consume
queue does not cover yet and plans their entries the same way, so a pull (and a lease, the Spark
source, the wire) sees a message as soon as its commit lands. Once dispatch commits, its entries
(identical) take over and the tail forgets what they cover.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import StoreError
from engine.model import UNDISPATCHED_FLAGS
from engine.store import schemas
from engine.store.delta import VERSION_COLUMN
from engine.store.store import Store

if TYPE_CHECKING:  # the consume queue's reader holds a tail: its module imports this one
    from engine.store.consume_queue import QueueMarks

_HIDDEN_FLAGS = pa.array(sorted(UNDISPATCHED_FLAGS), pa.int32())
# The commit-log columns an entry is planned from (with ``_version``): bodies are never needed.
PLAN_COLUMNS = (
    "topic",
    "queue_id",
    "queue_offset",
    "physical_offset",
    "size",
    "tags_code",
    "store_ts_ms",
    "sys_flag",
)
# Most commit-log versions a tail holds: a reader does not redo a dispatcher that has stopped.
TAIL_MAX_VERSIONS = 256


def _versions_within(
    rows: pa.Table, after: int | None = None, upto: int | None = None
) -> tuple[pa.Table, int | None]:
    """The ``rows`` of versions in ``(after, upto]`` (None: unbounded), and the last version among
    them (None: none), filtered only when some row is outside: a filter costs tens of microseconds
    per chunk (one per version read) even when it keeps every row."""
    if rows.num_rows == 0:
        return rows, None
    version = rows[VERSION_COLUMN]
    bounds = pc.min_max(version).as_py()
    low, high = bounds["min"], bounds["max"]
    if (after is None or low > after) and (upto is None or high <= upto):
        return rows, high
    keep = pc.greater(version, -1 if after is None else after)
    if upto is not None:
        keep = pc.and_(keep, pc.less_equal(version, upto))
    rows = rows.filter(keep)
    return rows, (int(pc.max(rows[VERSION_COLUMN]).as_py()) if rows.num_rows else None)


def visible_rows_after(rows: pa.Table, last: int) -> tuple[pa.Table, int]:
    """The commit-log ``rows`` (carrying ``_version``) of versions after ``last`` that consumers can
    see (transaction halves and rolled-back messages are not), and the last version among those
    newer rows (``last`` when there is none: the caller has nothing to cover). Pure.

    Which rows a consumer will ever see: dispatch gives them queue entries and the index
    (:mod:`engine.broker.index`) indexes them, with this one filter.
    """
    rows, covered = _versions_within(rows, last)
    if covered is None:
        return rows, last
    hidden = pc.is_in(rows["sys_flag"], value_set=_HIDDEN_FLAGS)
    if pc.any(hidden).as_py():  # filtered only then: see _versions_within
        rows = rows.filter(pc.invert(hidden))
    return rows, covered


def _in_log_order(rows: pa.Table) -> bool:
    """Whether ``rows`` are in commit-log order: by version, then physical offset."""
    versions = rows[VERSION_COLUMN].to_numpy()
    physical = rows["physical_offset"].to_numpy()
    later = versions[1:] > versions[:-1]
    same = versions[1:] == versions[:-1]
    return bool(np.all(later | (same & (physical[1:] >= physical[:-1]))))


def plan_entries(rows: pa.Table, last: int, marks: QueueMarks) -> tuple[pa.Table, int]:
    """Consume-queue entries for the commit-log ``rows`` (carrying ``_version``) of versions after
    ``last``, and the last version they cover; ``marks`` (the queues' next offsets as of the same
    consume-queue version as ``last``) is advanced in place. Pure.

    Raises:
        StoreError: a queue-offset gap (entries must continue each queue densely).
    """
    # The columns planned from, in one chunk: what follows costs per chunk (one per version read),
    # and a reader's rows carry bodies, which are neither copied nor needed here.
    rows, covered = visible_rows_after(rows.select([*PLAN_COLUMNS, VERSION_COLUMN]), last)
    if covered == last:
        return schemas.CONSUME_QUEUE_SCHEMA.empty_table(), last
    rows = rows.combine_chunks()
    if not _in_log_order(rows):  # as read, they are (a sort costs as much as the filters above)
        rows = rows.sort_by([(VERSION_COLUMN, "ascending"), ("physical_offset", "ascending")])
    topics = rows["topic"].to_pylist()
    qids = rows["queue_id"].to_pylist()
    offsets = rows["queue_offset"].to_pylist()
    keep = []
    for i, (topic, qid, off) in enumerate(zip(topics, qids, offsets, strict=True)):
        expected = marks.max_offset(topic, qid)
        if off < expected:
            continue  # already dispatched by an earlier writer of the same version range
        if off > expected:
            raise StoreError(
                f"dispatch found a gap in {topic}:{qid}: expected queue offset {expected}, got {off}",
                topic=topic,
                queue_id=qid,
                offset=off,
            )
        marks.set_next(topic, qid, off + 1)
        keep.append(i)
    if len(keep) < rows.num_rows:
        rows = rows.take(pa.array(keep, pa.int64()))
    marks.log_version = covered
    entries = pa.table(
        {
            "topic": rows["topic"],
            "queue_id": rows["queue_id"],
            "queue_offset": rows["queue_offset"],
            "physical_offset": rows["physical_offset"],
            "size": rows["size"],
            "tags_code": rows["tags_code"],
            "store_ts_ms": rows["store_ts_ms"],
            "log_version": rows[VERSION_COLUMN],
        },
        schema=schemas.CONSUME_QUEUE_SCHEMA,
    )
    return entries, covered


class QueueTail:
    """The commit-log versions one reader has read past what the consume queue covers, and the
    entries they plan (module docstring). Thread-safe.

    Args:
        store: the store.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        names = store.commit_logs
        self._read_to = [-1] * len(names)  # per shard: the last commit-log version read
        self._rows: list[pa.Table | None] = [None] * len(names)  # per shard: rows of versions read
        self.marks: QueueMarks | None = None  # the queues' bounds with the tail (None: no tail)
        self.entries: dict[tuple[str, int], pa.Table] = {}  # tail entries per queue, in offset order
        self._by_offset: dict[int, int] = {}  # physical offset -> row index in self._tail_rows
        self._tail_rows: pa.Table | None = None

    def advance(self, covered: list[int], marks: QueueMarks, *, cq_changed: bool) -> bool:
        """Read the commit-log versions committed after the consume queue's ``covered`` versions
        (per shard; ``marks`` are the consume queue's as of them) and plan their entries; True when
        what a reader sees changed. A read that fails, or meets a gap (versions the reader could not
        read), leaves no tail: readers see the consume queue alone, as before dispatch.
        """
        with self._lock:
            grew = False
            for shard, name in enumerate(self._store.commit_logs):
                after = max(self._read_to[shard], covered[shard])
                rows = self._rows[shard]
                if rows is not None and self._read_to[shard] < covered[shard]:
                    rows = None  # dispatch passed everything read: start again from its marker
                if rows is not None and covered[shard] >= 0:
                    rows, _ = _versions_within(rows, covered[shard])
                latest = self._store.latest_version_hint(name, max(after, 0))
                last = min(latest, covered[shard] + TAIL_MAX_VERSIONS)
                if last > after:
                    try:
                        chunks = self._store.versions_after(
                            name, after, schemas.COMMIT_LOG_SCHEMA, max_versions=last - after
                        )
                        read, _ = next(iter(chunks))
                    except (StoreError, StopIteration):
                        self._drop()
                        return True
                    read, _ = _versions_within(read, upto=last)
                    rows = read if rows is None else pa.concat_tables([rows, read])
                    self._read_to[shard] = last
                    grew = True
                elif self._read_to[shard] < after:
                    self._read_to[shard] = after
                self._rows[shard] = rows
            if not grew and not cq_changed:
                return False
            self._plan(covered, marks)
            return True

    def is_current(self, covered: list[int]) -> bool:
        """True when :meth:`advance` with the same ``covered`` would read nothing new (one look for
        the next commit file of each shard; no lock, nothing read)."""
        for shard, name in enumerate(self._store.commit_logs):
            after = max(self._read_to[shard], covered[shard])
            if self._read_to[shard] < after:
                return False
            latest = self._store.latest_version_hint(name, max(after, 0))
            if min(latest, covered[shard] + TAIL_MAX_VERSIONS) > after:
                return False
        return True

    def _plan(self, covered: list[int], marks: QueueMarks) -> None:
        planned = marks.copy()
        parts, rows_kept = [], []
        try:
            for shard, rows in enumerate(self._rows):
                if rows is None or rows.num_rows == 0:
                    continue
                entries, _ = plan_entries(rows, covered[shard], planned)
                parts.append(entries)
                rows_kept.append(rows)
        except StoreError:
            self._drop()
            return
        if not parts:
            self.marks, self.entries, self._tail_rows, self._by_offset = None, {}, None, {}
            return
        entries = pa.concat_tables(parts)
        by_queue: dict[tuple[str, int], list[int]] = {}
        keys = zip(entries["topic"].to_pylist(), entries["queue_id"].to_pylist(), strict=True)
        for i, key in enumerate(keys):
            by_queue.setdefault(key, []).append(i)
        self.entries = {
            key: entries.take(pa.array(at, pa.int64())).sort_by("queue_offset")
            for key, at in by_queue.items()
        }
        self._tail_rows = pa.concat_tables(rows_kept)
        self._by_offset = {int(p): i for i, p in enumerate(self._tail_rows["physical_offset"].to_pylist())}
        self.marks = planned

    def _drop(self) -> None:
        self._rows = [None] * len(self._rows)
        self._read_to = [-1] * len(self._read_to)
        self.marks, self.entries, self._tail_rows, self._by_offset = None, {}, None, {}

    def rows_at(self, physical_offsets: list[int]) -> tuple[pa.Table | None, list[int]]:
        """The commit-log rows of the tail at ``physical_offsets`` (None when none is) and the
        offsets it does not hold."""
        with self._lock:
            tail = self._tail_rows
            if tail is None:
                return None, physical_offsets
            found = [self._by_offset[p] for p in physical_offsets if p in self._by_offset]
            rest = [p for p in physical_offsets if p not in self._by_offset]
            if not found:
                return None, rest
            return tail.take(pa.array(found, pa.int64())).drop_columns([VERSION_COLUMN]), rest
