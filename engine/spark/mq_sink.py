"""The ``mq`` sink: ``df.write.format("mq")`` and ``df.writeStream.format("mq")`` send rows as messages.

Columns: ``topic`` (string) and ``body`` (binary, or string sent as UTF-8) are required; ``tags``
(string), ``keys`` (array<string>), ``properties`` (map<string,string>), ``queue_id`` (int) and
``sharding_key`` (string, picks the queue by hash) are optional; without either, rows go round-robin
over the topic's queues. Any other column is refused.

Exactly once per (sink, partition, batch), with bounded driver memory. Executors cannot safely
commit to the commit log themselves before every task has checked its rows (a bad row must write
nothing), so each task checks its rows (fields, topic exists and is writable, queue ids) and stages
them as one Arrow file under ``<store>/_staging/<write id>/`` (:mod:`engine.store.staging`), named
by its task attempt: retried and speculated attempts never share a file, and only the attempts Spark
committed reach the driver. ``commit(messages, batchId)``, on the driver, then reads the staged
partitions ONE AT A TIME and appends each as one commit-log commit through the producer path
(:class:`~engine.store.commit_log.CommitLogWriter`), so the driver holds one partition, never the
DataFrame. With a ``sinkId`` each partition's commit carries the Delta app transaction
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
to mean the same rows.

Every row is checked in the tasks before anything is written; one bad row fails the job with a
typed error and the commit log is unchanged. The staging directory is deleted after the commit (or
the abort).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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

from engine.errors import InvalidArgumentError, InvalidMessageError
from engine.protocol import (
    PROPERTY_KEYS,
    UniqKeyGenerator,
    is_system_topic,
    select_queue_by_hash,
    validate_message_fields,
)
from engine.protocol.permissions import is_writeable
from engine.spark.mq_options import WriteOptions
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.staging import drop_write, new_write_id, read_staged, stage
from engine.store.stamping import PendingMessage, Stamped
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
# What executors send to the driver: the rows, validated, in this schema.
ROWS_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("body", pa.binary()),
        pa.field("tags", pa.string()),
        pa.field("keys", pa.list_(pa.string())),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
        pa.field("queue_id", pa.int64()),
        pa.field("sharding_key", pa.string()),
        pa.field("born_ts_ms", pa.int64()),
    ]
)


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


def normalize_rows(batch: pa.RecordBatch | pa.Table, born_ts_ms: int) -> pa.Table:
    """A batch of input rows in :data:`ROWS_SCHEMA`, each row checked (runs in the executors).

    Raises:
        InvalidMessageError, InvalidTopicError: the first bad row.
    """
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    n = table.num_rows
    columns = {}
    for f in ROWS_SCHEMA:
        if f.name == "born_ts_ms":
            columns[f.name] = pa.array([born_ts_ms] * n, pa.int64())
        elif f.name in table.column_names:
            col = table[f.name]
            if f.name == "body" and pa.types.is_string(col.type):
                col = pc.cast(col, pa.binary())
            columns[f.name] = col.cast(f.type)
        else:
            columns[f.name] = pa.nulls(n, f.type)
    rows = pa.table(columns, schema=ROWS_SCHEMA)
    for row in rows.select(["topic", "body", "tags", "keys", "properties"]).to_pylist():
        validate_message_fields(
            row["topic"], row["body"], row["tags"], row["keys"] or (), dict(row["properties"] or ())
        )
    return rows


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


def check_rows(store: Store, rows: pa.Table) -> dict[str, Any]:
    """Check where rows go, column-wise: every topic exists, is writable and not a system topic; every
    queue id is in range; no sharding key is empty. Returns each topic's configuration by name.

    Raises:
        TopicNotFoundError: a row's topic does not exist.
        InvalidMessageError: a system or read-only topic.
        InvalidArgumentError: a queue id out of range, an empty sharding key.
    """
    topics: dict[str, Any] = {}
    names = rows["topic"]
    for name in pc.unique(names).to_pylist():
        if is_system_topic(name):
            raise InvalidMessageError(
                f"topic {name!r} is a system topic; the mq sink cannot write it", topic=name
            )
        topic = store.topic(name)
        if not is_writeable(topic.perm):
            raise InvalidMessageError(f"topic {name!r} is not writable (perm {topic.perm})", topic=name)
        topics[name] = topic
    qids = rows["queue_id"]
    if qids.null_count < len(qids):
        for name, topic in topics.items():
            chosen = pc.filter(qids, pc.and_(pc.equal(names, name), pc.is_valid(qids)))
            if len(chosen) == 0:
                continue
            lo, hi = (v.as_py() for v in pc.min_max(chosen).values())
            if lo < 0 or hi >= topic.queues:
                qid = lo if lo < 0 else hi
                raise InvalidArgumentError(
                    f"queue_id {qid} is out of range; topic {name!r} has queues 0..{topic.queues - 1}",
                    topic=name,
                    queue_id=qid,
                )
    empty = pc.and_(pc.is_null(qids), pc.equal(rows["sharding_key"], ""))
    if pc.any(empty).as_py():
        name = pc.filter(names, empty)[0].as_py()
        raise InvalidArgumentError("sharding_key must be a non-empty string", topic=name)
    return topics


def pending_messages(
    store: Store, rows: pa.Table, ids: UniqKeyGenerator | None = None
) -> list[PendingMessage]:
    """Checked rows -> messages with their queues (where they go is checked first, :func:`check_rows`).

    Raises:
        TopicNotFoundError: a row's topic does not exist.
        InvalidMessageError: a system or read-only topic.
        InvalidArgumentError: a queue id out of range, an empty sharding key.
    """
    topics = check_rows(store, rows)
    ids = ids or UniqKeyGenerator()
    round_robin: dict[str, int] = {}
    out = []
    for row in rows.to_pylist():
        name = row["topic"]
        queues = topics[name].queues
        qid = row["queue_id"]
        if qid is None and row["sharding_key"] is not None:
            qid = select_queue_by_hash(row["sharding_key"], queues)
        elif qid is None:
            # Round-robin from a random queue: small batches do not all land on queue 0.
            nxt = round_robin.get(name, random.randrange(queues))
            qid, round_robin[name] = nxt % queues, nxt + 1
        keys = tuple(row["keys"] or ())
        props = dict(row["properties"] or ())
        if keys:
            props[PROPERTY_KEYS] = " ".join(keys)
        out.append(
            PendingMessage(
                topic=name,
                queue_id=int(qid),
                body=bytes(row["body"]),
                uniq_key=ids.next(),
                tags=row["tags"],
                keys=keys,
                properties=props,
                born_ts_ms=int(row["born_ts_ms"]),
            )
        )
    return out


def sink_progress(store: Store, app_id: str) -> int | None:
    """Last batch id a sink recorded complete in the commit log, if any."""
    return store.app_version(schemas.COMMIT_LOG, app_id)


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
    return recorded == batch_id


def commit_rows(store: Store, rows: pa.Table, app_id: str | None, batch_id: int | None) -> list[Stamped]:
    """Append validated rows as one commit-log commit, idempotent per (app id, batch id).

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
    messages = pending_messages(store, rows)
    if not messages:
        return []
    return CommitLogWriter(store).append(messages, app_transactions=txns)


