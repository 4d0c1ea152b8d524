"""Rewriting a Delta table's data files in place: the mechanics under compaction and retention.

What is here knows Delta and Parquet, not policy: reading and writing data files in a table's
directory with the add-action statistics delta-rs would write, and :func:`commit_planned`, the commit
loop every maintenance commit goes through. Which files
to rewrite, in which order and what to delete is decided by :mod:`engine.broker.compaction` and
:mod:`engine.broker.retention`.

Every commit made through :func:`commit_planned` follows the sequencer's rules:

- It is a delta-rs write transaction with automatic retries disabled (``max_commit_retries=0``): it
  lands exactly on the version after the one it was planned from, or fails and is planned again from
  the newer snapshot. A producer committing meanwhile either wins (the plan is made again) or loses
  and is re-stamped by the sequencer; nothing is lost, no offset is given twice.
- It carries the table's markers forward as of the version it was planned from (``mq.hwm`` on the
  commit log, ``mq.cq`` on the consume queue, ...), so marker readers find them on the newest commit
  even after the older commit files are cleaned up. Only a commit that cannot be retried onto a later
  version may do that, which is why delta-rs's own ``optimize`` (automatic retries) is not used.
- Rows that only move are added with ``dataChange = false`` (:func:`write_file`); streaming readers of
  new versions (the dispatch job) skip such files.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction

from engine.errors import CommitConflictError, CommitStateUnknownError, StoreError
from engine.store.commit_log_marks import read_hwm
from engine.store.commit_markers import BATCH_KEY, HWM_KEY, MAINTENANCE_KEY, carried_markers
from engine.store.commit_outcomes import find_batch
from engine.store.commits import backoff, commit_next, listing_gap
from engine.store.delta import Action, DataFile, Snapshot
from engine.store.store import Store, now_ms

COMMIT_ATTEMPTS = 64


# ----------------------------------------------------------------------------- reading and writing files
def read_file(fs: pa_fs.FileSystem, path: str, schema: pa.Schema) -> tuple[pa.Table, str]:
    """A data file's rows cast to the table schema, and its compression codec."""
    try:
        pf = pq.ParquetFile(fs.open_input_file(path))
        codec = pf.metadata.row_group(0).column(0).compression if pf.metadata.num_row_groups else "SNAPPY"
        table = pf.read()
    except (FileNotFoundError, OSError) as exc:
        raise StoreError(f"data file {path} cannot be read: {exc}", path=path, cause=exc) from exc
    return table.select(schema.names).cast(schema), str(codec)


def read_columns(fs: pa_fs.FileSystem, path: str, columns: list[str]) -> pa.Table:
    """Some columns of a data file."""
    try:
        return pq.read_table(path, filesystem=fs, columns=columns)
    except (FileNotFoundError, OSError) as exc:
        raise StoreError(f"data file {path} cannot be read: {exc}", path=path, cause=exc) from exc


_CODECS = {"UNCOMPRESSED": "none", "LZ4_RAW": "lz4"}


# Which columns carry statistics: the first N leaf columns (``delta.dataSkippingNumIndexedCols``) or
# the columns named by ``delta.dataSkippingStatsColumns`` (which wins when a table sets both).
StatsColumns = int | tuple[str, ...]


