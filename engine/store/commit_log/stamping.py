"""Stamping a batch with its offsets: the pure half of an append to the commit log.

A batch is held in columns (:class:`PendingBatch`): the columns that do not depend on offsets are
built once, however many times a lost race makes the batch be stamped again. :func:`stamp` gives
each message its physical offset, queue offset, message id and store time from the high-water marks
of the version the writer read, and returns the new marks; :mod:`engine.store.commit_log` commits
the rows and keeps the marks only if the commit wins. Columnar throughout: this is the produce hot
path.

A re-put (:func:`reput`: a schedule delivery or timer move, a retry, a dead letter) is a new
:class:`PendingMessage` copied from a stored row.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import StoreError
from engine.model import UNDISPATCHED_FLAGS
from engine.protocol import RecordSizes, record_size, tags_code
from engine.store import schemas
from engine.store.commit_log.marks import HighWaterMarks, MarksDelta

_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


class PendingMessage(NamedTuple):
    """A validated message waiting for its offsets (a tuple: batches hold many of them)."""

    topic: str
    queue_id: int
    body: bytes
    uniq_key: str
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = _NO_PROPERTIES
    born_ts_ms: int = 0
    sys_flag: int = 0
    delay_level: int = 0
    deliver_at_ms: int | None = None
    reconsume_times: int = 0
    tags_code: int | None = None  # override (schedule topic keeps the due time here)


def row_properties(row: Mapping[str, Any]) -> dict[str, str]:
    """A commit-log row's properties as a dict (Arrow maps read as lists of pairs)."""
    props = row.get("properties") or {}
    return dict(props) if not isinstance(props, Mapping) else {str(k): str(v) for k, v in props.items()}


def reput(row: Mapping[str, Any], **fields: Any) -> PendingMessage:
    """A copy of the stored message ``row`` with ``fields`` (topic, queue_id, properties, …) set; pure.

    A re-put keeps the stored message's body, tags, keys, uniq key (the id consumers see) and born
    time; the caller says where it goes and what else it carries.
    """
    return PendingMessage(
        body=bytes(row["body"]),
        uniq_key=str(row["uniq_key"]),
        tags=row.get("tags"),
        keys=tuple(row.get("keys") or ()),
        born_ts_ms=int(row["born_ts_ms"]),
        **fields,
    )


class Stamped(NamedTuple):
    """Offsets given to one message by a successful commit."""

    msg_id: str
    uniq_key: str
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    store_ts_ms: int
    version: int


_OFFSET_FREE = [
    f
    for f in schemas.COMMIT_LOG_SCHEMA
    if f.name not in ("physical_offset", "queue_offset", "msg_id", "store_ts_ms")
]
_OFFSET_FREE_SCHEMA = pa.schema(_OFFSET_FREE)


_EMPTY_STRINGS = pa.array([], pa.string())


def _empty_lists(n: int) -> pa.Array:
    """``n`` empty ``keys`` lists, without a Python list per row."""
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), _EMPTY_STRINGS)


def _empty_maps(n: int) -> pa.Array:
    """``n`` empty ``properties`` maps, without a Python list per row."""
    return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), _EMPTY_STRINGS, _EMPTY_STRINGS)


def _tags_codes(tags: Sequence[str | None], overrides: Sequence[int | None] | None = None) -> list[int]:
    """Each message's tags code: its override when it has one (``PendingMessage.tags_code``), else
    its tags' hash."""
    codes = {t: tags_code(t) for t in set(tags)}  # a batch has few distinct tags
    if overrides is None:
        return [codes[t] for t in tags]
    return [codes[t] if c is None else c for t, c in zip(tags, overrides, strict=True)]


