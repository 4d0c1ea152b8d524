"""Finding offsets by store time, and resetting a group's offsets (RocketMQ's ``resetOffsetByTime``).

Store times are non-decreasing in commit order across the whole commit log (the sequencer stamps
``max(now, previous store time)``), and queue offsets grow in commit order, so within one queue the
store time is non-decreasing in the queue offset. "The first offset stored at or after ``t``" is
therefore a binary search, done without a full scan in two steps:

1. File statistics. Every consume-queue file records min/max of ``topic``, ``queue_id`` and
   ``store_ts_ms``; only files that may hold the queue and end at or after ``t`` are candidates,
   visited in order of their first store time. A file that starts after the best entry found so far
   cannot hold an earlier offset of the queue (its times are later, so are its offsets), which ends
   the walk, usually after one file.
2. Inside a file: the queue's rows (a pushed-down parquet filter), sorted by offset, and
   ``searchsorted`` on their store times.

Everything is read from one private snapshot of the consume queue: the bounds (its marks) and the
files agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from engine.errors import InvalidArgumentError, OffsetOutOfRangeError
from engine.protocol import validate_group_name
from engine.store import schemas
from engine.store.action_log import reset_leases
from engine.store.consume_queue import QueueIndex, QueueMarks, queue_marks
from engine.store.consumer_offset import OffsetStore
from engine.store.delta import Snapshot, table_filesystem
from engine.store.offset_resets import record_resets
from engine.store.store import Store, now_ms, sql_literal

_SEARCH_COLUMNS = ["topic", "queue_id", "queue_offset", "store_ts_ms"]


def check_timestamp(value: object, name: str = "timestamp_ms") -> int:
    """An epoch-millisecond time as an int >= 0.

    Raises:
        InvalidArgumentError: not an int, or negative.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} {value!r} must be an epoch-millisecond int >= 0", **{name: value})
    return value


@dataclass(frozen=True)
class _Candidate:
    path: str
    min_ts: int