def file_stats(rows: pa.Table, indexed: StatsColumns) -> str:
    """Delta add-action statistics of the ``indexed`` columns (the first N leaf columns, or the named
    top-level columns), as delta-rs writes them."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    leaves = 0
    limit = indexed if isinstance(indexed, int) else None
    named = None if isinstance(indexed, int) else frozenset(indexed)
    for f in rows.schema:
        if limit is not None and leaves >= limit:
            break
        if named is not None and f.name not in named:
            continue
        t = f.type
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            leaves += 1
            continue
        if pa.types.is_map(t):
            leaves += 2
            continue
        if pa.types.is_struct(t):
            leaves += t.num_fields
            continue
        leaves += 1
        col = rows[f.name]
        nulls[f.name] = int(col.null_count)
        simple = pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_floating(t)
        if simple and col.null_count < len(col):
            mm = pc.min_max(col)
            mins[f.name] = mm["min"].as_py()
            maxs[f.name] = mm["max"].as_py()
    return json.dumps(
        {"numRecords": rows.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )


def write_file(
    fs: pa_fs.FileSystem,
    rows: pa.Table,
    codec: str,
    row_group_rows: int | None,
    indexed: StatsColumns,
    *,
    data_change: bool = False,
) -> AddAction:
    """Write one data file into the table directory; its add action (not committed yet).

    By default the action only moves rows (``dataChange = false``: streaming readers of new versions
    skip it); ``data_change`` marks rows that are new to the table.
    """
    compression = _CODECS.get(codec, codec.lower())
    suffix = "" if compression == "none" else f"{compression}."
    path = f"part-00000-{uuid.uuid4()}-c000.{suffix}parquet"
    try:
        pq.write_table(rows, path, filesystem=fs, compression=compression, row_group_size=row_group_rows)
        size = int(fs.get_file_info(path).size)
    except OSError as exc:
        delete_files(fs, [path])
        raise StoreError(f"cannot write data file {path}: {exc}", path=path, cause=exc) from exc
    return AddAction(path, size, {}, now_ms(), data_change, file_stats(rows, indexed))


def delete_files(fs: pa_fs.FileSystem, paths: Iterable[str]) -> None:
    """Remove files written by a commit that did not happen (best effort; vacuum --full finds the rest)."""
    for path in paths:
        with contextlib.suppress(OSError):
            fs.delete_file(path)


def remove_action(f: DataFile, data_change: bool) -> RemoveAction:
    """The remove action of a live file."""
    return RemoveAction(f.path, data_change, now_ms(), f.size)


def rewrite_files(
    fs: pa_fs.FileSystem,
    sources: Sequence[DataFile],
    schema: pa.Schema,
    *,
    target: int,
    indexed: StatsColumns,
    sort_by: Sequence[str] = (),
    split_by: str | None = None,
    row_group_rows: int | None = None,
) -> tuple[list[AddAction], int]:
    """Write the rows of ``sources`` as new files of about ``target`` bytes; returns adds and rows.

    Args:
        fs: the table's filesystem (:func:`engine.store.delta_log.table_filesystem`).
        sources: the files whose rows to rewrite.
        schema: the table's schema.
        target: bytes per written file (estimated from the sources' bytes per row).
        indexed: statistics columns (:meth:`Snapshot.indexed_columns`).
        sort_by: the row order of the output; () keeps the sources' order.
        split_by: a column whose values never share an output file (each value's rows are written
            on their own, in ``sort_by`` order).
        row_group_rows: rows per parquet row group (default pyarrow's).

    Raises:
        StoreError: a file could not be read or written (the files written so far are deleted).
    """
    parts = []
    codec = "SNAPPY"
    for i, f in enumerate(sources):
        rows, file_codec = read_file(fs, f.path, schema)
        if i == 0:
            codec = file_codec
        parts.append(rows)
    rows = pa.concat_tables(parts) if parts else schema.empty_table()
    if rows.num_rows == 0:
        return [], 0
    if sort_by:
        rows = rows.sort_by([(c, "ascending") for c in sort_by])
    per_row = max(1.0, sum(f.size for f in sources) / rows.num_rows)
    per_file = max(1, int(target / per_row))
    groups = [rows]
    if split_by is not None:
        values = pc.unique(rows[split_by]).to_pylist()
        groups = [rows.filter(pc.equal(rows[split_by], v)) for v in sorted(values)]
    adds: list[AddAction] = []
    try:
        for group in groups:
            for start in range(0, group.num_rows, per_file):
                chunk = group.slice(start, per_file)
                adds.append(write_file(fs, chunk, codec, row_group_rows, indexed))
    except BaseException:
        delete_files(fs, [a.path for a in adds])
        raise
    return adds, int(rows.num_rows)


# ----------------------------------------------------------------------------- committing
@dataclass
class Commit:
    """What a planner wants committed: actions, and the markers (None: carry the table's forward)."""

    actions: list[Action]
    markers: dict[str, str] | None = None


def current_markers(dt: Snapshot, keys: Sequence[str]) -> dict[str, str]:
    """The values of marker ``keys`` as of ``dt``'s version (keys no commit carries are left out)."""
    out: dict[str, str] = {}
    for key in keys:
        if key == HWM_KEY:
            out[key] = read_hwm(dt).to_json()
        else:
            value = dt.commit_value(key)
            if value is not None:
                out[key] = value
    return out


def commit_planned(
    store: Store,
    name: str,
    plan: Callable[[Snapshot], Commit | None],
    operation: str,
    carried: Sequence[str] | None = None,
) -> int | None:
    """Plan and commit on the latest snapshot until a commit wins; returns its version.

    ``plan`` is called again after every lost race with the newer snapshot; None means nothing to do.
    A commit without actions commits only its markers.

    Args:
        store: the store.
        name: the table.
        plan: the planner, called with the snapshot the commit must land right after.
        operation: the ``mq.maintenance`` value of the commit (``compact``, ``retain``).
        carried: the marker keys carried forward when the plan sets no markers of its own (default
            the table's, :func:`engine.store.commit_markers.carried_markers`).

    A commit that failed because delta-rs listed the log while another writer's commit was being
    linked in (``listing_gap``: the outcome is unknown, the failure may come after the commit) is
    looked up by its id in the log loaded anew: found, it is the commit; not found, a lost race.

    Raises:
        CommitConflictError: every attempt lost its race (nothing was committed).
        CommitStateUnknownError: the commit failed mid-way and may have happened.
    """
    dt = store.snapshot(name)
    for attempt in range(COMMIT_ATTEMPTS):
        if attempt:
            backoff(attempt)
            dt.refresh()
        commit = plan(dt)
        if commit is None:
            return None
        keys = carried_markers(name) if carried is None else carried
        markers = current_markers(dt, keys) if commit.markers is None else commit.markers
        base, commit_id = dt.version(), uuid.uuid4().hex
        try:
            return commit_next(
                dt,
                actions=commit.actions,
                custom_metadata={**markers, MAINTENANCE_KEY: operation, BATCH_KEY: commit_id},
                on_error="unknown",
            )
        except CommitConflictError:
            continue
        except CommitStateUnknownError as exc:
            if not listing_gap(exc.__cause__ or exc):
                raise
            landed = find_batch(lambda: store.snapshot(name), commit_id, base, name)
            if landed is not None:
                return landed
            dt = store.snapshot(name)  # not committed: plan again on a handle loaded anew
    raise CommitConflictError(
        f"{operation} of {name} lost {COMMIT_ATTEMPTS} races in a row to other writers; retry later",
        table=name,
    )
