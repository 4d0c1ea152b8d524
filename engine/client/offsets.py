"""Where a queue without a committed offset starts: RocketMQ's ``ConsumeFromWhere``."""

from __future__ import annotations

import enum

from engine.store.consume_queue import QueueIndex


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
