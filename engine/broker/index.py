"""The message index: commit-log rows -> ``index`` rows (key -> message), exactly once per version.

As RocketMQ's IndexService, every stored message is indexed under ``topic#key`` for each of its keys
(kind ``KEY``) and under ``topic#uniq_key`` (kind ``UNIQ_KEY``); transaction halves and rolled-back
messages are not (they are not messages a consumer can see). An index row points at the message's
physical offset, so a lookup ends with a point read of the commit log.

Exactly once: every ``index`` commit carries a Delta app transaction (app id :data:`INDEX_APP`,
version = the last commit-log version it covers) and is made on a private snapshot with automatic
retries disabled. Rows of versions already covered are dropped before writing, so a replayed or
restarted micro-batch, or a second indexer racing this one, adds nothing.

Layout for lookups without a scan: each commit writes one file per kind, sorted by ``(topic, key,
store_ts_ms)`` in small row groups. Delta's per-file min/max statistics on ``topic``, ``key`` and
``store_ts_ms`` (the table indexes all its columns) let a lookup skip files, and the parquet
row-group statistics let it read only the row groups whose key range holds the key. Kinds go to
separate files because their keys do not mix well: business keys are arbitrary text, while the uniq
keys of one batch share a producer prefix and a time, so a UNIQ_KEY file covers a narrow key range
that a uniq-key lookup can skip.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from engine.errors import CommitConflictError, StoreError
from engine.model import UNDISPATCHED_FLAGS
from engine.protocol.index_keys import KIND_KEY, KIND_UNIQ_KEY
from engine.store import schemas
from engine.store.log import VERSION_COLUMN, read_versions, table_filesystem
from engine.store.store import Store, now_ms

INDEX_APP = "mq.index"
# What the indexer reads from a commit-log row; bodies stay on disk.
INDEX_SOURCE_COLUMNS = (
    "topic",
    "queue_id",
    "queue_offset",
    "physical_offset",
    "uniq_key",
    "keys",
    "store_ts_ms",
    "sys_flag",
)
INDEX_SOURCE_SCHEMA = pa.schema([schemas.COMMIT_LOG_SCHEMA.field(c) for c in INDEX_SOURCE_COLUMNS])
# The order index rows are written in: a file per kind, a lookup's key in few row groups.
INDEX_SORT = ("kind", "topic", "key", "store_ts_ms", "physical_offset")
INDEX_ROW_GROUP_ROWS = 1024


def indexed_version(store: Store, handle: DeltaTable | None = None) -> int:
    """Last commit-log version whose messages are in the index (-1 before any)."""
    dt = handle if handle is not None else store.table(schemas.INDEX)
    version = dt.transaction_version(INDEX_APP)
    return -1 if version is None else int(version)


def index_rows(rows: pa.Table, after_version: int = -1) -> tuple[pa.Table, int]:
    """Index rows for the commit-log ``rows`` (carrying ``_version``) of versions > ``after_version``.

    Pure. Returns the rows, sorted by :data:`INDEX_SORT` with duplicates removed, and the last
    commit-log version they cover (``after_version`` when ``rows`` holds no newer version).
    """
    rows = rows.filter(pc.greater(rows[VERSION_COLUMN], after_version))
    if rows.num_rows == 0:
        return schemas.INDEX_SCHEMA.empty_table(), after_version
    covered = int(pc.max(rows[VERSION_COLUMN]).as_py())
    flags = pa.array(sorted(UNDISPATCHED_FLAGS), pa.int32())
    rows = rows.filter(pc.invert(pc.is_in(rows["sys_flag"], value_set=flags)))
    parts = []
    if rows.num_rows:
        # One row per (message, key): flatten the keys and repeat the message's columns for each.
        keys = rows["keys"].combine_chunks()
        flat = pc.list_flatten(keys)
        parents = pc.list_parent_indices(keys)
        owners = rows.take(parents)
        parts.append(_entries(owners, flat, KIND_KEY))
        parts.append(_entries(rows, rows["uniq_key"], KIND_UNIQ_KEY))
    table = pa.concat_tables(parts) if parts else schemas.INDEX_SCHEMA.empty_table()
    table = table.filter(pc.and_(pc.is_valid(table["key"]), pc.not_equal(table["key"], "")))
    if table.num_rows:
        # A message listing a key twice is indexed once under it.
        table = table.group_by(schemas.INDEX_SCHEMA.names, use_threads=False).aggregate([])
        table = table.select(schemas.INDEX_SCHEMA.names).cast(schemas.INDEX_SCHEMA)
        table = table.sort_by([(c, "ascending") for c in INDEX_SORT])
    return table, covered


def _entries(rows: pa.Table, keys: pa.Array | pa.ChunkedArray, kind: str) -> pa.Table:
    n = rows.num_rows
    return pa.table(
        {
            "topic": rows["topic"],
            "kind": pa.array([kind] * n, pa.string()),
            "key": keys,
            "physical_offset": rows["physical_offset"],
            "queue_id": rows["queue_id"],
            "queue_offset": rows["queue_offset"],
            "store_ts_ms": rows["store_ts_ms"],
            "log_version": rows[VERSION_COLUMN],
        },
        schema=schemas.INDEX_SCHEMA,
    )


def _file_stats(rows: pa.Table) -> str:
    """Delta add-action statistics of an index file (every column of the index is a plain value)."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in rows.column_names:
        col = rows[name]
        nulls[name] = int(col.null_count)
        if col.null_count < len(col):
            bounds = pc.min_max(col)
            mins[name], maxs[name] = bounds["min"].as_py(), bounds["max"].as_py()
    return json.dumps(
        {"numRecords": rows.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )


def _write_files(fs: pa_fs.FileSystem, entries: pa.Table) -> list[AddAction]:
    """One parquet file per kind in the table directory; their add actions (not committed yet)."""
    adds: list[AddAction] = []
    try:
        for kind in (KIND_KEY, KIND_UNIQ_KEY):
            rows = entries.filter(pc.equal(entries["kind"], kind))
            if rows.num_rows == 0:
                continue
            path = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            pq.write_table(
                rows, path, filesystem=fs, compression="snappy", row_group_size=INDEX_ROW_GROUP_ROWS
            )
            size = int(fs.get_file_info(path).size)
            adds.append(AddAction(path, size, {}, now_ms(), True, _file_stats(rows)))
    except OSError as exc:
        _delete(fs, [a.path for a in adds])
        raise StoreError(f"cannot write index files: {exc}", table=schemas.INDEX, cause=exc) from exc
    return adds


def _delete(fs: pa_fs.FileSystem, paths: list[str]) -> None:
    for path in paths:  # best effort: vacuum removes what is left
        with contextlib.suppress(OSError):
            fs.delete_file(path)


def _commit(store: Store, dt: DeltaTable, entries: pa.Table, covered: int) -> None:
    """Commit ``entries`` and the covered version as exactly the next version of ``dt``, or fail."""
    props = CommitProperties(max_commit_retries=0, app_transactions=[Transaction(INDEX_APP, covered)])
    fs = table_filesystem(store.uri(schemas.INDEX), store.storage_options)
    adds = _write_files(fs, entries) if entries.num_rows else []
    try:
        if adds:
            dt.create_write_transaction(
                list[AddAction | RemoveAction](adds), "append", dt.schema(), commit_properties=props
            )
        else:  # nothing to index in these versions: the covered version still moves on
            write_deltalake(dt, schemas.INDEX_SCHEMA.empty_table(), mode="append", commit_properties=props)
    except CommitFailedError as exc:
        _delete(fs, [a.path for a in adds])  # the commit did not happen: its files are garbage
        raise CommitConflictError(
            f"index commit conflicted with a concurrent writer: {exc}", table=schemas.INDEX, cause=exc
        ) from exc
    except (DeltaError, OSError) as exc:
        # The outcome is unknown, so the files stay (vacuum removes them if unreferenced); a retry is
        # safe: it finds the covered version if the commit happened.
        raise StoreError(f"write to index failed: {exc}", table=schemas.INDEX, cause=exc) from exc


def build_index(store: Store, rows: pa.Table, attempts: int = 8) -> int:
    """Append index rows for commit-log ``rows`` carrying ``_version``; returns the rows added.

    Idempotent per commit-log version: called twice with the same rows, it adds them once. Safe
    against a concurrent indexer (the losing commit re-reads the covered version and drops what the
    winner wrote). Versions that hold nothing to index still move the covered version on.

    Args:
        store: the store.
        rows: commit-log rows with at least :data:`INDEX_SOURCE_COLUMNS` and ``_version``.
        attempts: races to lose before giving up.

    Raises:
        StoreError: a write failure (nothing was committed).
        CommitConflictError: lost ``attempts`` races in a row (retryable).
    """
    missing = [c for c in (*INDEX_SOURCE_COLUMNS, VERSION_COLUMN) if c not in rows.column_names]
    if missing:
        raise StoreError(f"build_index needs commit-log columns {missing}", columns=missing)
    for _ in range(attempts):
        # A private snapshot: what is written is decided from exactly the version it commits after.
        dt = store.open_table(schemas.INDEX)
        last = indexed_version(store, dt)
        entries, covered = index_rows(rows, last)
        if covered <= last:
            return 0
        try:
            _commit(store, dt, entries, covered)
        except CommitConflictError:
            continue
        return int(entries.num_rows)
    raise CommitConflictError("the indexer lost every race for the index table", table=schemas.INDEX)


def unindexed_rows(store: Store, first: int, last: int) -> pa.Table:
    """Commit-log rows of versions ``first..last`` with the columns the indexer needs."""
    if last < first:
        return INDEX_SOURCE_SCHEMA.append(pa.field(VERSION_COLUMN, pa.int64())).empty_table()
    return read_versions(
        store.uri(schemas.COMMIT_LOG), first, last, INDEX_SOURCE_SCHEMA, store.storage_options
    )


def index_pending(store: Store, max_versions: int = 1000) -> int:
    """Index every committed commit-log version not indexed yet, without Spark.

    The Spark index job (``jobs/index.py``) is the production path; this is the same logic for tools,
    notebooks and tests. Returns the number of index rows added.
    """
    total = 0
    latest = store.version(schemas.COMMIT_LOG)
    start = indexed_version(store) + 1
    while start <= latest:
        end = min(latest, start + max_versions - 1)
        total += build_index(store, unindexed_rows(store, start, end))
        start = end + 1
    return total
