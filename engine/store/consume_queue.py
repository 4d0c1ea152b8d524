"""The ``consume_queue`` table: per-queue bounds, the reads behind a pull, and dispatch commits.

One row is the index entry of a dispatched message (topic, queue id, queue offset -> physical offset,
size, tag hash code, store time). Every dispatch commit carries, in its commitInfo
(:data:`~engine.store.commit_markers.CQ_KEY`), each queue's next offset and minimum retained offset
(:class:`QueueMarks`), and a Delta app transaction (:data:`~engine.store.commit_markers.DISPATCH_APP`)
with the last commit-log version it covers, so a replayed dispatch adds nothing. A store of several
commit-log shards keeps one such app transaction per shard
(:func:`~engine.store.commit_markers.dispatch_app`; shard 0 keeps ``mq.dispatch``), and a dispatch
commit covers versions of one shard.

A pull is a pruned table scan, not a Spark job (:class:`QueueIndex`): files are chosen by their Delta
statistics (topic, queue id, queue offset for the consume queue; physical offset for the commit
log), then read by :class:`~engine.store.delta.file_reader.FileReader`. Which entries to dispatch is the
broker's decision (:mod:`engine.broker.dispatch`).
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import StoreError
from engine.protocol.pull import batch_stop
from engine.protocol.selectors import ExpressionType, MessageSelector
from engine.protocol.shards import SHARD_SHIFT
from engine.store import schemas
from engine.store.commit_markers import BATCH_KEY, CQ_KEY, dispatch_app
from engine.store.delta import (
    DirectAppender,
    FileReader,
    FileStats,
    Snapshot,
    failed_link_landed,
    read_version,
    stats_range,
)
from engine.store.queue_entries import QueueTail
from engine.store.store import Store


@dataclass
class QueueMarks:
    """Consume-queue bounds per queue: next offset to dispatch and minimum retained offset."""

    next: dict[str, list[int]] = field(default_factory=dict)
    min: dict[str, list[int]] = field(default_factory=dict)
    log_version: int = -1

    def max_offset(self, topic: str, queue_id: int) -> int:
        offsets = self.next.get(topic)
        return offsets[queue_id] if offsets is not None and queue_id < len(offsets) else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        offsets = self.min.get(topic)
        return offsets[queue_id] if offsets is not None and queue_id < len(offsets) else 0

    def set_next(self, topic: str, queue_id: int, value: int) -> None:
        offsets = self.next.setdefault(topic, [])
        while len(offsets) <= queue_id:
            offsets.append(0)
        offsets[queue_id] = value

    def set_min(self, topic: str, queue_id: int, value: int) -> None:
        offsets = self.min.setdefault(topic, [])
        while len(offsets) <= queue_id:
            offsets.append(0)
        offsets[queue_id] = value

    def to_json(self) -> str:
        data: dict[str, Any] = {"q": self.next, "m": self.min, "v": self.log_version}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> QueueMarks:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(
            {k: list(v) for k, v in data.get("q", {}).items()},
            {k: list(v) for k, v in data.get("m", {}).items()},
            int(data.get("v", -1)),
        )

    def copy(self) -> QueueMarks:
        return QueueMarks(
            {k: list(v) for k, v in self.next.items()},
            {k: list(v) for k, v in self.min.items()},
            self.log_version,
        )


def queue_marks(snapshot: Snapshot) -> QueueMarks:
    """Consume-queue marks as of ``snapshot``'s version."""
    return QueueMarks.from_json(snapshot.commit_value(CQ_KEY))


def dispatched_version(store: Store, shard: int = 0) -> int:
    """Last version of commit-log shard ``shard`` whose rows are in the consume queue, as of now
    (-1 before any)."""
    return store.app_version(schemas.CONSUME_QUEUE, dispatch_app(shard))


def covered_version(snapshot: Snapshot, shard: int = 0) -> int:
    """Last version of commit-log shard ``shard`` dispatched as of a consume-queue snapshot (-1
    before any)."""
    return snapshot.app_version(dispatch_app(shard))


