"""``mq``: a topic as a Spark stream or batch, and DataFrames sent as messages (Python Data Source API).

Reading (``spark.readStream.format("mq")`` / ``spark.read.format("mq")``) returns DISPATCHED
messages, one row each: topic, queue_id, queue_offset, physical_offset, msg_id (the unique id the
producer got, the same on every copy of a message), offset_msg_id (this copy's store id), tags,
keys, properties, body, born_ts, store_ts (timestamps), reconsume_times. Options: see
:class:`engine.spark.mq_options.ReadOptions`. Writing: see :mod:`engine.spark.mq_sink`.

Offsets are per-queue queue offsets, ``{"q": {"<queue_id>": <next offset>}}``. ``latestOffset``
comes from the consume queue's marks; a micro-batch reads ``[start, end)`` of every queue through
:class:`~engine.store.consume_queue.QueueIndex` (the pull path: consume-queue entries, the selector
on the tags code, commit-log rows by physical offset, the selector on the rows; option
``expressionType`` ``SQL92`` reads ``expression`` as a SQL92 condition). ``maxMessagesPerTrigger`` counts
queue entries (examined, filtered or not), shared fairly across the queues with a backlog.

Group offsets (streams with option ``group``) are committed to ``consumer_offset`` only for data
Spark has made durable:

* in ``commit(end)``, which Spark calls once the batch ending at ``end`` is in the sink and in the
  checkpoint's commit log, and
* in ``latestOffset(start)``: Spark plans batch N+1 only after batch N has committed, so ``start`` is
  durable too. Spark calls ``commit(end)`` lazily (when it plans the NEXT batch that has data), so
  without this the last batch before a pause or a stop would stay uncommitted in the group.

``initialOffset`` (a fresh checkpoint) starts from the group's committed offsets, so a stream
restarted on a new checkpoint neither skips nor repeats; queues the group has no offset for start at
``startingOffsets`` (default ``latest``; ``earliest``, an epoch-ms time, or offsets JSON), and that
start is committed for the group right away, so a restart agrees with it. With an existing
checkpoint Spark's offsets win, as with Kafka: a reset by :meth:`Admin.reset_offset_by_time` is
picked up by the next start on a fresh checkpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from engine.client.admin_offsets import QueueTimeIndex, committed_offsets
from engine.errors import InvalidArgumentError, StoreError
from engine.protocol.selectors import MessageSelector
from engine.spark.mq_options import SHORT_NAME, Position, ReadOptions, StoreRef, WriteOptions
from engine.store import schemas
from engine.store.commit_log import read_hwm
from engine.store.consume_queue import QueueIndex
from engine.store.consumer_offset import OffsetStore
from engine.store.delta import read_version
from engine.store.store import Store

_TS = pa.timestamp("us", tz="UTC")
MESSAGE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("queue_id", pa.int32()),
        pa.field("queue_offset", pa.int64()),
        pa.field("physical_offset", pa.int64()),
        pa.field("msg_id", pa.string()),
        pa.field("offset_msg_id", pa.string()),
        pa.field("tags", pa.string()),
        pa.field("keys", pa.list_(pa.string())),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
        pa.field("body", pa.binary()),
        pa.field("born_ts", _TS),
        pa.field("store_ts", _TS),
        pa.field("reconsume_times", pa.int32()),
    ]
)
# Entries read from the consume queue per step of a partition (bounds memory in the executors).
_READ_CHUNK = 8192
QueueOffsets = dict[int, int]


def spark_message_schema() -> StructType:
    """The Spark schema of the rows the ``mq`` source returns."""
    return from_arrow_schema(MESSAGE_SCHEMA)


# --------------------------------------------------------------------------- offsets
def encode_offsets(offsets: QueueOffsets) -> dict[str, dict[str, int]]:
    """The source's offset: ``{"q": {"<queue_id>": <next offset>}}``."""
    return {"q": {str(q): int(o) for q, o in sorted(offsets.items())}}


def decode_offsets(offset: dict[str, Any]) -> QueueOffsets:
    return {int(q): int(o) for q, o in (offset.get("q") or {}).items()}


