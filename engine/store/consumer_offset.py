"""The ``consumer_offset`` table: committed offsets, append-only (the latest row per queue wins)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.dataset as ds

from engine.errors import InvalidArgumentError
from engine.store import schemas
from engine.store.store import Store, now_ms, sql_literal

_ts_lock = threading.Lock()
_last_ts = 0


def _commit_ts() -> int:
    """The time a committed offset is stamped with: the clock's, but later than every earlier one
    of this process, whichever :class:`OffsetStore` stamped it. The latest row of a queue wins by
    this time, so two commits of one queue within a millisecond (a reset, then a consumer's report,
    flushed by the door's batcher, which makes an :class:`OffsetStore` per commit) must not tie:
    a tie was decided by the order the table's files were read in."""
    global _last_ts
    with _ts_lock:
        _last_ts = max(now_ms(), _last_ts + 1)
        return _last_ts


class OffsetStore:
    """Reads and writes one group's committed offsets.

    ``consumer_id`` is empty for clustering groups (offsets shared by the group) and the instance id
    for broadcasting consumers (offsets kept per instance).
    """

    def __init__(self, store: Store, group: str, consumer_id: str = "") -> None:
        self._store = store
        self.group = group
        self.consumer_id = consumer_id

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
                    "ts_ms": _commit_ts(),
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
