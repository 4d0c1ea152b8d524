"""The ``mq`` sink: ``df.write.format("mq")`` and ``df.writeStream.format("mq")`` send rows as messages.

Columns: ``topic`` (string) and ``body`` (binary, or string sent as UTF-8) are required; ``tags``
(string), ``keys`` (array<string>), ``properties`` (map<string,string>), ``queue_id`` (int) and
``sharding_key`` (string, picks the queue by hash) are optional; without either, rows go round-robin
over the topic's queues. Any other column is refused.

Exactly once per micro-batch. Executors cannot safely commit to the commit log themselves (a
retried task or a replayed batch would commit again), so they only validate their rows and return
them as Arrow to the driver. ``commit(messages, batchId)``, on the driver, appends all of them as
ONE commit-log commit carrying the Delta app transaction ``mq.sink.<sinkId> = batchId``, checked
and written atomically by :class:`~engine.store.commit_log.CommitLogWriter`. A batch id already
recorded writes nothing; a batch id BELOW the recorded one means the query's checkpoint was reset
(or another query shares the sinkId) and fails instead of silently skipping data. ``sinkId`` is
required for streams: a Python sink is not told its checkpoint location, so the marker cannot be
derived from it. A batch write is one commit (idempotent too with options ``sinkId`` + ``batchId``)
and needs ``.mode("append")``: Spark refuses its default ``ErrorIfExists`` for Python sinks, and
``overwrite`` is refused here (topics are append-only).

Every row is checked before anything is written (body size, tags, keys, properties, the topic
exists, is writable and not a system topic, the queue id is in range); one bad row fails the batch
with a typed error and the commit log is unchanged. Rows travel to the driver, so a micro-batch must
fit in the driver's memory, as with ``collect()``.
"""

from __future__ import annotations

import io
import random
import time
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
class MQRows(WriterCommitMessage):
    """One task's validated rows, as an Arrow IPC stream, for the driver to commit."""

    ipc: bytes
    rows: int


def _to_ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, ROWS_SCHEMA) as writer:
        writer.write_table(table)
    return sink.getvalue()


def collect_rows(messages: Sequence[WriterCommitMessage | None]) -> pa.Table:
    """The rows of every task, in task order."""
    parts = []
    for message in messages:
        if isinstance(message, MQRows) and message.rows:
            parts.append(pa.ipc.open_stream(message.ipc).read_all())
    return pa.concat_tables(parts) if parts else ROWS_SCHEMA.empty_table()


def pending_messages(
    store: Store, rows: pa.Table, ids: UniqKeyGenerator | None = None
) -> list[PendingMessage]:
    """Checked rows -> messages with their queues (topics and queue ids are checked here).

    Raises:
        TopicNotFoundError: a row's topic does not exist.
        InvalidMessageError: a system or read-only topic.
        InvalidArgumentError: a queue id out of range, an empty sharding key.
    """
    ids = ids or UniqKeyGenerator()
    round_robin: dict[str, int] = {}
    out = []
    for row in rows.to_pylist():
        name = row["topic"]
        if is_system_topic(name):
            raise InvalidMessageError(
                f"topic {name!r} is a system topic; the mq sink cannot write it", topic=name
            )
        topic = store.topic(name)
        if not is_writeable(topic.perm):
            raise InvalidMessageError(f"topic {name!r} is not writable (perm {topic.perm})", topic=name)
        qid = row["queue_id"]
        if qid is not None:
            if not 0 <= qid < topic.queues:
                raise InvalidArgumentError(
                    f"queue_id {qid} is out of range; topic {name!r} has queues 0..{topic.queues - 1}",
                    topic=name,
                    queue_id=qid,
                )
        elif row["sharding_key"] is not None:
            if not row["sharding_key"]:
                raise InvalidArgumentError("sharding_key must be a non-empty string", topic=name)
            qid = select_queue_by_hash(row["sharding_key"], topic.queues)
        else:
            # Round-robin from a random queue: small batches do not all land on queue 0.
            nxt = round_robin.get(name, random.randrange(topic.queues))
            qid, round_robin[name] = nxt % topic.queues, nxt + 1
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
    """Last batch id a sink recorded in the commit log, if any."""
    return store.app_version(schemas.COMMIT_LOG, app_id)


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
        if recorded == batch_id:
            return []
        txns = {app_id: batch_id}
    messages = pending_messages(store, rows)
    if not messages:
        return []
    return CommitLogWriter(store).append(messages, app_transactions=txns)


class _Writing:
    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Runs in the executors: check this task's rows and hand them to the driver."""
        born = int(time.time() * 1000)
        parts = [normalize_rows(batch, born) for batch in iterator]
        table = pa.concat_tables(parts) if parts else ROWS_SCHEMA.empty_table()
        return MQRows(_to_ipc(table), table.num_rows)


class MQBatchWriter(_Writing, DataSourceArrowWriter):
    """``df.write.format("mq")``: the whole DataFrame is one commit-log commit."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        o = self.options
        commit_rows(o.store.open(), collect_rows(messages), o.app_id, o.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: nothing is written before :meth:`commit`."""


class MQStreamWriter(_Writing, DataSourceStreamArrowWriter):
    """``df.writeStream.format("mq")``: each micro-batch is one commit, exactly once per sinkId."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        o = self.options
        commit_rows(o.store.open(), collect_rows(messages), o.app_id, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: nothing is written before :meth:`commit`."""