@dataclass(frozen=True)
class PendingBatch:
    """Messages waiting for offsets, in columns: the offset-free columns are built once per batch,
    however many times a lost race makes the batch be stamped again.

    A batch of at most :data:`ROW_BATCH_ROWS` messages given one by one (:meth:`of`) keeps them as
    they came instead (``rows``, with their ``sizes``): :func:`stamp` turns them into the commit's
    rows in one conversion, offsets and all, which costs less than the fourteen columns and then
    five more (a group commit of a few sends spent a third of its time building them); its
    ``columns`` are built only if something asks for them.
    """

    offset_free: pa.Table | None  # the commit-log columns that do not depend on offsets (None: rows)
    topics: list[str]
    queue_ids: list[int]
    dispatched: list[bool]
    uniq_keys: list[str]
    born_unset: bool = False  # some born_ts_ms are 0: stamped with the store time
    rows: tuple[PendingMessage, ...] = ()  # the messages as given, when ``offset_free`` is None
    sizes: tuple[int, ...] = ()  # with ``rows``: each message's stored size

    @functools.cached_property
    def columns(self) -> pa.Table:
        """The commit-log columns that do not depend on offsets (built from ``rows`` when asked)."""
        if self.offset_free is not None:
            return self.offset_free
        return _offset_free_table(_columns(_transposed(self.rows), list(self.sizes)))

    @property
    def num_rows(self) -> int:
        return len(self.topics)

    def queues(self) -> set[tuple[str, int]]:
        """The distinct ``(topic, queue_id)`` pairs of the batch (one look when all share one)."""
        topics, qids, n = self.topics, self.queue_ids, self.num_rows
        if n and topics.count(topics[0]) == n and qids.count(qids[0]) == n:
            return {(topics[0], qids[0])}
        return set(zip(topics, qids, strict=True))

    def take(self, positions: list[int]) -> PendingBatch:
        """The messages at ``positions``, in that order."""
        if self.offset_free is None:
            return PendingBatch.of([self.rows[i] for i in positions])
        return PendingBatch(
            self.offset_free.take(pa.array(positions, pa.int64())),
            [self.topics[i] for i in positions],
            [self.queue_ids[i] for i in positions],
            [self.dispatched[i] for i in positions],
            [self.uniq_keys[i] for i in positions],
            self.born_unset,
        )

    @classmethod
    def of(cls, messages: Sequence[PendingMessage]) -> PendingBatch:
        """A batch of ``messages`` (kept as they are up to :data:`ROW_BATCH_ROWS`, else in columns)."""
        n = len(messages)
        if not n:
            return cls(_OFFSET_FREE_SCHEMA.empty_table(), [], [], [], [])
        columns = _transposed(messages)
        topics, qids, bodies, uniq, props, born, flags = (columns[i] for i in (0, 1, 2, 3, 6, 7, 8))
        sizes = _sizes(topics, bodies, props)
        dispatched = [f not in UNDISPATCHED_FLAGS for f in flags]
        if n <= ROW_BATCH_ROWS:
            return cls(None, topics, qids, dispatched, uniq, 0 in born, tuple(messages), tuple(sizes))
        offset_free = _offset_free_table(_columns(columns, sizes))
        return cls(offset_free, topics, qids, dispatched, uniq, 0 in born)

    @classmethod
    def single_queue(
        cls,
        topic: str,
        queue_id: int,
        bodies: list[bytes],
        uniq_keys: list[str],
        tags: list[str | None],
        keys: list[list[str]] | None,
        properties: list[list[tuple[str, str]]] | None,
        born_ts_ms: int,
    ) -> PendingBatch:
        """A plain batch for one queue, built column by column (RocketMQ's batch send).

        ``keys`` / ``properties`` of None mean no message has any.
        """
        n = len(bodies)
        body_array = pa.array(bodies, pa.binary())
        header = record_size(topic, 0, _NO_PROPERTIES)
        sizes = pc.add(pc.binary_length(body_array).cast(pa.int64()), header)
        if properties is not None and any(properties):
            extra = [len("".join(f"{k}\x01{v}\x02" for k, v in p).encode()) for p in properties]
            sizes = pc.add(sizes, pa.array(extra, pa.int64()))
        zeros = pa.array(np.zeros(n, dtype=np.int32))
        cols = {
            "topic": pa.array([topic] * n, pa.string()),
            "queue_id": pa.array(np.full(n, queue_id, dtype=np.int32)),
            "uniq_key": pa.array(uniq_keys, pa.string()),
            "tags": pa.array(tags, pa.string()),
            "tags_code": pa.array(_tags_codes(tags), pa.int64()),
            "keys": pa.array(keys, pa.list_(pa.string())) if keys is not None else _empty_lists(n),
            "properties": (
                pa.array(properties, pa.map_(pa.string(), pa.string()))
                if properties is not None
                else _empty_maps(n)
            ),
            "body": body_array,
            "size": sizes.cast(pa.int32()),
            "born_ts_ms": pa.array(np.full(n, born_ts_ms, dtype=np.int64)),
            "sys_flag": zeros,
            "delay_level": zeros,
            "deliver_at_ms": pa.nulls(n, pa.int64()),
            "reconsume_times": zeros,
        }
        return cls(
            _offset_free_table(cols), [topic] * n, [queue_id] * n, [True] * n, uniq_keys, born_ts_ms == 0
        )

    @classmethod
    def plain(
        cls,
        topics: pa.Array | pa.ChunkedArray,
        queue_ids: np.ndarray,
        bodies: pa.Array | pa.ChunkedArray,
        uniq_keys: list[str],
        tags: pa.Array | pa.ChunkedArray,
        born_ts_ms: pa.Array | pa.ChunkedArray,
    ) -> PendingBatch:
        """Plain messages (no keys, no properties, no delay) of any topics and queues, from columns
        already checked: nothing per row in Python but the lists the stamping keeps."""
        n = len(bodies)
        topic_list = topics.to_pylist()
        distinct = pc.unique(topics)
        header = pa.array([record_size(t, 0, _NO_PROPERTIES) for t in distinct.to_pylist()], pa.int64())
        sizes = pc.add(pc.take(header, pc.index_in(topics, value_set=distinct)), pc.binary_length(bodies))
        distinct_tags = pc.unique(tags)
        codes = pa.array([tags_code(t) for t in distinct_tags.to_pylist()], pa.int64())
        zeros = pa.array(np.zeros(n, dtype=np.int32))
        cols = {
            "topic": topics,
            "queue_id": pa.array(queue_ids.astype(np.int32)),
            "uniq_key": pa.array(uniq_keys, pa.string()),
            "tags": tags,
            "tags_code": pc.take(codes, pc.index_in(tags, value_set=distinct_tags)),
            "keys": _empty_lists(n),
            "properties": _empty_maps(n),
            "body": bodies,
            "size": sizes.cast(pa.int32()),
            "born_ts_ms": born_ts_ms,
            "sys_flag": zeros,
            "delay_level": zeros,
            "deliver_at_ms": pa.nulls(n, pa.int64()),
            "reconsume_times": zeros,
        }
        born_unset = bool(pc.any(pc.equal(born_ts_ms, 0)).as_py()) if n else False
        return cls(
            _offset_free_table(cols), topic_list, queue_ids.tolist(), [True] * n, uniq_keys, born_unset
        )

    @classmethod
    def from_columns(cls, columns: pa.Table) -> PendingBatch:
        """A batch from its offset-free columns (``PendingBatch.columns`` as staged elsewhere).

        Raises:
            StoreError: the table is not in the offset-free commit-log schema.
        """
        if not columns.schema.equals(_OFFSET_FREE_SCHEMA):
            raise StoreError(
                "staged rows are not in the commit log's offset-free schema", schema=str(columns.schema)
            )
        flags = columns["sys_flag"].to_pylist()
        born_unset = bool(pc.any(pc.equal(columns["born_ts_ms"], 0)).as_py()) if columns.num_rows else False
        return cls(
            columns,
            columns["topic"].to_pylist(),
            columns["queue_id"].to_pylist(),
            [f not in UNDISPATCHED_FLAGS for f in flags],
            columns["uniq_key"].to_pylist(),
            born_unset,
        )


