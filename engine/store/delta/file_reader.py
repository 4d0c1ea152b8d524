"""Point reads on immutable Delta data files, chosen by their statistics.

Data files never change once written, so what is read from them (parquet footers, small consume-queue
files) is cached by path. File selection uses the ``min.*``/``max.*`` statistics of the snapshot's add
actions; row groups are chosen by the parquet footer's own statistics. This is the pull hot path.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.store.delta.log import read_whole, table_filesystem
from engine.store.delta.objects import local_path
from engine.store.delta.snapshot import Snapshot
from engine.store.delta.table_cache import TableCache


@dataclass
class FileStats:
    """Add actions of one snapshot with the statistics used for pruning."""

    version: int
    paths: list[str]
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, snapshot: Snapshot, stat_columns: list[str]) -> FileStats:
        actions = snapshot.add_actions()
        stats = cls(snapshot.version(), actions["path"].to_pylist())
        for col in stat_columns:
            for side in ("min", "max"):
                key = f"{side}.{col}"
                if key in actions.column_names:
                    arr = actions[key]
                    if pa.types.is_integer(arr.type):
                        fill = np.iinfo(np.int64).min if side == "min" else np.iinfo(np.int64).max
                        stats.columns[key] = arr.cast(pa.int64()).fill_null(fill).to_numpy()
        return stats

    def overlapping(self, column: str, lo: int, hi: int, equal: Mapping[str, int] | None = None) -> list[str]:
        """Files whose ``column`` range meets ``[lo, hi]`` and whose ranges admit each ``equal`` value."""
        if not self.paths:
            return []
        mask = np.ones(len(self.paths), dtype=bool)
        for col, lo_v, hi_v in [(column, lo, hi), *((c, v, v) for c, v in (equal or {}).items())]:
            mins, maxs = self.columns.get(f"min.{col}"), self.columns.get(f"max.{col}")
            if mins is not None:
                mask &= mins <= hi_v
            if maxs is not None:
                mask &= maxs >= lo_v
        return [p for p, keep in zip(self.paths, mask, strict=True) if keep]

    def holding(self, column: str, values: np.ndarray) -> list[str]:
        """Files whose ``column`` range holds at least one of the sorted ``values`` (a file whose
        range only spans between two of them is left out: another queue's file among a queue's
        messages); files without statistics are kept."""
        if not self.paths or not len(values):
            return []
        mins, maxs = self.columns.get(f"min.{column}"), self.columns.get(f"max.{column}")
        if mins is None or maxs is None:
            return self.overlapping(column, int(values[0]), int(values[-1]))
        at = np.searchsorted(values, mins, "left")
        inside = at < len(values)
        inside[inside] = values[at[inside]] <= maxs[inside]
        return [p for p, keep in zip(self.paths, inside, strict=True) if keep]


_QueueIndex = tuple[np.ndarray, np.ndarray]  # sorted queue offsets, and the rows holding them
# Files of one read fetched at once on an object store: each is a request of a round trip, and a
# pull whose messages lie in many small files (one per send) would otherwise wait for each in turn.
PARALLEL_READS = 16
_POOL = ThreadPoolExecutor(PARALLEL_READS, thread_name_prefix="mq-file-reads")


ROW_GROUPS = TableCache(64 << 20)
"""The process's decoded row groups of data files (64 MiB). A consumer reading through a backlog
pulls 32 messages at a time from row groups of hundreds: without it every pull decoded its whole row
group again (most of a pull's time), and every group reading the same recent messages did too. Data
files never change once written (and a removed file's name is never used again), so an entry is
never stale: what the broker's page cache is to RocketMQ's commit log."""


class FileReader:
    """Cached reads of one table's data files (thread-safe)."""

    def __init__(
        self, uri: str, storage_options: Mapping[str, str] | None, *, max_cached_rows: int = 4_000_000
    ) -> None:
        self._fs = table_filesystem(uri, storage_options)
        self._uri = uri
        self._remote = local_path(uri) is None
        self._lock = threading.Lock()
        # per file: its footer, row-group ranges, and a lock (a ParquetFile is not safe for
        # concurrent reads; reads of different files go on at once)
        self._footers: OrderedDict[str, tuple[pq.ParquetFile, np.ndarray, np.ndarray, threading.Lock]] = (
            OrderedDict()
        )
        self._tables: OrderedDict[str, tuple[pa.Table, dict[tuple[str, int], _QueueIndex]]] = OrderedDict()
        self._cached_rows = 0
        self._max_cached_rows = max_cached_rows

    # ------------------------------------------------------------ whole small files (consume queue)
    def queue_slice(self, path: str, topic: str, queue_id: int, start: int, end: int) -> pa.Table:
        """Rows of one consume-queue file for a queue with ``start <= queue_offset < end``."""
        with self._lock:
            cached = self._tables.get(path)
            if cached is not None:
                self._tables.move_to_end(path)
        if cached is None:
            # One chunk per column: ``take`` on a many-row-group (compacted) file would otherwise
            # concatenate every chunk again on each pull.
            with self._fs.open_input_file(path) as source:
                table = read_whole(source, source.size()).combine_chunks()
            cached = (table, {})
            with self._lock:
                self._tables[path] = cached
                self._cached_rows += table.num_rows
                while self._cached_rows > self._max_cached_rows and len(self._tables) > 1:
                    _, (old, _) = self._tables.popitem(last=False)
                    self._cached_rows -= old.num_rows
        table, by_queue = cached
        key = (topic, queue_id)
        index = by_queue.get(key)
        if index is None:
            mask = pc.and_(pc.equal(table["topic"], topic), pc.equal(table["queue_id"], queue_id))
            rows = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
            offsets = table["queue_offset"].to_numpy()[rows]
            order = np.argsort(offsets, kind="stable")
            index = (offsets[order], rows[order])
            by_queue[key] = index
        offsets, rows = index
        lo, hi = np.searchsorted(offsets, start, "left"), np.searchsorted(offsets, end, "left")
        return table.take(pa.array(rows[lo:hi]))

    # ------------------------------------------------------------ row groups of large files (commit log)
    def _footer(
        self, path: str, column: str
    ) -> tuple[pq.ParquetFile, np.ndarray, np.ndarray, threading.Lock]:
        with self._lock:
            cached = self._footers.get(path)
            if cached is not None:
                self._footers.move_to_end(path)
                return cached
        pf = pq.ParquetFile(self._fs.open_input_file(path))
        meta = pf.metadata
        idx = meta.schema.names.index(column)
        mins = np.empty(meta.num_row_groups, dtype=np.int64)
        maxs = np.empty(meta.num_row_groups, dtype=np.int64)
        for i in range(meta.num_row_groups):
            st = meta.row_group(i).column(idx).statistics
            mins[i] = st.min if st is not None and st.has_min_max else np.iinfo(np.int64).min
            maxs[i] = st.max if st is not None and st.has_min_max else np.iinfo(np.int64).max
        with self._lock:
            cached = self._footers.setdefault(path, (pf, mins, maxs, threading.Lock()))
            while len(self._footers) > 512:
                self._footers.popitem(last=False)
        return cached

    def rows_at(self, path: str, column: str, values: np.ndarray, schema: pa.Schema) -> pa.Table:
        """Rows of a file whose ``column`` is in ``values``, reading only row groups that may hold them."""
        pf, mins, maxs, lock = self._footer(path, column)
        lo, hi = int(values.min()), int(values.max())
        groups = [i for i in range(len(mins)) if mins[i] <= hi and maxs[i] >= lo]
        groups = [g for g in groups if bool(np.any((values >= mins[g]) & (values <= maxs[g])))]
        if not groups:
            return schema.empty_table()
        parts = []
        for group in groups:
            key = (self._uri, path, group)
            part = ROW_GROUPS.get(key)
            if part is None:
                with lock:
                    part = pf.read_row_group(group)
                ROW_GROUPS.put(key, part)
            parts.append(part)
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        table = table.filter(pc.is_in(table[column], value_set=pa.array(values)))
        return table.select(schema.names).cast(schema)

    def rows_in(
        self, paths: Sequence[str], column: str, values: np.ndarray, schema: pa.Schema
    ) -> list[pa.Table]:
        """:meth:`rows_at` of each file of ``paths``, in their order; on an object store the files
        are read at once (:data:`PARALLEL_READS`), so a read of many files costs about one round trip."""
        if not self._remote or len(paths) < 2:
            return [self.rows_at(path, column, values, schema) for path in paths]
        return list(_POOL.map(lambda path: self.rows_at(path, column, values, schema), paths))

    def forget(self, keep: set[str]) -> None:
        """Drop cached entries of files no longer in the snapshot (compacted away)."""
        with self._lock:
            for path in [p for p in self._tables if p not in keep]:
                old, _ = self._tables.pop(path)
                self._cached_rows -= old.num_rows
            for path in [p for p in self._footers if p not in keep]:
                self._footers.pop(path)