class QueueTimeIndex:
    """One snapshot of the consume queue, searchable by store time.

    Args:
        store: the store.
        handle: a consume-queue snapshot to search (default: a new handle on the latest version).
    """

    def __init__(self, store: Store, handle: Snapshot | None = None) -> None:
        self._store = store
        self._dt = handle if handle is not None else store.snapshot(schemas.CONSUME_QUEUE)
        self.marks: QueueMarks = queue_marks(self._dt)
        actions = self._dt.add_actions()
        wanted = [
            "path",
            *(f"{side}.{c}" for c in ("topic", "queue_id", "store_ts_ms") for side in ("min", "max")),
        ]
        self._files: list[dict[str, Any]] = actions.select(
            [c for c in wanted if c in actions.column_names]
        ).to_pylist()
        self._fs = table_filesystem(store.uri(schemas.CONSUME_QUEUE), store.storage_options)
        self.files_read = 0  # for tests: how many files a search opened

    @property
    def version(self) -> int:
        return self._dt.version()

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset) of a queue in this snapshot; max is the next to be dispatched."""
        return self.marks.min_offset(topic, queue_id), self.marks.max_offset(topic, queue_id)

    def _candidates(self, topic: str, queue_id: int, timestamp_ms: int) -> list[_Candidate]:
        """Files that may hold entries of the queue at or after the time, earliest first."""

        def admits(stats: dict[str, Any], column: str, value: Any, *, lower: bool, upper: bool) -> bool:
            low, high = stats.get(f"min.{column}"), stats.get(f"max.{column}")
            return not (lower and low is not None and low > value) and not (
                upper and high is not None and high < value
            )

        out = []
        for stats in self._files:
            if (
                admits(stats, "topic", topic, lower=True, upper=True)
                and admits(stats, "queue_id", queue_id, lower=True, upper=True)
                and admits(stats, "store_ts_ms", timestamp_ms, lower=False, upper=True)
            ):
                first = stats.get("min.store_ts_ms")
                out.append(_Candidate(str(stats["path"]), -1 if first is None else int(first)))
        return sorted(out, key=lambda c: c.min_ts)

    def _search_file(self, path: str, topic: str, queue_id: int, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, store time) of the queue's first entry at or after the time in one file."""
        self.files_read += 1
        table = pq.read_table(
            path,
            filesystem=self._fs,
            columns=_SEARCH_COLUMNS,
            filters=[("topic", "=", topic), ("queue_id", "=", queue_id)],
        )
        if table.num_rows == 0:
            return None
        table = table.sort_by("queue_offset")
        times = table["store_ts_ms"].to_numpy()
        at = int(np.searchsorted(times, timestamp_ms, side="left"))
        if at >= len(times):
            return None
        return int(table["queue_offset"][at].as_py()), int(times[at])

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First offset of a queue stored at or after ``timestamp_ms``; the max offset if none is.

        Before every retained entry, that is the min offset; after all of them, the max offset
        (where the next message will go).
        """
        low, high = self.bounds(topic, queue_id)
        if high <= low:
            return high
        best: tuple[int, int] | None = None
        for candidate in self._candidates(topic, queue_id, timestamp_ms):
            if best is not None and candidate.min_ts > best[1]:
                break  # later files hold later times, hence later offsets of this queue
            found = self._search_file(candidate.path, topic, queue_id, timestamp_ms)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        if best is None:
            return high
        return min(max(best[0], low), high)

    def offsets_for_time(self, topic: str, queues: int, timestamp_ms: int) -> dict[int, int]:
        """:meth:`offset_for_time` for queues ``0..queues-1``."""
        return {qid: self.offset_for_time(topic, qid, timestamp_ms) for qid in range(queues)}


def offsets_for_time(store: Store, topic: str, timestamp_ms: int) -> dict[int, int]:
    """Per queue of ``topic``, the first offset stored at or after ``timestamp_ms`` (see module doc).

    Raises:
        TopicNotFoundError: no such topic.
        InvalidArgumentError: a negative or non-int time.
    """
    check_timestamp(timestamp_ms)
    config = store.topic(topic)
    return QueueTimeIndex(store).offsets_for_time(topic, config.queues, timestamp_ms)


def reset_offset_by_time(store: Store, group: str, topic: str, timestamp_ms: int) -> dict[int, int]:
    """Move a clustering group's offsets of every queue of ``topic`` to the first message stored at
    or after ``timestamp_ms``: one ``consumer_offset`` commit, then the reset recorded in
    ``offset_resets`` for the group's running consumers. Returns queue id -> new offset."""
    validate_group_name(group)
    offsets = offsets_for_time(store, topic, timestamp_ms)
    _reset(store, group, [(topic, qid, off) for qid, off in sorted(offsets.items())])
    reset_leases(store, group, topic, offsets)  # running SimpleConsumers of the group follow
    return offsets


def _reset(store: Store, group: str, entries: list[tuple[str, int, int]]) -> None:
    """Commit a group's new offsets (what a consumer starting later reads), then record the reset
    (what running consumers watch, see :mod:`engine.client.resets`)."""
    OffsetStore(store, group).commit(entries)
    record_resets(store, group, entries)


def reset_offset(store: Store, group: str, topic: str, queue_id: int, offset: int) -> None:
    """Set a clustering group's offset of one queue (the next offset it consumes).

    Raises:
        TopicNotFoundError: no such topic.
        InvalidArgumentError: a bad group or queue id.
        OffsetOutOfRangeError: ``offset`` outside ``[min offset, max offset]`` of the queue.
    """
    validate_group_name(group)
    config = store.topic(topic)
    if isinstance(queue_id, bool) or not isinstance(queue_id, int) or not 0 <= queue_id < config.queues:
        raise InvalidArgumentError(
            f"queue_id {queue_id!r} is out of range; topic {topic!r} has queues 0..{config.queues - 1}",
            topic=topic,
            queue_id=queue_id,
        )
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise InvalidArgumentError(f"offset {offset!r} must be an int", offset=offset)
    low, high = QueueTimeIndex(store).bounds(topic, queue_id)
    if not low <= offset <= high:
        raise OffsetOutOfRangeError(
            f"offset {offset} is outside {topic}:{queue_id}, which holds offsets {low}..{high} "
            f"({high} = the next message)",
            topic=topic,
            queue_id=queue_id,
            offset=offset,
        )
    _reset(store, group, [(topic, queue_id, offset)])
    reset_leases(store, group, topic, {queue_id: offset})  # running SimpleConsumers of the group follow