ROW_BATCH_ROWS = 256
"""A batch of at most this many messages given one by one is stamped row-wise (:class:`PendingBatch`):
one conversion of the rows costs less than the columns up to about a thousand rows (1 KiB bodies),
and the columns are kept for bigger ones, which a lost race may stamp again."""


def _transposed(messages: Sequence[PendingMessage]) -> list[list[Any]]:
    """The messages' fields as columns, in :class:`PendingMessage` order (one transposition instead
    of a pass over the messages per column)."""
    return [list(column) for column in zip(*messages, strict=True)]


def _sizes(topics: list[str], bodies: list[bytes], props: list[Mapping[str, str]]) -> list[int]:
    """Each message's stored size (:func:`~engine.protocol.record_size`)."""
    header = {t: record_size(t, 0, _NO_PROPERTIES) for t in set(topics)}
    if not any(props):
        return [header[t] + len(b) for t, b in zip(topics, bodies, strict=True)]
    sized = RecordSizes()  # a client's batch shares one properties mapping: encoded once
    return [
        sized(t, len(b), p) if p else header[t] + len(b)
        for t, b, p in zip(topics, bodies, props, strict=True)
    ]


def _pairs(props: list[Mapping[str, str]]) -> list[list[tuple[str, str]]]:
    """Each mapping's items (a mapping several messages share listed once)."""
    pairs: dict[int, list[tuple[str, str]]] = {}
    return [pairs.get(id(p)) or pairs.setdefault(id(p), list(p.items())) for p in props]