def commit_staged(
    store: Store, parts: Sequence[MQStaged], app_id: str | None, batch_id: int | None
) -> list[Stamped]:
    """Append staged partitions, one commit-log commit each, in partition order; exactly once per
    (app id, partition, batch id) when both are given (see the module doc). One partition is in
    memory at a time.

    Returns what was stored (``[]`` for a batch already complete).

    Raises:
        InvalidArgumentError: ``batch_id`` is below the sink's recorded batch (a reset checkpoint).
        MQError: a staged file is unreadable, or a commit failed (partitions committed before it
            stay; a replay of the batch writes the rest).
    """
    guarded = app_id is not None and batch_id is not None
    if guarded and _check_batch(store, app_id, batch_id):  # type: ignore[arg-type]
        return []
    todo = sorted((p for p in parts if p.rows), key=lambda p: (p.partition, p.path))
    writer = CommitLogWriter(store)
    stored: list[Stamped] = []
    for i, part in enumerate(todo):
        txns: dict[str, int] | None = None
        if guarded:
            assert app_id is not None and batch_id is not None
            txns = {partition_app(app_id, part.partition): batch_id}
            if i == len(todo) - 1:
                txns[app_id] = batch_id  # the batch is complete with its last partition
        messages = pending_messages(store, read_staged(store, part.path))
        stored.extend(writer.append(messages, app_transactions=txns))
    return stored


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
        store = self.options.store.open()
        check_rows(store, table)  # topics, permissions and queue ids: fail here, before any commit
        return MQStaged(stage(store, self.write_id, name, table), table.num_rows, partition)

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
