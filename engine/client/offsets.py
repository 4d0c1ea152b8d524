"""Consumer offsets: committed ones in the append-only ``consumer_offset`` table (latest row wins),
and where a queue without one starts."""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.dataset as ds

from engine.errors import InvalidArgumentError
from engine.store import schemas
from engine.store.queues import QueueIndex
from engine.store.store import Store, now_ms, sql_literal


class OffsetStore:
    """Reads and writes one group's committed offsets.

    ``consumer_id`` is empty for clustering groups (offsets shared by the group) and the instance id
    for broadcasting consumers (offsets kept per instance).
    """

    def __init__(self, store: Store, group: str, consumer_id: str = "") -> None:
        self._store = store
        self.group = group
        self.consumer_id = consumer_id
        self._last_ts = 0
        self._lock = threading.Lock()

    def _ts(self) -> int:
        with self._lock:
            self._last_ts = max(now_ms(), self._last_ts + 1)
            return self._last_ts

    def commit(self, entries: Iterable[tuple[str, int, int]]) -> None:
        """Commit ``(topic, queue_id, offset)`` entries in one Delta commit."""
        rows = []
        for topic, queue_id, offset in entries:
            if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2**63:
                raise InvalidArgumentError(
                    f"offset {offset!r} must be an int >= 0 (64-bit)", topic=topic, offset=offset
                )
            rows.append(
                {
                    "group": self.group,
                    "topic": topic,
                    "queue_id": queue_id,
                    "offset": offset,
                    "ts_ms": self._ts(),
                    "consumer_id": self.consumer_id,
                }
            )
        if rows:
            self._store.append(
                schemas.CONSUMER_OFFSET, pa.Table.from_pylist(rows, schema=schemas.CONSUMER_OFFSET_SCHEMA)
            )

    def read(self, topic: str | None = None) -> dict[tuple[str, int], int]:
        """Latest committed offset per (topic, queue_id)."""
        predicate = f"group = {sql_literal(self.group)}"
        row_filter = (ds.field("group") == self.group) & (ds.field("consumer_id") == self.consumer_id)
        if topic is not None:
            predicate += f" AND topic = {sql_literal(topic)}"
            row_filter &= ds.field("topic") == topic
        table = self._store.read(schemas.CONSUMER_OFFSET, predicate=predicate, filter=row_filter)
        latest: dict[tuple[str, int], tuple[int, int]] = {}
        for row in table.select(["topic", "queue_id", "offset", "ts_ms"]).to_pylist():
            key = (row["topic"], row["queue_id"])
            if key not in latest or row["ts_ms"] >= latest[key][0]:
                latest[key] = (row["ts_ms"], row["offset"])
        return {k: v[1] for k, v in latest.items()}


class ConsumeFrom(enum.StrEnum):
    """Where a group with no committed offset for a queue starts (RocketMQ ``ConsumeFromWhere``)."""

    LAST = "LAST"
    FIRST = "FIRST"
    TIMESTAMP = "TIMESTAMP"


def offset_by_time(index: QueueIndex, topic: str, queue_id: int, timestamp_ms: int) -> int:
    """First offset of a queue stored at or after ``timestamp_ms`` (max offset if none): binary search.

    Store times never decrease along a queue (the sequencer stamps them monotonically).
    """
    index.refresh()
    lo, hi = index.bounds(topic, queue_id)
    while lo < hi:
        mid = (lo + hi) // 2
        entry = index.entries(topic, queue_id, mid, mid + 1)
        if entry.num_rows == 0 or int(entry["store_ts_ms"][0].as_py()) >= timestamp_ms:
            hi = mid
        else:
            lo = mid + 1
    return lo
