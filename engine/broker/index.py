"""The message index: commit-log rows -> ``index`` rows (key -> message), exactly once per version.

As RocketMQ's IndexService, every stored message is indexed under ``topic#key`` for each of its keys
(kind ``KEY``) and under ``topic#uniq_key`` (kind ``UNIQ_KEY``); transaction halves and rolled-back
messages are not (they are not messages a consumer can see). An index row points at the message's
physical offset, so a lookup ends with a point read of the commit log. The table's layout for
lookups without a scan is :mod:`engine.store.index`'s.

Exactly once: every ``index`` commit records the last commit-log version it covers and is made on a
private snapshot with automatic retries disabled. Rows of versions already covered are dropped
before writing, so a replayed or restarted micro-batch, or a second indexer racing this one, adds
nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import CommitConflictError, StoreError
from engine.store import schemas
from engine.store.commit_markers import index_app
from engine.store.delta import VERSION_COLUMN, FollowedLog, Snapshot, read_versions
from engine.store.index import (
    INDEX_SORT,
    KIND_KEY,
    KIND_UNIQ_KEY,
    commit_index,
    commit_index_directly,
    covered_version,
    follow_index,
)
from engine.store.queue_entries import visible_rows_after
from engine.store.store import Store

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


def index_rows(rows: pa.Table, after_version: int = -1) -> tuple[pa.Table, int]:
    """Index rows for the commit-log ``rows`` (carrying ``_version``) of versions > ``after_version``.

    Pure. Returns the rows, sorted by :data:`INDEX_SORT` with duplicates removed, and the last
    commit-log version they cover (``after_version`` when ``rows`` holds no newer version).
    """
    rows, covered = visible_rows_after(rows, after_version)
    if covered == after_version:
        return schemas.INDEX_SCHEMA.empty_table(), after_version
    # One chunk: what follows costs per chunk of its input, and the rows of each version read are one.
    rows = rows.combine_chunks()
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


def build_index(
    store: Store,
    rows: pa.Table,
    attempts: int = 8,
    *,
    shard: int = 0,
    snapshot: Callable[[], Snapshot] | None = None,
) -> int:
    """Append index rows for ``rows`` of commit-log shard ``shard`` carrying ``_version``; returns
    the rows added.

    Idempotent per commit-log version: called twice with the same rows, it adds them once. Safe
    against a concurrent indexer (the losing commit re-reads the covered version and drops what the
    winner wrote). Versions that hold nothing to index still move the covered version on.

    Args:
        store: the store.
        rows: commit-log rows with at least :data:`INDEX_SOURCE_COLUMNS` and ``_version``.
        attempts: races to lose before giving up.
        snapshot: gives the caller's own private snapshot of the index caught up to the latest
            version (default: a new one for every attempt).

    Raises:
        StoreError: a write failure (nothing was committed).
        CommitConflictError: lost ``attempts`` races in a row (retryable).
    """
    missing = [c for c in (*INDEX_SOURCE_COLUMNS, VERSION_COLUMN) if c not in rows.column_names]
    if missing:
        raise StoreError(f"build_index needs commit-log columns {missing}", columns=missing)
    for _ in range(attempts):
        # A private snapshot: what is written is decided from exactly the version it commits after.
        index = store.snapshot(schemas.INDEX) if snapshot is None else snapshot()
        last = covered_version(index, shard)
        entries, covered = index_rows(rows, last)
        if covered <= last:
            return 0
        try:
            commit_index(store, index, entries, covered, shard)
        except CommitConflictError:
            continue
        return int(entries.num_rows)
    raise CommitConflictError("the indexer lost every race for the index table", table=schemas.INDEX)


def unindexed_rows(store: Store, first: int, last: int, shard: int = 0) -> pa.Table:
    """Rows of versions ``first..last`` of commit-log shard ``shard`` with the columns the indexer
    needs."""
    if last < first:
        return INDEX_SOURCE_SCHEMA.append(pa.field(VERSION_COLUMN, pa.int64())).empty_table()
    return read_versions(
        store.uri(schemas.commit_log_table(shard)), first, last, INDEX_SOURCE_SCHEMA, store.storage_options
    )


class Indexer:
    """:func:`index_pending` as a pass of the broker loop.

    On a local store it commits directly (:func:`~engine.store.index.commit_index_directly`),
    following the index table through its commit files: through delta-rs, a commit and the catch-up
    of the indexer's handle to it were two thirds of the broker process's CPU under steady batched
    sends (py-spy of ``mq serve``'s broker process, 2026-12-01), far more than the indexing itself.
    Elsewhere it keeps one private snapshot of the index between passes and catches it up at each
    (opening one for every commit, and moving the shared one to learn the indexed versions, cost
    more still); it is opened anew once aged (:attr:`~engine.store.delta.Snapshot.aged`). Both are
    dropped after a pass that failed.

    Args:
        store: the store.
        max_versions: commit-log versions indexed in one commit at most.
    """

    def __init__(self, store: Store, max_versions: int = 1000) -> None:
        self._store = store
        self._max_versions = max_versions
        self._snapshot: Snapshot | None = None
        self._log: FollowedLog | None = None
        self._direct = True  # until the index table is found to take delta-rs commits only

    def _caught_up(self) -> Snapshot:
        kept = self._snapshot
        if kept is not None and kept.aged:
            kept = None  # a handle that moved on far gets slower at every commit: open it anew
        self._snapshot = self._store.caught_up(schemas.INDEX, kept)
        return self._snapshot

    def _followed(self) -> FollowedLog | None:
        """The index table followed to its newest version, or None where commits go through
        delta-rs."""
        if self._log is not None and self._log.follow() is None:
            self._log = None  # the table changed under it, or its log was cleaned past it
        if self._log is None and self._direct:
            self._log = follow_index(self._store)
            self._direct = self._log is not None
        return self._log

    def __call__(self) -> int:
        """Index every committed commit-log version not indexed yet (of every shard); the number of
        index rows added.

        Raises:
            StoreError, CommitConflictError: as :func:`build_index`.
        """
        store, added = self._store, 0
        try:
            for shard, table in enumerate(store.commit_logs):
                log = self._followed()
                covered = (
                    covered_version(self._caught_up(), shard)
                    if log is None
                    else log.app_version(index_app(shard))
                )
                chunks = store.versions_after(
                    table, covered, INDEX_SOURCE_SCHEMA, max_versions=self._max_versions
                )
                for rows, _ in chunks:
                    if self._direct:
                        added += self._index_directly(rows, shard)
                    else:
                        added += build_index(store, rows, shard=shard, snapshot=self._caught_up)
        except Exception:
            self._snapshot = self._log = None
            raise
        return added

    def _index_directly(self, rows: pa.Table, shard: int, attempts: int = 8) -> int:
        """:func:`build_index` of ``rows`` through the followed log; the rows added."""
        for _ in range(attempts):
            log = self._followed()
            if log is None:  # the table now takes delta-rs commits only
                return build_index(self._store, rows, shard=shard, snapshot=self._caught_up)
            last = log.app_version(index_app(shard))
            entries, covered = index_rows(rows, last)
            if covered <= last:
                return 0
            try:
                if commit_index_directly(log, entries, covered, shard) is None:
                    self._log = None  # not followed any further: follow it anew and plan again
                    continue
            except CommitConflictError:
                continue  # another indexer covered the shard first: plan again from what it covered
            return int(entries.num_rows)
        raise CommitConflictError("the indexer lost every race for the index table", table=schemas.INDEX)


def index_pending(store: Store, max_versions: int = 1000) -> int:
    """Index every committed commit-log version not indexed yet (of every shard), without Spark.

    The Spark index job (``jobs/index.py``) is the production path; this is the same logic for tools,
    notebooks and tests (the broker loop keeps an :class:`Indexer`). Returns the number of index
    rows added.
    """
    return Indexer(store, max_versions)()