def commit_entries(
    store: Store, snapshot: Snapshot, entries: pa.Table, covered: int, marks: QueueMarks, shard: int = 0
) -> int:
    """Commit dispatched ``entries`` covering versions up to ``covered`` of commit-log shard
    ``shard``, with the queues' new ``marks``, as exactly the version after ``snapshot``; returns
    that version.

    Raises:
        CommitConflictError: another dispatcher committed first (plan again from a new snapshot).
        StoreError: the write failed.
    """
    markers = {CQ_KEY: marks.to_json()}
    return store.append_progress(
        schemas.CONSUME_QUEUE,
        entries,
        app_id=dispatch_app(shard),
        covered=covered,
        markers=markers,
        snapshot=snapshot,
    )


def commit_entries_directly(
    appender: DirectAppender, version: int, entries: pa.Table, covered: int, marks: QueueMarks, shard: int = 0
) -> None:
    """:func:`commit_entries` without delta-rs: the same commit (a file of ``entries``, none when
    there are none, the app transaction recording ``covered``, the ``marks``) put at exactly
    ``version`` by ``appender`` (:mod:`engine.store.delta.direct_append`).

    Raises:
        CommitConflictError: another writer took the version (plan again from a new snapshot).
        CommitStateUnknownError: on an object store, the put failed and the commit is not there;
            it may land yet.
        StoreError: a file could not be written; nothing was committed.
    """
    add = appender.write_file(entries) if entries.num_rows else None
    batch_id = uuid.uuid4().hex
    markers = {CQ_KEY: marks.to_json(), BATCH_KEY: batch_id}
    try:
        appender.commit(version, add, markers, {dispatch_app(shard): covered})
    except StoreError as exc:
        # a link that failed after it was made (network file systems do that) landed all the same
        if not failed_link_landed(exc, appender, version, batch_id, appender.name):
            raise


_NO_BYTE_LIMIT = 1 << 62


