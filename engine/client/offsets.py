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


def is_young(index: QueueIndex, topic: str, queue_id: int, in_memory_age_ms: int, now_ms: int) -> bool:
    """Whether a queue still holds its first message (offset 0) and that message is younger than
    ``in_memory_age_ms`` (or the queue is empty): RocketMQ's "the first message is still in memory"."""
    lo, hi = index.bounds(topic, queue_id)
    if lo > 0 or in_memory_age_ms <= 0:
        return False
    if hi == 0:
        return True
    first = index.entries(topic, queue_id, 0, 1)
    return first.num_rows > 0 and now_ms - int(first["store_ts_ms"][0].as_py()) < in_memory_age_ms


def start_offset(
    index: QueueIndex,
    topic: str,
    queue_id: int,
    consume_from: ConsumeFrom,
    *,
    timestamp_ms: int,
    in_memory_age_ms: int,
    now_ms: int,
    pop: bool,
) -> int:
    """Where a group without a committed offset starts a queue (RocketMQ's broker and client rules).

    FIRST: the queue's first stored message. TIMESTAMP: the first stored at or after
    ``timestamp_ms``. LAST: 0 while the queue is young (:func:`is_young`); otherwise the end, which
    for a POP consumer (``pop``: SimpleConsumer) is the last message (max - 1) and for a push
    consumer the next message to be written (max).

    The caller refreshes ``index``.
    """
    lo, hi = index.bounds(topic, queue_id)
    if consume_from is ConsumeFrom.FIRST:
        return lo
    if consume_from is ConsumeFrom.TIMESTAMP:
        return offset_by_time(index, topic, queue_id, timestamp_ms)
    if is_young(index, topic, queue_id, in_memory_age_ms, now_ms):
        return lo
    return max(lo, hi - 1) if pop else hi
