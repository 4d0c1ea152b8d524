"""Reads that span the commit-log shards: which table holds an offset, and rows of every shard.

A store created with ``commit_log_shards = N`` keeps N commit logs (``commit_log``, ``commit_log_1``,
…; see :mod:`engine.protocol.shards`). A physical offset names its shard, so a point read goes to one
table; a read by anything else (a uniq key, a time range) reads every shard and concatenates. With
one shard these are exactly the reads of ``commit_log``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.dataset as ds

from engine.errors import CommitTruncatedError, MessageNotFoundError, StoreError
from engine.protocol.shards import shard_of_offset
from engine.store import schemas
from engine.store.commit_log.hwm import read_hwm
from engine.store.commit_log.marks import HighWaterMarks, MarksDelta
from engine.store.commit_markers import HWM_KEY, MARKS_KEY
from engine.store.delta import MAX_WALK_BACK, probe_latest_version, read_version
from engine.store.store import Store


def commit_log_of_offset(store: Store, physical_offset: int) -> str:
    """The commit-log table that holds ``physical_offset`` (its shard's).

    Raises:
        InvalidArgumentError: a negative offset.
        MessageNotFoundError: the offset names a shard this store does not have.
    """
    shard = shard_of_offset(physical_offset)
    if shard >= store.commit_log_shards:
        raise MessageNotFoundError(
            f"physical offset {physical_offset} names commit-log shard {shard}; this store has "
            f"{store.commit_log_shards} shard(s)",
            physical_offset=physical_offset,
            shard=shard,
        )
    return schemas.commit_log_table(shard)


def log_end(store: Store, table: str) -> int:
    """Where commit-log ``table`` stores its next message: RocketMQ's ``CommitLog.getMaxOffset()``
    (0, or the shard's base, for an empty log).

    Read from the marks of its newest commit that carries them (a compaction's carries none), from
    the commit files: not from the table's file list, which delta-rs reads whole (on the bench
    machine a few milliseconds per thousand files, whether the handle is opened or moved on by one
    version). Where the newest commits tell nothing (an object store's log, one cleaned up past
    them, an empty one), the marks are read through the store's shared snapshot (:func:`read_hwm`).

    Raises:
        StoreError: the log cannot be read.
    """
    uri, options = store.uri(table), store.storage_options
    latest = probe_latest_version(uri, -1, options)
    if latest is not None:
        for version in range(latest, max(latest - MAX_WALK_BACK, -1), -1):
            try:
                info = read_version(uri, version, options).commit_info
            except CommitTruncatedError:
                raise
            except StoreError:
                break  # cleaned up after a checkpoint
            compact, full = info.get(MARKS_KEY), info.get(HWM_KEY)
            if isinstance(compact, str):
                return MarksDelta.from_compact_json(compact)[0].physical
            if isinstance(full, str):
                return HighWaterMarks.from_json(full).physical
    return read_hwm(store.shared(table)).physical


def offsets_by_shard(store: Store, physical_offsets: Iterable[int]) -> tuple[dict[int, list[int]], list[int]]:
    """Split offsets by the shard holding them: ``({shard: offsets}, offsets of no shard of the store)``.

    Raises:
        InvalidArgumentError: a negative offset.
    """
    by_shard: dict[int, list[int]] = defaultdict(list)
    foreign: list[int] = []
    for offset in physical_offsets:
        shard = shard_of_offset(int(offset))
        if shard < store.commit_log_shards:
            by_shard[shard].append(int(offset))
        else:
            foreign.append(int(offset))
    return dict(by_shard), foreign


def read_commit_logs(
    store: Store,
    *,
    predicate: str | None = None,
    filter: ds.Expression | None = None,
    columns: list[str] | None = None,
) -> pa.Table:
    """Rows of every commit-log shard (files pruned by ``predicate``, rows kept by ``filter``), shard
    0 first; each shard's rows in its own order (physical offsets differ between shards, so sort by
    ``physical_offset`` for one order)."""
    parts = [
        store.read(name, predicate=predicate, filter=filter, columns=columns) for name in store.commit_logs
    ]
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
