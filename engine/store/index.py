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
    Snapshot,
    app_transactions,
    commit_next,
    delete_files,
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
        for kind in (KIND_KEY, KIND_UNIQ_KEY):
            rows = entries.filter(pc.equal(entries["kind"], kind))
            if rows.num_rows:
                adds.append(
                    write_file(fs, rows, "SNAPPY", INDEX_ROW_GROUP_ROWS, _EVERY_COLUMN, data_change=True)
                )
    except StoreError:
        delete_files(fs, [a.path for a in adds])
        raise
    try:
        # Without files (nothing to index in these versions) the covered version still moves on.
        commit_next(snapshot, actions=adds, transactions=app_transactions({index_app(shard): covered}))
    except CommitConflictError:
        delete_files(fs, [a.path for a in adds])  # the commit did not happen: its files are garbage
        raise