def committed_offsets(store: Store, group: str, topic: str, *, as_of_ms: int | None = None) -> dict[int, int]:
    """A clustering group's committed offsets of a topic, queue id -> offset (latest row wins).

    With ``as_of_ms``, the offsets as they stood then: rows committed after it are ignored.
    """
    table = store.read(
        schemas.CONSUMER_OFFSET,
        predicate=f"group = {sql_literal(group)} AND topic = {sql_literal(topic)}",
        filter=(ds.field("group") == group) & (ds.field("topic") == topic) & (ds.field("consumer_id") == ""),
        columns=["queue_id", "offset", "ts_ms"],
    )
    latest: dict[int, tuple[int, int]] = {}
    for row in table.to_pylist():
        if as_of_ms is not None and row["ts_ms"] > as_of_ms:
            continue
        qid = int(row["queue_id"])
        if qid not in latest or row["ts_ms"] >= latest[qid][0]:
            latest[qid] = (int(row["ts_ms"]), int(row["offset"]))
    return {qid: off for qid, (_, off) in latest.items()}


@dataclass(frozen=True)
class QueueLag:
    """How far a group is behind on one queue (a row of ``mq lag`` and of the ``lag`` view).

    ``committed_offset`` is None when the group never committed the queue; everything retained
    then counts as unconsumed. ``oldest_unconsumed_age_ms`` is now minus the store time of the
    first unconsumed message, None when nothing is behind. ``last_commit_ts_ms`` is when the
    queue's offset was last committed (None when never).
    """

    group: str
    consumer_id: str
    topic: str
    queue_id: int
    max_offset: int
    committed_offset: int | None
    lag: int
    oldest_unconsumed_age_ms: int | None
    last_commit_ts_ms: int | None = None


def lag_rows(store: Store, group: str | None = None, *, now: int | None = None) -> list[QueueLag]:
    """Per group (and broadcasting instance), topic and queue: the lag, without Spark.

    Covers every (group, topic) with a committed offset, over all queues of the topic, sorted by
    group, consumer id, topic and queue. ``lag = max_offset - max(committed_offset, min_offset)``.

    Raises:
        InvalidArgumentError: a bad group name.
    """
    predicate = None
    row_filter = None
    if group is not None:
        validate_group_name(group)
        predicate = f"group = {sql_literal(group)}"
        row_filter = ds.field("group") == group
    table = store.read(
        schemas.CONSUMER_OFFSET,
        predicate=predicate,
        filter=row_filter,
        columns=["group", "consumer_id", "topic", "queue_id", "offset", "ts_ms"],
    )
    latest: dict[tuple[str, str, str], dict[int, tuple[int, int]]] = {}
    for row in table.to_pylist():
        queues = latest.setdefault((row["group"], row["consumer_id"], row["topic"]), {})
        qid = int(row["queue_id"])
        if qid not in queues or row["ts_ms"] >= queues[qid][0]:
            queues[qid] = (int(row["ts_ms"]), int(row["offset"]))
    topics = store.topic_configs(refresh=True)
    index = QueueIndex(store)
    index.refresh()
    clock = now_ms() if now is None else now
    out = []
    for (grp, consumer_id, topic), committed in sorted(latest.items()):
        config = topics.get(topic)
        if config is None:
            continue  # the topic was deleted
        for qid in range(config.queues):
            low, high = index.bounds(topic, qid)
            offset = committed[qid][1] if qid in committed else None
            commit_ts = committed[qid][0] if qid in committed else None
            position = low if offset is None else min(max(offset, low), high)
            lag = high - position
            age = None
            if lag > 0:
                entry = index.entries(topic, qid, position, position + 1)
                if entry.num_rows:
                    age = max(0, clock - int(entry["store_ts_ms"][0].as_py()))
            out.append(QueueLag(grp, consumer_id, topic, qid, high, offset, lag, age, commit_ts))
    return out
