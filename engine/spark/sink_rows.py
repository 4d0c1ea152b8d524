"""The rows of the ``mq`` sink: checked and turned into a batch for the commit log, column-wise.

The sink's hot path. A task checks its rows (:func:`normalize_rows`, :func:`check_rows`) and builds
the batch's offset-free columns (:func:`pending_batch`: queues, unique keys, tags codes, sizes), so
the driver only stamps offsets and commits. Rows without keys and properties, the bulk of what a
DataFrame sends, never become Python objects: checked with Arrow kernels, built with numpy. A row
that may be bad, and every row with keys or properties, goes through the producer's own per-row
checks (:func:`~engine.protocol.validate_message_fields`), so both paths accept and refuse the
same rows with the same errors.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import InvalidArgumentError, InvalidMessageError
from engine.protocol import (
    PROPERTY_KEYS,
    UniqKeyGenerator,
    is_system_topic,
    select_queue_by_hash,
    validate_message_fields,
    validate_topic_name,
)
from engine.protocol.messages import MAX_BODY_BYTES
from engine.protocol.permissions import is_writeable
from engine.store.commit_log import PendingBatch, PendingMessage
from engine.store.store import Store

# What a task checks and batches: the rows, in this schema.
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


def normalize_rows(batch: pa.RecordBatch | pa.Table, born_ts_ms: int) -> pa.Table:
    """A batch of input rows in :data:`ROWS_SCHEMA`, each row checked (runs in the executors).

    Raises:
        InvalidMessageError, InvalidTopicError: a bad row.
    """
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    n = table.num_rows
    columns = {}
    for f in ROWS_SCHEMA:
        if f.name == "born_ts_ms":
            columns[f.name] = pa.array(np.full(n, born_ts_ms, dtype=np.int64))
        elif f.name in table.column_names:
            col = table[f.name]
            if f.name == "body" and pa.types.is_string(col.type):
                col = pc.cast(col, pa.binary())
            columns[f.name] = col.cast(f.type)
        else:
            columns[f.name] = pa.nulls(n, f.type)
    rows = pa.table(columns, schema=ROWS_SCHEMA).combine_chunks()
    check_fields(rows)
    return rows


def _lengths(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Entries per row of a list or map column (0 for null)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return np.diff(array.offsets.to_numpy(zero_copy_only=False))


def has_extras(rows: pa.Table) -> np.ndarray:
    """Per row: whether it carries keys or properties (the rows checked and built one by one)."""
    return (_lengths(rows["keys"]) > 0) | (_lengths(rows["properties"]) > 0)


def check_fields(rows: pa.Table) -> None:
    """Check every row's fields as :func:`~engine.protocol.validate_message_fields` does.

    Column-wise: each distinct topic name once; bodies and tags by Arrow kernels. Rows that fail
    those checks, or carry keys or properties, are checked one by one, which raises the error.

    Raises:
        InvalidTopicError: a bad topic name.
        InvalidMessageError: a bad body, tags, keys or properties.
    """
    if rows.num_rows == 0:
        return
    for name in pc.unique(rows["topic"]).to_pylist():
        validate_topic_name(name)
    lengths = pc.binary_length(rows["body"])
    body_bad = pc.fill_null(pc.or_(pc.equal(lengths, 0), pc.greater(lengths, MAX_BODY_BYTES)), True)
    tags = rows["tags"]
    tags_bad = pc.fill_null(pc.or_(pc.equal(pc.utf8_length(tags), 0), pc.match_substring(tags, "||")), False)
    suspect = pc.or_(body_bad, tags_bad).to_numpy(zero_copy_only=False) | has_extras(rows)
    if not suspect.any():
        return
    chosen = rows.filter(pa.array(suspect)).select(["topic", "body", "tags", "keys", "properties"])
    for row in chosen.to_pylist():
        validate_message_fields(
            row["topic"], row["body"], row["tags"], row["keys"] or (), dict(row["properties"] or ())
        )


def writable_topics(store: Store, names: Iterable[str]) -> dict[str, int]:
    """Each topic's queue count by name, after checking it exists, is writable and is not a system
    topic.

    Raises:
        TopicNotFoundError: a topic does not exist.
        InvalidMessageError: a system or read-only topic.
    """
    queues: dict[str, int] = {}
    for name in names:
        if is_system_topic(name):
            raise InvalidMessageError(
                f"topic {name!r} is a system topic; the mq sink cannot write it", topic=name
            )
        topic = store.topic(name)
        if not is_writeable(topic.perm):
            raise InvalidMessageError(f"topic {name!r} is not writable (perm {topic.perm})", topic=name)
        queues[name] = topic.queues
    return queues


def check_rows(store: Store, rows: pa.Table) -> dict[str, int]:
    """Check where rows go, column-wise: every topic exists, is writable and not a system topic; every
    queue id is in range; no sharding key is empty. Returns each topic's queue count by name.

    Raises:
        TopicNotFoundError: a row's topic does not exist.
        InvalidMessageError: a system or read-only topic.
        InvalidArgumentError: a queue id out of range, an empty sharding key.
    """
    names = rows["topic"]
    queues = writable_topics(store, pc.unique(names).to_pylist())
    qids = rows["queue_id"]
    if qids.null_count < len(qids):
        for name, count in queues.items():
            chosen = pc.filter(qids, pc.and_(pc.equal(names, name), pc.is_valid(qids)))
            if len(chosen) == 0:
                continue
            lo, hi = (v.as_py() for v in pc.min_max(chosen).values())
            if lo < 0 or hi >= count:
                qid = lo if lo < 0 else hi
                raise InvalidArgumentError(
                    f"queue_id {qid} is out of range; topic {name!r} has queues 0..{count - 1}",
                    topic=name,
                    queue_id=qid,
                )
    empty = pc.and_(pc.is_null(qids), pc.equal(rows["sharding_key"], ""))
    if pc.any(empty).as_py():
        name = pc.filter(names, empty)[0].as_py()
        raise InvalidArgumentError("sharding_key must be a non-empty string", topic=name)
    return queues


def choose_queues(rows: pa.Table, queues: dict[str, int]) -> np.ndarray:
    """Each row's queue: its ``queue_id``; else by the hash of its ``sharding_key`` (as RocketMQ's
    ``SelectMessageQueueByHash``); else round-robin over its topic's queues from a random one (so
    small batches do not all land on queue 0). Rows already checked by :func:`check_rows`."""
    n = rows.num_rows
    qids: np.ndarray = np.array(pc.fill_null(rows["queue_id"], -1).to_numpy(zero_copy_only=False), np.int64)
    open_ = qids < 0
    if not open_.any():
        return qids
    names = rows["topic"]
    keyed = open_ & pc.is_valid(rows["sharding_key"]).to_numpy(zero_copy_only=False)
    if keyed.any():
        where = np.nonzero(keyed)[0]
        keys = pc.take(rows["sharding_key"], pa.array(where)).to_pylist()
        tops = pc.take(names, pa.array(where)).to_pylist()
        qids[where] = [select_queue_by_hash(k, queues[t]) for k, t in zip(keys, tops, strict=True)]
        open_ &= ~keyed
    if len(queues) == 1:
        masks = {next(iter(queues)): np.ones(n, dtype=bool)}
    else:
        masks = {t: pc.equal(names, t).to_numpy(zero_copy_only=False) for t in queues}
    for name, mask in masks.items():
        where = np.nonzero(open_ & mask)[0]
        if len(where):
            count = queues[name]
            qids[where] = (random.randrange(count) + np.arange(len(where))) % count
    return qids


def pending_batch(store: Store, rows: pa.Table, ids: UniqKeyGenerator | None = None) -> PendingBatch:
    """Checked rows (:func:`normalize_rows`) -> the batch the commit log appends, its queues chosen
    (:func:`choose_queues`) and unique keys given. Column-wise unless a row has keys or properties.

    Raises:
        TopicNotFoundError: a row's topic does not exist.
        InvalidMessageError: a system or read-only topic.
        InvalidArgumentError: a queue id out of range, an empty sharding key.
    """
    queues = check_rows(store, rows)
    ids = ids or UniqKeyGenerator()
    qids = choose_queues(rows, queues)
    if rows.num_rows and has_extras(rows).any():
        return PendingBatch.of(_messages(rows, qids, ids))
    return PendingBatch.plain(
        rows["topic"], qids, rows["body"], ids.next_many(rows.num_rows), rows["tags"], rows["born_ts_ms"]
    )


def _messages(rows: pa.Table, qids: np.ndarray, ids: UniqKeyGenerator) -> list[PendingMessage]:
    out = []
    listed = rows.select(["topic", "body", "tags", "keys", "properties", "born_ts_ms"]).to_pylist()
    for row, qid, uniq in zip(listed, qids.tolist(), ids.next_many(len(listed)), strict=True):
        keys = tuple(row["keys"] or ())
        props = dict(row["properties"] or ())
        if keys:
            props[PROPERTY_KEYS] = " ".join(keys)
        out.append(
            PendingMessage(
                topic=row["topic"],
                queue_id=qid,
                body=bytes(row["body"]),
                uniq_key=uniq,
                tags=row["tags"],
                keys=keys,
                properties=props,
                born_ts_ms=int(row["born_ts_ms"]),
            )
        )
    return out
