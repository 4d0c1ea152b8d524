"""The ``mq`` sink: ``df.write.format("mq")`` and ``df.writeStream.format("mq")`` send rows as messages.

Columns: ``topic`` (string) and ``body`` (binary, or string sent as UTF-8) are required; ``tags``
(string), ``keys`` (array<string>), ``properties`` (map<string,string>), ``queue_id`` (int) and
``sharding_key`` (string, picks the queue by hash) are optional; without either, rows go round-robin
over the topic's queues. Any other column is refused.

Exactly once per (sink, partition, batch), with bounded driver memory. Executors cannot safely
commit to the commit log themselves before every task has checked its rows (a bad row must write
nothing), so each task checks its rows (fields, topic exists and is writable, queue ids), builds
the commit log's offset-free columns for them (queues chosen, unique keys given, column-wise:
:mod:`engine.spark.sink_rows`) and stages them as one Arrow file under
``<store>/_staging/<write id>/`` (:mod:`engine.store.staging`), named by its task attempt: retried
and speculated attempts never share a file, and only the attempts Spark committed reach the driver.
``commit(messages, batchId)``, on the driver, then reads the staged partitions ONE AT A TIME and
appends each as one commit-log commit through the producer path
(:class:`~engine.store.commit_log.CommitLogWriter`: the sequencer stamps the offsets at commit), so
the driver holds one partition, never the DataFrame, and does no per-row work in Python. With a
``sinkId`` each partition's commit carries the Delta app transaction
``mq.sink.<sinkId>.p<partition> = batchId`` and the last one also ``mq.sink.<sinkId> = batchId``
(the batch is complete), checked and written atomically by the writer: a batch replayed after a
crash between partitions writes only the partitions still missing; a batch id already complete
writes nothing; a batch id BELOW the recorded one means the query's checkpoint was reset (or another
query shares the sinkId) and fails instead of silently skipping data. ``sinkId`` is required for
streams: a Python sink is not told its checkpoint location, so the marker cannot be derived from it.
A batch write is exactly once within its job (idempotent across re-runs too with options ``sinkId``
+ ``batchId``) and needs ``.mode("append")``: Spark refuses its default ``ErrorIfExists`` for Python
sinks, and ``overwrite`` is refused here (topics are append-only). A replayed micro-batch must bring
the same rows to the same partitions (as a deterministic source does) for the per-partition guard
to mean the same rows. In a store of several commit-log shards, a partition's rows are committed
per shard (a commit is atomic within one shard only), each with the partition's marker on that
shard, and ``mq.sink.<sinkId>`` goes on every shard the batch wrote: exactly once per (sink,
partition, batch, shard).

Every row is checked in the tasks before anything is written; one bad row fails the job with a
typed error and the commit log is unchanged. The staging directory is deleted after the commit (or
the abort).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from engine.errors import InvalidArgumentError
from engine.spark.mq_options import WriteOptions
from engine.spark.sink_rows import ROWS_SCHEMA, normalize_rows, pending_batch, writable_topics
from engine.store.commit_log import CommitLogs, PendingBatch, Stamped
from engine.store.staging import drop_write, new_write_id, read_staged, stage
from engine.store.store import Store

_STRING = StringType()
_COLUMN_TYPES: dict[str, tuple[DataType, ...]] = {
    "topic": (_STRING,),
    "body": (BinaryType(), _STRING),
    "tags": (_STRING,),
    "keys": (ArrayType(_STRING, True), ArrayType(_STRING, False)),
    "properties": (MapType(_STRING, _STRING, True), MapType(_STRING, _STRING, False)),
    "queue_id": (IntegerType(), LongType(), ShortType()),
    "sharding_key": (_STRING,),
}
REQUIRED_COLUMNS = ("topic", "body")


def check_overwrite(overwrite: bool) -> None:
    """Raises :class:`InvalidArgumentError` for ``mode("overwrite")``: topics are append-only."""
    if overwrite:
        raise InvalidArgumentError("the mq sink only appends messages; mode 'overwrite' is not supported")


def check_sink_schema(schema: StructType) -> None:
    """Check a DataFrame's columns against what the sink accepts.

    Raises:
        InvalidArgumentError: a required column is missing, a column is unknown or has a wrong type.
    """
    names = [f.name for f in schema.fields]
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise InvalidArgumentError(f"the mq sink needs columns {missing}; it got {names}", columns=names)
    for f in schema.fields:
        allowed = _COLUMN_TYPES.get(f.name)
        if allowed is None:
            raise InvalidArgumentError(
                f"the mq sink does not know column {f.name!r}; columns: {', '.join(_COLUMN_TYPES)}",
                column=f.name,
            )
        if f.dataType not in allowed:
            kinds = " or ".join(t.simpleString() for t in allowed)
            raise InvalidArgumentError(
                f"mq sink column {f.name!r} must be {kinds}, not {f.dataType.simpleString()}", column=f.name
            )


@dataclass(frozen=True)
class MQStaged(WriterCommitMessage):
    """One task's checked rows, staged for the driver: where, how many, which partition."""

    path: str
    rows: int
    partition: int


