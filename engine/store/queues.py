"""Reads behind a pull: a queue's bounds, its index entries, and the messages they point to.

A pull is a pruned table scan, not a Spark job: files are chosen by their Delta statistics
(topic, queue id, queue offset for the consume queue; physical offset for the commit log).
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from engine.errors import StoreError
from engine.store import schemas
from engine.store.marks import QueueMarks, queue_marks
from engine.store.store import Store, sql_literal


class QueueIndex:
    """A process-local view of the consume queue and commit log, refreshed on demand.

    Thread-safe. Handles are brought up to date only when the consume queue has a newer version,
    which on a local store costs one file-existence check.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._cq: DeltaTable | None = None
        self._log: DeltaTable | None = None
        self._marks = QueueMarks()
        self._version = -1

    @property
    def version(self) -> int:
        return self._version

    def refresh(self) -> bool:
        """Catch up with the consume queue; True when a newer version was loaded."""
        with self._lock:
            if self._cq is None:
                self._cq = self._store.open_table(schemas.CONSUME_QUEUE)
            else:
                if self._store.latest_version_hint(schemas.CONSUME_QUEUE, self._version) <= self._version:
                    return False
                self._cq.update_incremental()
            version = int(self._cq.version())
            if version == self._version:
                return False
            self._marks = queue_marks(self._cq)
            self._version = version
            return True

    def marks(self) -> QueueMarks:
        return self._marks

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min_offset, max_offset) of a dispatched queue; max is the next offset to be written."""
        return self._marks.min_offset(topic, queue_id), self._marks.max_offset(topic, queue_id)

    def entries(self, topic: str, queue_id: int, start: int, end: int) -> pa.Table:
        """Consume-queue entries with ``start <= queue_offset < end``, in offset order."""
        predicate = (
            f"topic = {sql_literal(topic)} AND queue_id = {int(queue_id)} "
            f"AND queue_offset <= {int(end) - 1} AND queue_offset >= {int(start)}"
        )
        row_filter = (
            (ds.field("topic") == topic)
            & (ds.field("queue_id") == queue_id)
            & (ds.field("queue_offset") >= start)
            & (ds.field("queue_offset") < end)
        )
        with self._lock:
            assert self._cq is not None, "refresh() first"
            dataset = self._cq.to_pyarrow_dataset(file_pruning_predicate=predicate)
        table = dataset.to_table(filter=row_filter)
        if table.num_rows > 1:
            table = table.sort_by("queue_offset")
        return table

    def messages(self, physical_offsets: list[int]) -> pa.Table:
        """Commit-log rows at the given physical offsets, in the order asked."""
        if not physical_offsets:
            return schemas.COMMIT_LOG_SCHEMA.empty_table()
        wanted = pa.array(physical_offsets, pa.int64())
        lo, hi = min(physical_offsets), max(physical_offsets)
        predicate = f"physical_offset >= {lo} AND physical_offset <= {hi}"
        row_filter = ds.field("physical_offset").isin(wanted)
        for attempt in range(2):
            with self._lock:
                if self._log is None:
                    self._log = self._store.open_table(schemas.COMMIT_LOG)
                elif attempt:
                    self._log.update_incremental()
                dataset = self._log.to_pyarrow_dataset(file_pruning_predicate=predicate)
            try:
                table = dataset.to_table(filter=row_filter)
            except (OSError, FileNotFoundError):
                if attempt:
                    raise
                continue  # a file was compacted away under a stale snapshot
            if table.num_rows >= len(set(physical_offsets)) or attempt:
                break
        if table.num_rows < len(set(physical_offsets)):
            found = set(table["physical_offset"].to_pylist())
            missing = [p for p in physical_offsets if p not in found]
            raise StoreError(
                f"consume queue points at commit-log offsets that are not readable: {missing[:5]}",
                offsets=missing,
            )
        order = pc.index_in(wanted, value_set=table["physical_offset"])
        return table.take(order)
