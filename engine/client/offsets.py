"""Where a queue without a committed offset starts: RocketMQ's ``ConsumeFromWhere``."""

from __future__ import annotations

import enum

from engine.store.commit_log.reads import commit_log_of_offset, log_end
from engine.store.consume_queue import QueueIndex
from engine.store.store import Store


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


def is_young(store: Store, index: QueueIndex, topic: str, queue_id: int) -> bool:
    """Whether a new group reading from LAST starts this queue at 0: RocketMQ's "the first message is
    still in memory".

    RocketMQ's broker answers 0 to a group without an offset when the queue's min offset is 0 and
    its first message is in memory (4.9: ``!checkInDiskByConsumeOffset(topic, queueId, 0)``, i.e.
    the commit log written since that message is at most ``accessMessageInMemoryMaxRatio`` = 40 %
    of the machine's RAM; 5.x asks the page cache the same question). On a quiet broker that lasts
    for days. Here the same measure, in bytes and without looking at the machine: the queue still
    holds offset 0 and the commit log (the queue's shard) written since its first message is at
    most ``EngineConfig.in_memory_max_bytes`` (0: never young, QMQ's "new groups start at the
    latest"). An empty queue that never lost a message is young.

    The size comes from what the store records: the first entry's physical offset (a byte offset
    into its shard) and where the shard stores its next message (:func:`log_end`, RocketMQ's
    ``maxOffsetPy``: the newest message's own size is counted, as there). No clock is involved: a
    week-old queue of a quiet store is young. The caller refreshes ``index``.
    """
    limit = store.config.in_memory_max_bytes
    lo, hi = index.bounds(topic, queue_id)
    if lo > 0 or limit <= 0:
        return False
    if hi == 0:
        return True
    first = index.entries(topic, queue_id, 0, 1)
    if first.num_rows == 0:
        return False  # retention took it meanwhile
    physical = int(first["physical_offset"][0].as_py())
    return log_end(store, commit_log_of_offset(store, physical)) - physical <= limit


def start_offset(
    index: QueueIndex,
    topic: str,
    queue_id: int,
    consume_from: ConsumeFrom,
    *,
    timestamp_ms: int,
    store: Store,
    pop: bool,
) -> int:
    """Where a group without a committed offset starts a queue (RocketMQ's broker and client rules).

    FIRST: the queue's first stored message. TIMESTAMP: the first stored at or after
    ``timestamp_ms``. LAST: 0 while the queue is young (:func:`is_young`); otherwise the end, which
    for a POP consumer (``pop``: SimpleConsumer) is the last message (max - 1) and for a push
    consumer the next message to be written (max). ``store`` is the store ``index`` reads (its
    config's ``in_memory_max_bytes`` and its commit log decide youth).

    The caller refreshes ``index``.
    """
    lo, hi = index.bounds(topic, queue_id)
    if consume_from is ConsumeFrom.FIRST:
        return lo
    if consume_from is ConsumeFrom.TIMESTAMP:
        return offset_by_time(index, topic, queue_id, timestamp_ms)
    if is_young(store, index, topic, queue_id):
        return lo
    return max(lo, hi - 1) if pop else hi