def _task_identity() -> tuple[int, str]:
    """This task's partition id and a name unique to this attempt (executors)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = f"{ctx.stageId()}-{ctx.attemptNumber()}-{ctx.taskAttemptId()}" if ctx is not None else "0"
    return int(partition), f"p{partition:05d}-a{attempt}-{uuid.uuid4().hex[:8]}"


def sink_progress(store: Store, app_id: str) -> int | None:
    """Last batch id a sink recorded complete in the commit log (the highest any shard records),
    if any."""
    return max(store.app_version(name, app_id) for name in store.commit_logs)


def partition_app(app_id: str, partition: int) -> str:
    """The app transaction guarding one partition of a sink's batches."""
    return f"{app_id}.p{partition}"


def _check_batch(store: Store, app_id: str, batch_id: int) -> bool:
    """True when batch ``batch_id`` of the sink is already complete.

    Raises:
        InvalidArgumentError: the sink recorded a later batch (a reset checkpoint).
    """
    recorded = sink_progress(store, app_id)
    if recorded is not None and batch_id < recorded:
        raise InvalidArgumentError(
            f"sink {app_id} already wrote batch {recorded} and is now asked for batch {batch_id}: "
            "the query's checkpoint was reset or another query uses the same sinkId; writing "
            "would skip or repeat data, so use a new sinkId",
            app_id=app_id,
            batch_id=batch_id,
            recorded=recorded,
        )
    # With several shards a batch is complete only once every shard it writes records it, which
    # only its rows tell: each shard's commits are guarded on their own (the writer skips them).
    return recorded == batch_id and store.commit_log_shards == 1


def commit_rows(store: Store, rows: pa.Table, app_id: str | None, batch_id: int | None) -> list[Stamped]:
    """Append checked rows (:func:`~engine.spark.sink_rows.normalize_rows`) as one commit-log commit,
    idempotent per (app id, batch id).

    Returns what was stored; ``[]`` when the batch was already written (a replay) or empty.

    Raises:
        InvalidArgumentError: ``batch_id`` is below the sink's recorded batch (a reset checkpoint).
        MQError: a bad row (TopicNotFoundError, InvalidMessageError; nothing is written) or a
            failed commit.
    """
    txns: dict[str, int] | None = None
    if app_id is not None and batch_id is not None:
        if _check_batch(store, app_id, batch_id):
            return []
        txns = {app_id: batch_id}
    batch = pending_batch(store, rows)
    if not batch.num_rows:
        return []
    logs = CommitLogs(store)
    if txns is None:
        try:
            return logs.append(batch)
        finally:
            logs.close()
    # Exactly once per shard: each shard's part commits with the sink's marker on that shard.
    stored: list[tuple[int, Stamped]] = []
    for shard, positions in logs.split(batch).items():
        part = batch if len(positions) == batch.num_rows else batch.take(positions)
        stamped = logs.writer(shard).append(part, app_transactions=txns)
        stored.extend(zip(positions, stamped, strict=False))
    return [s for _, s in sorted(stored, key=lambda item: item[0])]


@dataclass(frozen=True)
class CommittedPart:
    """One staged partition committed: its partition, its rows and the commit-log version."""

    partition: int
    rows: int
    version: int
    shard: int = 0


