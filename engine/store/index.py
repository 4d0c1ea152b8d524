"""The ``index`` table: lookup keys (message key, unique key) -> message, laid out for point lookups.

Each commit writes one file per kind (:data:`KIND_KEY`, :data:`KIND_UNIQ_KEY`), sorted by
:data:`INDEX_SORT` in small row groups. Delta's per-file min/max statistics on ``topic``, ``key`` and
``store_ts_ms`` (the table indexes all its columns) let a lookup skip files, and the parquet
row-group statistics let it read only the row groups whose key range holds the key. Kinds go to
separate files because their keys do not mix well: business keys are arbitrary text, while the uniq
keys of one batch share a producer prefix and a time, so a UNIQ_KEY file covers a narrow key range
that a uniq-key lookup can skip.

Every commit carries a Delta app transaction (:data:`~engine.store.commit_markers.INDEX_APP`,
version = the last commit-log version it covers; per shard in a store of several,
:func:`~engine.store.commit_markers.index_app`). What to index is decided by
:mod:`engine.broker.index`.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import CommitConflictError, StoreError
from engine.store import schemas
from engine.store.commit_markers import index_app
from engine.store.delta import (
    Action,
    FollowedLog,
    Snapshot,
    app_transactions,
    commit_next,
    delete_files,
    direct_append_enabled,
    follow_log,
    table_filesystem,
    write_file,
)
from engine.store.store import Store

# The kinds of lookup key a stored message is indexed under (as RocketMQ's IndexService: its
# business keys, and its client unique id).
KIND_KEY = "KEY"  # one row per business key of the message (``Message.keys``)
KIND_UNIQ_KEY = "UNIQ_KEY"  # one row for the client unique id (the id consumers see)
# The order index rows are written in: a file per kind, a lookup's key in few row groups.
INDEX_SORT = ("kind", "topic", "key", "store_ts_ms", "physical_offset")
INDEX_ROW_GROUP_ROWS = 1024
_EVERY_COLUMN = 1 << 30  # the index keeps statistics for all its (plain) columns


def indexed_version(store: Store, shard: int = 0) -> int:
    """Last version of commit-log shard ``shard`` whose messages are in the index, as of now (-1
    before any)."""
    return store.app_version(schemas.INDEX, index_app(shard))


def covered_version(snapshot: Snapshot, shard: int = 0) -> int:
    """Last version of commit-log shard ``shard`` indexed as of an index snapshot (-1 before any)."""
    return snapshot.app_version(index_app(shard))


def _by_kind(entries: pa.Table) -> list[pa.Table]:
    """The index rows of each kind present, kind by kind: a commit's files."""
    parts = (entries.filter(pc.equal(entries["kind"], kind)) for kind in (KIND_KEY, KIND_UNIQ_KEY))
    return [rows for rows in parts if rows.num_rows]


def commit_index_directly(log: FollowedLog, entries: pa.Table, covered: int, shard: int = 0) -> int | None:
    """:func:`commit_index` without delta-rs, through the indexer's own view of the local index
    table (:func:`follow_index`): the same files (one per kind) and app transaction, linked in at
    the version after the newest one ``log`` read. Returns that version, or None when the log can
    no longer be followed (nothing was committed: follow it anew, plan again).

    Raises:
        CommitConflictError: another indexer recorded the shard's covered version first (nothing
            was committed; the log has read it: plan again from ``log.app_version``).
        CommitStateUnknownError, StoreError: as :meth:`FollowedLog.commit`.
    """
    return log.commit(_by_kind(entries), index_app(shard), covered)


def follow_index(store: Store) -> FollowedLog | None:
    """The indexer's own view of the index table, followed through its commit files, for
    :func:`commit_index_directly`; None where commits go through delta-rs (an object store, a table
    that asks more than a blind append, ``MQ_DIRECT_APPEND=0``)."""
    if not direct_append_enabled():
        return None
    return follow_log(
        store.snapshot(schemas.INDEX),
        schemas.INDEX_SCHEMA,
        lambda version: store.snapshot(schemas.INDEX, version),
        row_group_rows=INDEX_ROW_GROUP_ROWS,
    )


def commit_index(store: Store, snapshot: Snapshot, entries: pa.Table, covered: int, shard: int = 0) -> None:
    """Commit ``entries`` (sorted by :data:`INDEX_SORT`) and the covered version of commit-log shard
    ``shard`` as exactly the version after ``snapshot``, or fail.

    Raises:
        CommitConflictError: another indexer committed first (nothing committed; its files deleted).
        StoreError: a write failed; the commit's outcome is unknown, so the files stay (vacuum removes
            them if unreferenced) and a retry is safe: it finds the covered version if it happened.
    """
    fs = table_filesystem(store.uri(schemas.INDEX), store.storage_options)
    adds: list[Action] = []
    try:
        for rows in _by_kind(entries):
            adds.append(write_file(fs, rows, "SNAPPY", INDEX_ROW_GROUP_ROWS, _EVERY_COLUMN, data_change=True))
    except StoreError:
        delete_files(fs, [a.path for a in adds])
        raise
    try:
        # Without files (nothing to index in these versions) the covered version still moves on.
        commit_next(snapshot, actions=adds, transactions=app_transactions({index_app(shard): covered}))
    except CommitConflictError:
        delete_files(fs, [a.path for a in adds])  # the commit did not happen: its files are garbage
        raise
