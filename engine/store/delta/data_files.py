"""Data files of a Delta table read, written and removed in place: the file mechanics under
compaction, retention and the index.

What is here knows Delta and Parquet, not policy: reading and writing data files in a table's
directory with the add-action statistics delta-rs would write, and the add and remove actions a
commit takes. Rows that only move are added with ``dataChange = false`` (:func:`write_file`);
streaming readers of new versions (the dispatch job) skip such files. Which files to rewrite, in
which order and what to delete is decided by :mod:`engine.broker.compaction` and
:mod:`engine.broker.retention`; their commits go through :func:`engine.store.maintenance.commit_planned`.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction

from engine.errors import StoreError
from engine.store.delta.snapshot import DataFile


def _now_ms() -> int:
    return int(time.time() * 1000)


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


MAX_STAT_STRING = 256
"""Longest string whose min and max a file's statistics keep: longer values would bloat every commit
and checkpoint, and a column without statistics is only scanned, never misread."""

_SMALL = 64  # up to this many rows, min and max are taken in Python (cheaper than a kernel call)


_Plan = tuple[tuple[int, str, bool, bool], ...]
_PLANS: dict[StatsColumns, list[tuple[pa.Schema, _Plan]]] = {}
_PLANS_KEPT = 16  # schemas kept per set of indexed columns (a process writes a few tables)


def _stats_plan(schema: pa.Schema, indexed: StatsColumns) -> _Plan:
    """Per statistics column of ``schema``: its position and name, whether it gets min/max, whether
    they are dates. Kept per schema (found by comparing: hashing a schema costs more than a small
    commit's statistics)."""
    known = _PLANS.setdefault(indexed, [])
    for seen, plan in known:
        if seen.equals(schema):
            return plan
    made = _make_plan(schema, indexed)
    known.insert(0, (schema, made))
    del known[_PLANS_KEPT:]
    return made


def _make_plan(schema: pa.Schema, indexed: StatsColumns) -> _Plan:
    plan: list[tuple[int, str, bool, bool]] = []
    leaves = 0
    limit = indexed if isinstance(indexed, int) else None
    named = None if isinstance(indexed, int) else frozenset(indexed)
    for index, f in enumerate(schema):
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
        dated = pa.types.is_date(t)
        ranged = (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or dated
        )
        plan.append((index, f.name, ranged, dated))
    return tuple(plan)


def stats_range(stats: str | None, column: str) -> tuple[Any, Any] | None:
    """(min, max) of ``column`` by a data file's Delta statistics (an add action's ``stats``); None
    when they do not say (no statistics, none for the column, or not JSON)."""
    if stats is None:
        return None
    try:
        parsed = json.loads(stats)
        return parsed["minValues"][column], parsed["maxValues"][column]
    except (ValueError, KeyError, TypeError):
        return None


def file_stats(rows: pa.Table, indexed: StatsColumns) -> str:
    """Delta add-action statistics of the ``indexed`` columns (the first N leaf columns, or the named
    top-level columns), as delta-rs writes them: numRecords, and per column its null count and (for
    numbers, dates and strings of at most :data:`MAX_STAT_STRING` characters) its min and max."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    small = rows.num_rows <= _SMALL
    for index, name, ranged, dated in _stats_plan(rows.schema, indexed):
        col = rows.column(index)
        if small and ranged:
            listed = col.to_pylist()
            values = [v for v in listed if v is not None]
            nulls[name] = len(listed) - len(values)
            if not values:
                continue
            low, high = min(values), max(values)
        else:
            nulls[name] = int(col.null_count)
            if not ranged or col.null_count == len(col):
                continue
            mm = pc.min_max(col)
            low, high = mm["min"].as_py(), mm["max"].as_py()
        if isinstance(low, str) and max(len(low), len(high)) > MAX_STAT_STRING:
            continue
        if dated:
            low, high = str(low), str(high)  # ISO dates
        mins[name], maxs[name] = low, high
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
    return AddAction(path, size, {}, _now_ms(), data_change, file_stats(rows, indexed))


def delete_files(fs: pa_fs.FileSystem, paths: Iterable[str]) -> None:
    """Remove files written by a commit that did not happen (best effort; vacuum --full finds the rest)."""
    for path in paths:
        with contextlib.suppress(OSError):
            fs.delete_file(path)


def remove_action(f: DataFile, data_change: bool) -> RemoveAction:
    """The remove action of a live file."""
    return RemoveAction(f.path, data_change, _now_ms(), f.size)


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
        fs: the table's filesystem (:func:`engine.store.delta.log.table_filesystem`).
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