def commit_staged(
    store: Store, parts: Sequence[MQStaged], app_id: str | None, batch_id: int | None
) -> list[CommittedPart]:
    """Append staged partitions, one commit-log commit each, in partition order; exactly once per
    (app id, partition, batch id) when both are given (see the module doc). One partition is in
    memory at a time: the tasks staged each one as the commit log's offset-free columns, so the
    driver only checks the topics are still writable, stamps the offsets and commits.

    Returns the partitions committed now (``[]`` for a batch already complete; a partition
    committed by an earlier attempt of the batch is left out).

    Raises:
        InvalidArgumentError: ``batch_id`` is below the sink's recorded batch (a reset checkpoint).
        TopicNotFoundError, InvalidMessageError: a topic was deleted or made read-only since.
        MQError: a staged file is unreadable, or a commit failed (partitions committed before it
            stay; a replay of the batch writes the rest).
    """
    guarded = app_id is not None and batch_id is not None
    if guarded and _check_batch(store, app_id, batch_id):  # type: ignore[arg-type]
        return []
    todo = sorted((p for p in parts if p.rows), key=lambda p: (p.partition, p.path))
    logs = CommitLogs(store)
    committed: list[CommittedPart] = []
    written: set[int] = set()
    last: set[int] = set()  # the shards the batch's last partition writes
    for i, part in enumerate(todo):
        batch = PendingBatch.from_columns(read_staged(store, part.path))
        writable_topics(store, pc.unique(batch.columns["topic"]).to_pylist())
        split = logs.split(batch)
        if i == len(todo) - 1:
            last = set(split)
        for shard, positions in split.items():
            txns: dict[str, int] | None = None
            if guarded:
                assert app_id is not None and batch_id is not None
                txns = {partition_app(app_id, part.partition): batch_id}
                if i == len(todo) - 1:
                    txns[app_id] = batch_id  # the batch is complete (on this shard) with its last partition
            rows = batch if len(positions) == batch.num_rows else batch.take(positions)
            stamped = logs.writer(shard).append_batch(rows, app_transactions=txns)
            written.add(shard)
            if stamped.version >= 0:
                committed.append(CommittedPart(part.partition, len(stamped), stamped.version, shard))
    if guarded:
        assert app_id is not None and batch_id is not None
        for shard in sorted(written - last):  # shards the batch wrote before its last partition
            logs.writer(shard).append_batch([], app_transactions={app_id: batch_id})
    return committed


class _Writing:
    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.write_id = new_write_id()  # made on the driver: every task of this writer shares it

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Runs in the executors: check this task's rows and stage them for the driver."""
        born = int(time.time() * 1000)
        parts = [normalize_rows(batch, born) for batch in iterator]
        table = pa.concat_tables(parts) if parts else ROWS_SCHEMA.empty_table()
        partition, name = _task_identity()
        if table.num_rows == 0:
            return MQStaged("", 0, partition)
        store = self.options.store.reader()  # a task reads the topics and stages: no table is opened else
        # Topics, permissions and queue ids are checked here, before any commit; the driver gets
        # the commit log's offset-free columns and only stamps the offsets.
        batch = pending_batch(store, table)
        return MQStaged(stage(store, self.write_id, name, batch.columns), batch.num_rows, partition)

    def _commit(self, messages: Sequence[WriterCommitMessage | None], batch_id: int | None) -> None:
        store = self.options.store.open()
        try:
            parts = [m for m in messages if isinstance(m, MQStaged)]
            commit_staged(store, parts, self.options.app_id, batch_id)
        finally:
            drop_write(store, self.write_id)

    def _abort(self) -> None:
        drop_write(self.options.store.open(), self.write_id)


class MQBatchWriter(_Writing, DataSourceArrowWriter):
    """``df.write.format("mq")``: one commit-log commit per partition, committed by the driver."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._commit(messages, self.options.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing was committed: drop what the tasks staged."""
        self._abort()


class MQStreamWriter(_Writing, DataSourceStreamArrowWriter):
    """``df.writeStream.format("mq")``: each micro-batch exactly once per (sinkId, partition)."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing was committed: drop what the tasks staged."""
        self._abort()