def resolve(
    position: Position, index: QueueTimeIndex, topic: str, queues: int, *, end: bool = False
) -> QueueOffsets:
    """Offsets of every queue for a position, clamped to what each queue holds.

    Queues that explicit offsets leave out take ``earliest`` (a start) or ``latest`` (an ``end``).
    """
    out: QueueOffsets = {}
    for qid in range(queues):
        low, high = index.bounds(topic, qid)
        if position == "earliest":
            out[qid] = low
        elif position == "latest":
            out[qid] = high
        elif isinstance(position, int):
            out[qid] = index.offset_for_time(topic, qid, position)
        else:
            out[qid] = min(max(position.get(qid, high if end else low), low), high)
    return out


def share_budget(start: QueueOffsets, latest: QueueOffsets, budget: int) -> QueueOffsets:
    """End offsets that read at most ``budget`` entries in all, shared evenly across the queues with
    a backlog (a queue takes less when it has less; what it leaves goes to the others)."""
    end = dict(start)
    backlog = {q: latest[q] - start.get(q, 0) for q in latest if latest[q] > start.get(q, 0)}
    remaining = budget
    while remaining > 0 and backlog:
        share = max(1, remaining // len(backlog))
        for qid in sorted(backlog):
            take = min(share, backlog[qid], remaining)
            end[qid] = end.get(qid, 0) + take
            backlog[qid] -= take
            remaining -= take
            if backlog[qid] == 0:
                del backlog[qid]
            if remaining == 0:
                break
    return {q: end.get(q, start.get(q, 0)) for q in latest}


# --------------------------------------------------------------------------- reading rows
_indexes: dict[StoreRef, QueueIndex] = {}
_indexes_lock = threading.Lock()


def queue_index(ref: StoreRef) -> QueueIndex:
    """A :class:`QueueIndex` per store and Python process, reused across tasks and batches (its file
    caches stay warm in a reused Python worker). It reads through :meth:`StoreRef.reader`: a task
    opens only the tables it reads, never the whole store."""
    with _indexes_lock:
        index = _indexes.get(ref)
        if index is None:
            index = QueueIndex(ref.reader())
            _indexes[ref] = index
    return index


def to_message_rows(rows: pa.Table) -> pa.Table:
    """Commit-log rows in the source's schema (store and born times as UTC timestamps)."""

    def ts(column: str) -> pa.ChunkedArray:
        return pc.cast(pc.cast(rows[column], pa.timestamp("ms", tz="UTC")), _TS)

    columns = {name: rows[name] for name in MESSAGE_SCHEMA.names if name in rows.column_names}
    # The commit log's ``msg_id`` is the offset id; readers know a message by its unique id.
    columns["msg_id"], columns["offset_msg_id"] = rows["uniq_key"], rows["msg_id"]
    columns["born_ts"] = ts("born_ts_ms")
    columns["store_ts"] = ts("store_ts_ms")
    return pa.table([columns[n] for n in MESSAGE_SCHEMA.names], schema=MESSAGE_SCHEMA)


def read_queue(
    index: QueueIndex, topic: str, queue_id: int, start: int, end: int, selector: MessageSelector
) -> Iterator[pa.Table]:
    """Commit-log rows of the dispatched messages at ``[start, end)`` of a queue that the selector
    takes (tag or SQL92, vectorised), in offset order, a chunk at a time. Entries below the queue's
    retained minimum are gone and skipped."""
    index.refresh()
    low, high = index.bounds(topic, queue_id)
    if end > high:
        raise StoreError(
            f"{topic}:{queue_id}: asked for offsets up to {end} but only {high} are dispatched",
            topic=topic,
            queue_id=queue_id,
        )
    for lo in range(max(start, low), end, _READ_CHUNK):
        entries = index.entries(topic, queue_id, lo, min(end, lo + _READ_CHUNK))
        if not selector.matches_all:
            entries = entries.filter(selector.match_codes(entries["tags_code"]))
        if entries.num_rows == 0:
            continue
        rows = index.messages(entries["physical_offset"].to_pylist())
        if not selector.matches_all:
            rows = rows.filter(selector.matches(rows))  # tags-code collisions, or the SQL92 condition
        if rows.num_rows:
            yield rows


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """Offsets ``[start, end)`` of one queue: what one Spark task reads."""

    queue_id: int
    start: int
    end: int


def queue_ranges(start: QueueOffsets, end: QueueOffsets, per_partition: int) -> list[QueueRange]:
    """Partitions covering ``[start[q], end[q])`` of every queue, at most ``per_partition`` each."""
    out = []
    for qid in sorted(end):
        lo = start.get(qid, 0)
        for s in range(lo, end[qid], per_partition):
            out.append(QueueRange(qid, s, min(end[qid], s + per_partition)))
    return out


class _Reading:
    """What the batch and stream readers share: options, and reading one partition (executors)."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueRange):
            return  # Spark's placeholder partition of an empty read
        target = to_arrow_schema(self.schema, timezone="UTC")
        selector = self.options.selector
        index = queue_index(self.options.store)
        for rows in read_queue(
            index, self.options.topic, partition.queue_id, partition.start, partition.end, selector
        ):
            table = to_message_rows(rows).select(target.names).cast(target)
            yield from table.to_batches()


# --------------------------------------------------------------------------- batch
def commit_time_ms(store: Store, version: int) -> int:
    """When commit-log version ``version`` was committed (its commitInfo timestamp)."""
    info = read_version(store.uri(schemas.COMMIT_LOG), version, store.storage_options).commit_info
    return int(info.get("timestamp", 0))


def plan_batch(store: Store, options: ReadOptions) -> tuple[QueueOffsets, QueueOffsets]:
    """Start and end offsets of every queue for a batch read (see :class:`ReadOptions`).

    Raises:
        TopicNotFoundError: no such topic.
        InvalidArgumentError: ``asOfVersion`` after the latest commit-log version, or given for a
            store with several commit-log shards (they have no common version).
        StoreError: ``asOfVersion`` asks for messages the dispatch job has not indexed yet.
    """
    topic = options.topic
    queues = store.topic(topic).queues
    index = QueueTimeIndex(store)
    if options.start_time is not None:
        start = resolve(options.start_time, index, topic, queues)
    else:
        start = resolve(options.starting or "earliest", index, topic, queues)
    ending = options.end_time if options.end_time is not None else options.ending or "latest"
    end = resolve(ending, index, topic, queues, end=True)
    as_of_ms: int | None = None
    if options.as_of_version is not None:
        version = options.as_of_version
        if store.commit_log_shards > 1:
            # Each shard's commit log has versions of its own: no one version is the whole store's.
            raise InvalidArgumentError(
                f"asOfVersion names a commit-log version, and this store has {store.commit_log_shards} "
                "commit-log shards, each with its own versions; bound the read by store time "
                "(endTime) instead",
                version=version,
            )
        latest = store.version(schemas.COMMIT_LOG)
        if version > latest:
            raise InvalidArgumentError(
                f"asOfVersion {version} is after the commit log's latest version {latest}",
                version=version,
            )
        hwm = read_hwm(store.snapshot(schemas.COMMIT_LOG, version))
        for qid in range(queues):
            stood = hwm.next_queue_offset(topic, qid)
            if stood > index.bounds(topic, qid)[1]:
                raise StoreError(
                    f"{topic}:{qid} held {stood} messages at commit-log version {version} but only "
                    f"{index.bounds(topic, qid)[1]} are dispatched; run the dispatch job first",
                    topic=topic,
                    queue_id=qid,
                )
            end[qid] = min(end[qid], stood)
        as_of_ms = commit_time_ms(store, version)
    if options.consumed_by is not None:
        consumed = committed_offsets(store, options.consumed_by, topic, as_of_ms=as_of_ms)
        for qid in range(queues):
            end[qid] = min(end[qid], consumed.get(qid, 0))
    end = {q: max(end[q], start[q]) for q in end}
    return start, end


class MQBatchReader(_Reading, DataSourceReader):
    """Batch read of a topic: planned on the driver, read by the executors."""

    def partitions(self) -> Sequence[InputPartition]:
        store = self.options.store.open()
        start, end = plan_batch(store, self.options)
        return queue_ranges(start, end, self.options.entries_per_partition)


# --------------------------------------------------------------------------- stream
class MQStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming read of a topic (see the module doc for offsets and group commits).

    ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` run on the driver in one
    long-lived Python worker per query; ``read`` runs in the executors.
    """

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self._target: QueueOffsets | None = None
        self._group_offsets: QueueOffsets | None = None  # what the group has, as far as we know
        self._offset_store: OffsetStore | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_offset_store"] = None  # holds a store; executors only need the options
        return state

    def _store(self) -> Store:
        return self.options.store.open()

    def _queues(self) -> int:
        return self._store().topic(self.options.topic).queues

    def _group(self) -> OffsetStore | None:
        if self.options.group is None:
            return None
        if self._offset_store is None:
            self._offset_store = OffsetStore(self._store(), self.options.group)
        return self._offset_store

    def _read_group(self) -> QueueOffsets:
        group = self._group()
        if group is None:
            return {}
        if self._group_offsets is None:
            topic = self.options.topic
            self._group_offsets = {q: o for (t, q), o in group.read(topic).items() if t == topic}
        return self._group_offsets

    def commit_group(self, offsets: QueueOffsets) -> None:
        """Record ``offsets`` as the group's progress (only the queues that moved): called with
        offsets whose data Spark has made durable."""
        group = self._group()
        if group is None:
            return
        known = self._read_group()
        moved = {q: o for q, o in offsets.items() if known.get(q) != o}
        if moved:
            group.commit((self.options.topic, q, o) for q, o in sorted(moved.items()))
            known.update(moved)

    def initialOffset(self) -> dict[str, Any]:
        store = self._store()
        queues = self._queues()
        committed = self._read_group()
        missing = [q for q in range(queues) if q not in committed]
        start = {q: committed[q] for q in range(queues) if q in committed}
        if missing:
            position = self.options.starting or "latest"
            resolved = resolve(position, QueueTimeIndex(store), self.options.topic, queues)
            start.update({q: resolved[q] for q in missing})
            # Committed at once: a restart before the first batch must start at the same place.
            self.commit_group({q: start[q] for q in missing})
        return encode_offsets(start)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def _latest(self) -> QueueOffsets:
        index = queue_index(self.options.store)
        index.refresh()
        return {q: index.bounds(self.options.topic, q)[1] for q in range(self._queues())}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = decode_offsets(start)
        self.commit_group(begin)  # durable: Spark plans the next batch only after this one committed
        latest = self._target if self._target is not None else self._latest()
        latest = {q: max(o, begin.get(q, 0)) for q, o in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = share_budget(begin, latest, max(1, int(limit.max_rows)))
        return encode_offsets(latest)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return encode_offsets(self._latest())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return queue_ranges(decode_offsets(start), decode_offsets(end), self.options.entries_per_partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Called by Spark once the batch ending at ``end`` is durable in the sink and checkpoint."""
        self.commit_group(decode_offsets(end))


# --------------------------------------------------------------------------- the data source
class MQDataSource(DataSource):
    """The ``mq`` format: read a topic as a stream or batch, write DataFrames as messages."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return spark_message_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return MQBatchReader(ReadOptions.parse(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MQStreamReader(ReadOptions.parse(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from engine.spark.mq_sink import MQBatchWriter, check_overwrite, check_sink_schema

        check_overwrite(overwrite)
        check_sink_schema(schema)
        return MQBatchWriter(WriteOptions.parse(self.options, streaming=False), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from engine.spark.mq_sink import MQStreamWriter, check_overwrite, check_sink_schema

        check_overwrite(overwrite)
        check_sink_schema(schema)
        return MQStreamWriter(WriteOptions.parse(self.options, streaming=True), schema)