class QueueIndex:
    """A process-local view of the consume queue and commit log, refreshed on demand.

    Thread-safe. Handles are brought up to date only when the consume queue has a newer version,
    which on a local store costs one file-existence check.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._cq: Snapshot | None = None
        self._marks = QueueMarks()
        self._version = -1
        self._cq_files = FileStats(-1, [])
        self._cq_reader = FileReader(store.uri(schemas.CONSUME_QUEUE), store.storage_options)
        self._logs = [_ShardLog(store, name) for name in store.commit_logs]
        self._covered = [-1] * len(self._logs)  # per shard: the commit-log version the marks cover
        self._tail = QueueTail(store)
        self._generation = 0

    @property
    def version(self) -> int:
        """A number that changes whenever what the reader sees changes (a consume-queue version or
        the tail read past it)."""
        return self._generation

    def refresh(self, *, tail: bool = True) -> bool:
        """Catch up with the consume queue and (with ``tail``) with the commit-log versions it does
        not cover yet (:class:`~engine.store.queue_entries.QueueTail`); True when what the reader
        sees changed. On an object store the tail costs a request: a reader far from the end of its
        queue leaves it out."""
        with self._lock:
            changed = self._refresh_queue()
            grew = tail and self._tail.advance(self._covered, self._marks, cq_changed=changed)
            if grew or changed:
                self._generation += 1
                return True
            return False

    def topic_moved(self, topic: str) -> bool:
        """Whether the consume queue's newest version may give ``topic``'s queues other bounds than
        this index has (:meth:`refresh` without its tail would move them). Judged from the newest
        commit's marks, read from its commit file: no delta-rs refresh of the whole table, whose
        replay cost a scheduler that only watches the schedule topic a fifth of the broker
        process's CPU under steady sends. True when that commit records no marks (a compaction's)
        or cannot be read, and before the first refresh.
        """
        with self._lock:
            if self._cq is None:
                return True
            latest = self._store.latest_version_hint(schemas.CONSUME_QUEUE, self._version)
            if latest <= self._version:
                return False
            uri, options = self._store.uri(schemas.CONSUME_QUEUE), self._store.storage_options
            try:
                text = read_version(uri, latest, options).commit_info.get(CQ_KEY)
            except StoreError:
                return True
            if not isinstance(text, str):
                return True
            newest, mine = QueueMarks.from_json(text), self._marks
            return (newest.next.get(topic), newest.min.get(topic)) != (
                mine.next.get(topic),
                mine.min.get(topic),
            )

    def is_current(self) -> bool:
        """True when :meth:`refresh` would find nothing new: no consume-queue version and no
        commit-log version past what this index has read, and no refresh under way. On a local
        store a file check per table; it never waits for a refresh (one under way: False), so an
        event loop may ask before answering from what it holds.
        """
        if not self._lock.acquire(blocking=False):
            return False
        try:
            return self._current()
        finally:
            self._lock.release()

    def current_bounds(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """:meth:`bounds` of a queue when the index :meth:`is_current` (read under the same look,
        so no refresh lands between), else None."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self.bounds(topic, queue_id) if self._current() else None
        finally:
            self._lock.release()

    def _current(self) -> bool:
        if self._cq is None:
            return False
        if self._store.latest_version_hint(schemas.CONSUME_QUEUE, self._version) > self._version:
            return False
        return self._tail.is_current(self._covered)

    def refresh_tail(self) -> bool:
        """Catch up with the commit-log versions the consume queue (as last refreshed) does not
        cover; True when what the reader sees changed."""
        if self._cq is None:
            return self.refresh()
        with self._lock:
            if self._tail.advance(self._covered, self._marks, cq_changed=False):
                self._generation += 1
                return True
            return False

    def _refresh_queue(self) -> bool:
        if self._cq is None:
            self._cq = self._store.snapshot(schemas.CONSUME_QUEUE)
        elif self._store.latest_version_hint(schemas.CONSUME_QUEUE, self._version) <= self._version:
            return False
        else:
            self._cq.refresh(newer=self._cq.version() == self._version)
        version = self._cq.version()
        if version == self._version:
            return False
        marks = queue_marks(self._cq)
        files = FileStats.of(self._cq, ["queue_id", "queue_offset"])
        # Files first: a reader that sees the new bounds must find the entries behind them.
        self._cq_files = files
        self._marks = marks
        # The marks' log version is shard 0's covered version; other shards have their own marker.
        self._covered = [marks.log_version] + [
            covered_version(self._cq, shard) for shard in range(1, len(self._logs))
        ]
        self._cq_reader.forget(set(files.paths))
        self._version = version
        return True

    def marks(self) -> QueueMarks:
        """Every queue's bounds, the tail's entries included."""
        return self._tail.marks or self._marks

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min_offset, max_offset) of a queue; max is the next offset to be written, past the
        entries of commit-log versions dispatch has not committed yet (the tail)."""
        tail = self._tail.marks
        dispatched = self._marks.max_offset(topic, queue_id)
        high = dispatched if tail is None else max(dispatched, tail.max_offset(topic, queue_id))
        return self._marks.min_offset(topic, queue_id), high

    def entries(self, topic: str, queue_id: int, start: int, end: int) -> pa.Table:
        """Consume-queue entries with ``start <= queue_offset < end``, in offset order (those past
        the consume queue from the tail)."""
        dispatched = self._marks.max_offset(topic, queue_id)
        tail = self._tail.entries.get((topic, queue_id)) if end > dispatched else None
        table = self._dispatched_entries(topic, queue_id, start, min(end, dispatched))
        if tail is None:
            return table
        offsets = tail["queue_offset"]
        wanted = pc.and_(pc.greater_equal(offsets, max(start, dispatched)), pc.less(offsets, end))
        return pa.concat_tables([table, tail.filter(wanted)])

    def _dispatched_entries(self, topic: str, queue_id: int, start: int, end: int) -> pa.Table:
        if end <= start:
            return schemas.CONSUME_QUEUE_SCHEMA.empty_table()
        files = self._cq_files.overlapping("queue_offset", start, end - 1, {"queue_id": queue_id})
        for attempt in range(2):
            try:
                parts = [self._cq_reader.queue_slice(p, topic, queue_id, start, end) for p in files]
                break
            except (OSError, FileNotFoundError):
                if attempt:
                    raise
                self._version = -1  # a file was compacted away under a stale snapshot
                self.refresh()
                files = self._cq_files.overlapping("queue_offset", start, end - 1, {"queue_id": queue_id})
        table = pa.concat_tables(parts) if parts else schemas.CONSUME_QUEUE_SCHEMA.empty_table()
        if table.num_rows > 1:
            table = table.sort_by("queue_offset")
        return table

    def messages(self, physical_offsets: list[int]) -> pa.Table:
        """Commit-log rows at the given physical offsets, in the order asked; each offset is read
        from its shard's commit log (:func:`~engine.protocol.shards.shard_of_offset`).

        Raises:
            StoreError: some offsets are not readable (``offsets`` lists them: removed by retention,
                never written, or naming a shard the store does not have).
        """
        schema = schemas.COMMIT_LOG_SCHEMA
        if not physical_offsets:
            return schema.empty_table()
        wanted = np.asarray(physical_offsets, dtype=np.int64)
        tail, rest = self._tail.rows_at(np.unique(wanted).tolist())
        parts = [] if tail is None else [tail]
        unique = np.asarray(rest, dtype=np.int64)
        if not len(unique):
            pass
        elif int(unique[0]) >= 0 and int(unique[-1]) >> SHARD_SHIFT == 0:
            parts.append(self._logs[0].rows(unique))  # all in shard 0 (every store without shards)
        else:
            shards = unique >> SHARD_SHIFT  # a negative offset or a shard the store lacks: never found
            parts += [
                self._logs[k].rows(unique[shards == k])
                for k in np.unique(shards).tolist()
                if 0 <= k < len(self._logs)
            ]
        unique = np.unique(wanted)
        table = pa.concat_tables(parts) if parts else schema.empty_table()
        found = table["physical_offset"]
        if table.num_rows < len(unique):
            have = set(found.to_pylist())
            missing = [int(p) for p in unique if int(p) not in have]
            raise StoreError(
                f"consume queue points at commit-log offsets that are not readable: {missing[:5]}",
                offsets=missing,
            )
        return table.take(pc.index_in(pa.array(wanted), value_set=found))

    def select(
        self,
        entries: pa.Table,
        selector: MessageSelector,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> tuple[pa.Table, int]:
        """The batch a consumer takes from ``entries`` (consume-queue entries of one queue, in queue
        order): the commit-log rows of the entries ``selector`` matches, in queue order, and the
        index of the first entry the batch no longer examines (``len(entries)`` when it examines
        all). The one selection behind every read of a queue (pulls, leases).

        As RocketMQ's broker (:func:`~engine.protocol.pull.batch_stop`), the batch is full at
        ``limit`` messages or ``max_bytes`` of stored sizes (the first message whatever its size);
        without them it takes every match.

        Rows are read only for entries that pass the tags-code stage and lie before the batch is
        full; the selector runs on them vectorised. An entry not read yet counts as a match when
        placing the stop, so each round reads at least every entry the stop can still depend on
        (and twice as many as the round before, so a sparse SQL92 match takes a few rounds).

        Raises:
            StoreError: a matched entry's message is not readable (see :meth:`messages`).
        """
        limit = entries.num_rows if limit is None else limit
        max_bytes = _NO_BYTE_LIMIT if max_bytes is None else max_bytes
        sizes = entries["size"].to_numpy().astype(np.int64)
        physical = entries["physical_offset"]
        if selector.matches_all:
            stop = batch_stop(np.ones(len(sizes), dtype=bool), sizes, limit, max_bytes)
            return self.messages(physical.slice(0, stop).to_pylist()), stop
        known = np.where(selector.match_codes(entries["tags_code"]).to_numpy(zero_copy_only=False), -1, 0)
        read: list[tuple[np.ndarray, pa.Table]] = []
        # A tag selector's code stage is all but exact: read what the batch needs. A SQL92 selector's
        # selectivity is unknown: read the window at once (a read decodes whole row groups anyway).
        grow = limit if selector.type is ExpressionType.TAG else len(known)
        while True:
            stop = batch_stop(known != 0, sizes, limit, max_bytes)
            unknown = np.flatnonzero(known[:stop] == -1)
            if len(unknown) == 0:
                break
            if len(unknown) < grow:
                unknown = np.flatnonzero(known == -1)[:grow]
            grow *= 2
            rows = self.messages(physical.take(pa.array(unknown)).to_pylist())
            known[unknown] = selector.matches(rows).to_numpy(zero_copy_only=False)
            read.append((unknown, rows))
        wanted = np.flatnonzero(known[:stop] == 1)
        if len(wanted) == 0:
            return schemas.COMMIT_LOG_SCHEMA.empty_table(), stop
        indices = np.concatenate([i for i, _ in read])
        table = pa.concat_tables([rows for _, rows in read])
        position = np.full(len(known), -1, dtype=np.int64)
        position[indices] = np.arange(len(indices))
        return table.take(pa.array(position[wanted])), stop


def _offset_bounds(stats: str | None) -> tuple[int, int] | None:
    """(min, max) ``physical_offset`` of a commit-log file by its Delta statistics; None without."""
    found = stats_range(stats, "physical_offset")
    try:
        return None if found is None else (int(found[0]), int(found[1]))
    except (ValueError, TypeError):
        return None


# Reads of a shard's rows before giving up on files that keep vanishing: the first after a refresh,
# the last on a snapshot loaded anew (compaction and vacuum may both run between a refresh and a read).
_READ_ATTEMPTS = 3


class _ShardLog:
    """One commit-log shard's snapshot, file statistics and cached file reader (thread-safe)."""

    def __init__(self, store: Store, name: str) -> None:
        self._store = store
        self._name = name
        self._lock = threading.Lock()
        self._log: Snapshot | None = None
        self._files = FileStats(-1, [])
        self._reader = FileReader(store.uri(name), store.storage_options)

    def _refresh(self, *, reopen: bool = False) -> None:
        """Move the snapshot to the latest version (``reopen``: load it anew, after a refreshed one
        still named a file that is gone)."""
        with self._lock:
            self._log = self._store.caught_up(self._name, None if reopen else self._log)
            self._files = FileStats.of(self._log, ["physical_offset"])
            self._reader.forget(set(self._files.paths))

    def _moved_on(self) -> bool:
        """On an object store: move the file statistics on by the commit files after them, which
        finding the latest version has read already (:meth:`Store.latest_version_hint`), rather than
        refresh the snapshot (a listing, and each new commit read twice, in turn). False where that
        cannot be done: a local store, nothing loaded yet, a commit that removed or rewrote files, a
        file without the statistics; the snapshot is refreshed then."""
        with self._lock:
            known = self._files
            if (
                self._log is None
                or known.version < 0
                or self._store.is_local
                or not {"min.physical_offset", "max.physical_offset"} <= known.columns.keys()
            ):
                return False
            latest = self._store.latest_version_hint(self._name, known.version)
            paths, lows, highs = [], [], []
            for version in range(known.version + 1, latest + 1):
                added = read_version(self._store.uri(self._name), version, self._store.storage_options)
                if added.rearranged or len(added.stats) != len(added.files):
                    return False
                for path, raw in zip(added.files, added.stats, strict=True):
                    bounds = _offset_bounds(raw)
                    if bounds is None:
                        return False
                    paths.append(path)
                    lows.append(bounds[0])
                    highs.append(bounds[1])
            if paths:
                columns = {
                    "min.physical_offset": np.concatenate(
                        [known.columns["min.physical_offset"], np.asarray(lows, dtype=np.int64)]
                    ),
                    "max.physical_offset": np.concatenate(
                        [known.columns["max.physical_offset"], np.asarray(highs, dtype=np.int64)]
                    ),
                }
                self._files = FileStats(latest, [*known.paths, *paths], columns)
            return True

    def _max(self) -> int:
        maxs = self._files.columns.get("max.physical_offset")
        return int(maxs.max()) if maxs is not None and len(maxs) else -1

    def rows(self, unique: np.ndarray) -> pa.Table:
        """Rows at the sorted, distinct offsets ``unique`` (all of this shard) that the shard holds."""
        schema = schemas.COMMIT_LOG_SCHEMA
        table = schema.empty_table()
        for attempt in range(_READ_ATTEMPTS):
            behind = self._log is None or int(unique[-1]) > self._max()
            if attempt or (behind and not self._moved_on()):
                self._refresh(reopen=attempt > 1)
            try:
                paths = self._files.holding("physical_offset", unique)
                parts = self._reader.rows_in(paths, "physical_offset", unique, schema)
            except (OSError, FileNotFoundError):
                if attempt + 1 == _READ_ATTEMPTS:
                    raise
                continue  # a file was compacted away (and vacuumed) under a stale snapshot
            table = pa.concat_tables(parts) if parts else schema.empty_table()
            if table.num_rows >= len(unique):
                break
        return table
