"""Commit-log I/O across shards for the system jobs: a writer per shard, and rows read by offset.

A queue lives in one shard (:func:`~engine.protocol.shards.shard_of_queue`) and a physical offset
names its shard (:func:`~engine.protocol.shards.shard_of_offset`), so a job that re-puts messages
(schedule, retry, transaction decisions) appends each message through the writer of its queue's
shard, and a job that looks a message up by physical offset reads that offset's shard. With one
shard both are exactly what a single :class:`CommitLogWriter` and the consume queue's
:meth:`~engine.store.consume_queue.QueueIndex.messages` do.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engine.errors import StoreError
from engine.protocol.shards import shard_of_offset, shard_of_queue
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.consume_queue import QueueIndex
from engine.store.store import Store


class ShardWriters:
    """One :class:`CommitLogWriter` per commit-log shard of a store, each made on first use.

    Thread-safe. A job keeps one (as it kept one writer before shards).

    Args:
        store: the store.
        first: an existing writer to use for its shard (e.g. a producer's own).
    """

    def __init__(self, store: Store, *, first: CommitLogWriter | None = None) -> None:
        self._store = store
        self._writers: dict[int, CommitLogWriter] = {} if first is None else {first.shard: first}
        self._lock = threading.Lock()

    @property
    def shards(self) -> int:
        """The store's number of commit-log shards."""
        return self._store.commit_log_shards

    def for_shard(self, shard: int) -> CommitLogWriter:
        """The writer of ``shard``.

        Raises:
            InvalidArgumentError: ``shard`` is not one of the store's shards.
        """
        with self._lock:
            writer = self._writers.get(shard)
            if writer is None:
                writer = self._writers[shard] = CommitLogWriter(self._store, shard=shard)
            return writer

    def shard_of(self, topic: str, queue_id: int) -> int:
        """The shard holding queue ``queue_id`` of ``topic`` in this store."""
        return shard_of_queue(topic, queue_id, self._store.commit_log_shards)

    def for_queue(self, topic: str, queue_id: int) -> CommitLogWriter:
        """The writer of the shard holding queue ``queue_id`` of ``topic``."""
        return self.for_shard(self.shard_of(topic, queue_id))


_SHARED: weakref.WeakKeyDictionary[Store, ShardWriters] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shard_writers(store: Store) -> ShardWriters:
    """The per-shard writers this process shares for ``store`` (for callers that hold no
    :class:`ShardWriters` of their own)."""
    with _SHARED_LOCK:
        writers = _SHARED.get(store)
        if writers is None:
            writers = _SHARED[store] = ShardWriters(store)
        return writers


def messages_at(store: Store, index: QueueIndex, physical_offsets: Sequence[int]) -> pa.Table:
    """Commit-log rows at the given physical offsets, each read from its offset's shard, in the
    order asked (as :meth:`QueueIndex.messages`, which serves shard 0).

    Raises:
        StoreError: some offsets have no readable row (wrong offset, a shard the store does not
            have, retention); ``offsets`` lists them.
    """
    schema = schemas.COMMIT_LOG_SCHEMA
    if not physical_offsets:
        return schema.empty_table()
    if store.commit_log_shards == 1:
        return index.messages(list(physical_offsets))
    wanted = np.asarray(physical_offsets, dtype=np.int64)
    by_shard: dict[int, list[int]] = {}
    for po in np.unique(wanted).tolist():
        by_shard.setdefault(shard_of_offset(int(po)) if po >= 0 else -1, []).append(int(po))
    parts: list[pa.Table] = []
    missing: list[int] = []
    for shard, offsets in sorted(by_shard.items()):
        if not 0 <= shard < store.commit_log_shards:
            missing.extend(offsets)
            continue
        if shard == 0:
            try:
                parts.append(index.messages(offsets))
            except StoreError as exc:
                gone = set(getattr(exc, "offsets", None) or ())
                if not gone:
                    raise
                missing.extend(gone)
                kept = [p for p in offsets if p not in gone]
                if kept:
                    parts.append(index.messages(kept))
            continue
        table = store.read(
            schemas.commit_log_table(shard),
            predicate=f"physical_offset >= {offsets[0]} AND physical_offset <= {offsets[-1]}",
            filter=ds.field("physical_offset").isin(offsets),
        )
        found = set(table["physical_offset"].to_pylist())
        missing.extend(p for p in offsets if p not in found)
        parts.append(table.select(schema.names).cast(schema))
    if missing:
        raise StoreError(
            f"commit-log offsets that are not readable in their shards: {sorted(missing)[:5]}",
            offsets=sorted(missing),
        )
    table = pa.concat_tables(parts)
    return table.take(pc.index_in(pa.array(wanted), value_set=table["physical_offset"]))