def _columns(columns: list[list[Any]], sizes: list[int]) -> dict[str, pa.Array]:
    """The offset-free commit-log columns of messages transposed by :func:`_transposed`."""
    (topics, qids, bodies, uniq, tags, keys, props, born, flags, levels, deliver, reconsume, codes) = columns
    n = len(topics)
    return {
        "topic": pa.array(topics, pa.string()),
        "queue_id": pa.array(qids, pa.int32()),
        "uniq_key": pa.array(uniq, pa.string()),
        "tags": pa.array(tags, pa.string()),
        "tags_code": pa.array(_tags_codes(tags, codes), pa.int64()),
        "keys": pa.array(keys, pa.list_(pa.string())) if any(keys) else _empty_lists(n),
        "properties": (
            pa.array(_pairs(props), pa.map_(pa.string(), pa.string())) if any(props) else _empty_maps(n)
        ),
        "body": pa.array(bodies, pa.binary()),
        "size": pa.array(sizes, pa.int32()),
        "born_ts_ms": pa.array(born, pa.int64()),
        "sys_flag": pa.array(flags, pa.int32()),
        "delay_level": pa.array(levels, pa.int32()),
        "deliver_at_ms": pa.array(deliver, pa.int64()),
        "reconsume_times": pa.array(reconsume, pa.int32()),
    }


def _offset_free_table(cols: dict[str, pa.Array]) -> pa.Table:
    return pa.Table.from_arrays([cols[f.name] for f in _OFFSET_FREE], schema=_OFFSET_FREE_SCHEMA)


COLUMNAR_OFFSETS_ROWS = 32
"""Batches of more rows spread over several queues get their queue offsets column-wise; fewer rows
in a loop (the columns cost about 100 us whatever the rows: more than a loop over a few)."""


def stamp(
    messages: Sequence[PendingMessage] | PendingBatch, hwm: HighWaterMarks, store_id: str, ts_ms: int
) -> tuple[pa.Table, StampedBatch, MarksDelta]:
    """Give each message its offsets, in order; returns the rows, the results and what the commit
    changes in the marks.

    Pure (``hwm`` is only read): the caller commits the rows and applies the change to its marks
    only if the commit wins. Columnar, and independent of the number of queues the marks know: this
    is the produce hot path.
    """
    batch = messages if isinstance(messages, PendingBatch) else PendingBatch.of(messages)
    store_ts = max(ts_ms, hwm.store_ts_ms)
    n = batch.num_rows
    rowwise = batch.offset_free is None
    if rowwise:
        physical_list = list(itertools.accumulate(batch.sizes, initial=hwm.physical))
        next_physical = physical_list.pop()
    else:
        sizes = batch.columns["size"].to_numpy().astype(np.int64)
        physical = np.empty(n, dtype=np.int64)
        next_physical = hwm.physical
        if n:
            np.cumsum(sizes, out=physical)
            physical -= sizes
            physical += hwm.physical
            next_physical += int(sizes.sum())
        physical_list = physical.tolist()
    changed: dict[str, dict[int, int]] = {}
    topics, qids = batch.topics, batch.queue_ids
    if n and all(batch.dispatched) and topics.count(topics[0]) == n and qids.count(qids[0]) == n:
        first = hwm.next_queue_offset(topics[0], qids[0])
        changed[topics[0]] = {qids[0]: first + n}
        queue_offsets: list[int] = list(range(first, first + n))
    elif n > COLUMNAR_OFFSETS_ROWS and not rowwise and all(batch.dispatched):
        queue_offsets = _queue_offsets(batch, hwm, changed).tolist()
    else:  # few rows, or a batch kept row-wise (a group commit of sends): a loop, no columns
        queue_offsets = []
        for topic, qid, dispatched in zip(topics, qids, batch.dispatched, strict=True):
            if not dispatched:
                queue_offsets.append(-1)
                continue
            mine = changed.setdefault(topic, {})
            offset = mine.get(qid)
            if offset is None:
                offset = hwm.next_queue_offset(topic, qid)
            queue_offsets.append(offset)
            mine[qid] = offset + 1
        changed = {t: qs for t, qs in changed.items() if qs}
    delta = MarksDelta(next_physical, store_ts, changed)
    prefix = store_id.upper()
    msg_ids = [f"{prefix}{p:016X}" for p in physical_list]
    if rowwise:
        table = _stamped_rows(batch, physical_list, queue_offsets, msg_ids, store_ts)
    else:
        cols = batch.columns
        born = cols["born_ts_ms"]
        if batch.born_unset:
            born = pc.if_else(pc.equal(born, 0), store_ts, born)
        arrays = {
            "physical_offset": pa.array(physical),
            "queue_offset": pa.array(queue_offsets, pa.int64()),
            "msg_id": pa.array(msg_ids, pa.string()),
            "store_ts_ms": pa.array(np.full(n, store_ts, dtype=np.int64)),
            "born_ts_ms": born,
        }
        table = pa.Table.from_arrays(
            [arrays[name] if name in arrays else cols[name] for name in schemas.COMMIT_LOG_SCHEMA.names],
            schema=schemas.COMMIT_LOG_SCHEMA,
        )
    results = StampedBatch(msg_ids, batch.uniq_keys, topics, qids, queue_offsets, physical_list, store_ts)
    return table, results, delta


