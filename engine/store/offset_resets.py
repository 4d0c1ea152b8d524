"""The ``offset_resets`` table: offset resets of consumer groups, append-only (newest per queue wins).

An admin reset (``Admin.reset_offset``, ``Admin.reset_offset_by_time``) commits the group's new
offsets to ``consumer_offset``, which is all a consumer that is not running needs, and records the
reset here, which is how running consumers learn of it (RocketMQ's broker pushes ``resetOffset`` to
its clients): see :class:`engine.client.resets.ResetWatcher`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds

from engine.errors import InvalidArgumentError
from engine.store import schemas
from engine.store.store import Store, now_ms, sql_literal


@dataclass(frozen=True)
class OffsetReset:
    """One queue's reset: the group consumes it again from ``offset``; made at ``ts_ms``."""

    topic: str
    queue_id: int
    offset: int
    ts_ms: int


def record_resets(
    store: Store, group: str, entries: Iterable[tuple[str, int, int]], ts_ms: int | None = None
) -> int:
    """Record a reset of ``(topic, queue_id, offset)`` entries of ``group`` in one commit.

    Returns:
        The reset's time (epoch ms), the same for every entry.

    Raises:
        InvalidArgumentError: an offset that is not an int >= 0.
    """
    ts = now_ms() if ts_ms is None else ts_ms
    rows = []
    for topic, queue_id, offset in entries:
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2**63:
            raise InvalidArgumentError(
                f"offset {offset!r} must be an int >= 0 (64-bit)", topic=topic, offset=offset
            )
        rows.append({"group": group, "topic": topic, "queue_id": queue_id, "offset": offset, "ts_ms": ts})
    if rows:
        store.append(schemas.OFFSET_RESETS, pa.Table.from_pylist(rows, schema=schemas.OFFSET_RESETS_SCHEMA))
    return ts


def latest_resets(store: Store, group: str) -> dict[tuple[str, int], OffsetReset]:
    """The newest reset of each (topic, queue id) of ``group`` (on equal times, the later row)."""
    table = store.read(
        schemas.OFFSET_RESETS,
        predicate=f"group = {sql_literal(group)}",
        filter=ds.field("group") == group,
        columns=["topic", "queue_id", "offset", "ts_ms"],
    )
    latest: dict[tuple[str, int], OffsetReset] = {}
    for row in table.to_pylist():
        key = (row["topic"], int(row["queue_id"]))
        seen = latest.get(key)
        if seen is None or row["ts_ms"] >= seen.ts_ms:
            latest[key] = OffsetReset(key[0], key[1], int(row["offset"]), int(row["ts_ms"]))
    return latest


def resets_version(store: Store) -> int:
    """The table's latest version: a watcher reads the rows again only when it moved."""
    return store.version(schemas.OFFSET_RESETS)