_ROW_TYPE = pa.struct(list(schemas.COMMIT_LOG_SCHEMA))


def _stamped_rows(
    batch: PendingBatch, physical: list[int], queue_offsets: list[int], msg_ids: list[str], store_ts: int
) -> pa.Table:
    """The commit-log rows of a batch kept row-wise, with their offsets: one conversion."""
    messages = batch.rows
    listed = _pairs([m.properties for m in messages])
    codes = _tags_codes([m.tags for m in messages], [m.tags_code for m in messages])
    rows = []
    for m, p, q, msg_id, size, pairs, code in zip(
        messages, physical, queue_offsets, msg_ids, batch.sizes, listed, codes, strict=True
    ):
        rows.append(
            (
                p,
                m.topic,
                m.queue_id,
                q,
                msg_id,
                m.uniq_key,
                m.tags,
                code,
                m.keys,
                pairs,
                m.body,
                size,
                m.born_ts_ms or store_ts,
                store_ts,
                m.sys_flag,
                m.delay_level,
                m.deliver_at_ms,
                m.reconsume_times,
            )
        )
    return pa.Table.from_batches([pa.RecordBatch.from_struct_array(pa.array(rows, _ROW_TYPE))])


def _queue_offsets(
    batch: PendingBatch, hwm: HighWaterMarks, changed: dict[str, dict[int, int]]
) -> np.ndarray:
    """Queue offsets of a batch whose messages are all dispatched, in input order, column-wise
    (the rows of each queue get consecutive offsets in input order, from its next offset in
    ``hwm``); records each queue's next offset after the batch in ``changed``."""
    topic_column = batch.columns["topic"].combine_chunks()
    encoded = pc.dictionary_encode(topic_column)
    names = encoded.dictionary.to_pylist()
    topic_ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    qids = np.asarray(batch.queue_ids, dtype=np.int64)
    width = int(qids.max()) + 1
    key = topic_ids * width + qids
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    rank = np.empty(len(key), dtype=np.int64)
    rank[order] = np.arange(len(key)) - np.searchsorted(ordered, ordered, side="left")
    groups, counts = np.unique(key, return_counts=True)
    base = np.empty(len(groups), dtype=np.int64)
    for i, (group, count) in enumerate(zip(groups.tolist(), counts.tolist(), strict=True)):
        topic, qid = names[group // width], group % width
        base[i] = hwm.next_queue_offset(topic, qid)
        changed.setdefault(topic, {})[qid] = int(base[i]) + count
    offsets_out: np.ndarray = base[np.searchsorted(groups, key)] + rank
    return offsets_out


@dataclass(frozen=True)
class StampedBatch:
    """Offsets given to a batch, in columns and input order; ``version`` is the commit's (-1 until
    it is known). Cheaper than a :class:`Stamped` per message where a batch is turned into results."""

    msg_ids: list[str]
    uniq_keys: list[str]
    topics: list[str]
    queue_ids: list[int]
    queue_offsets: list[int]
    physical: list[int]
    store_ts_ms: int
    version: int = -1

    def __len__(self) -> int:
        return len(self.msg_ids)

    def rows(self) -> list[Stamped]:
        ts, version = self.store_ts_ms, self.version
        return [
            Stamped(m, u, t, q, o, p, ts, version)
            for m, u, t, q, o, p in zip(
                self.msg_ids,
                self.uniq_keys,
                self.topics,
                self.queue_ids,
                self.queue_offsets,
                self.physical,
                strict=True,
            )
        ]


NOTHING = StampedBatch([], [], [], [], [], [], 0)
