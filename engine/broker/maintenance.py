"""Store maintenance: compaction, checkpoints, consumer-aware retention and vacuum.

Micro-batches leave one small file per commit; pulls then open many files and scans slow down by an
order of magnitude. :func:`compact` rewrites them without blocking producers or consumers,
:func:`retain` deletes old messages every group has consumed, :func:`checkpoint` and :func:`vacuum`
keep the Delta logs and the directories small. :func:`maintain` runs one pass of all four.

Every commit made here follows the sequencer's rules:

- It is a delta-rs write transaction with automatic retries disabled (``max_commit_retries=0``): it
  lands exactly on the version after the one it was planned from, or fails and is planned again from
  the newer snapshot. A producer committing meanwhile either wins (maintenance plans again) or loses
  and is re-stamped by the sequencer; nothing is lost, no offset is given twice.
- It carries the table's markers forward as of the version it was planned from (``mq.hwm`` on the
  commit log, ``mq.cq`` on the consume queue), so marker readers find them on the newest commit even
  after the older commit files are cleaned up. Only a commit that cannot be retried onto a later
  version may do that, which is why delta-rs's own ``optimize`` (automatic retries) is not used.
- Rows that only move (compaction, the kept rows of a file retention rewrites) are added with
  ``dataChange = false``; streaming readers of new versions (the dispatch job) skip such files.

Layouts. The commit log is bin-packed only across *consecutive* small files in physical-offset order
and each output is sorted by physical offset, so files keep contiguous, disjoint physical-offset
ranges (pull file pruning depends on it), with 256-row row groups as the sequencer writes them
(delta-rs ``optimize.compact`` packs files largest first and would interleave ranges; ``z_order``
rewrites the whole table every time). Only commit-log files the dispatch job has covered are
compacted. The consume queue's small files are rewritten together, clustered by
(topic, queue_id, queue_offset). Other tables are bin-packed in the order they were written.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from engine.broker.pull_log import MARKS_KEY as PULL_LOG_MARKS_KEY
from engine.broker.schedule import schedule_progress
from engine.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    InvalidArgumentError,
    MQError,
    StoreError,
)
from engine.protocol import SCHEDULE_TOPIC
from engine.store import schemas
from engine.store import store as _store_module
from engine.store.log import table_filesystem
from engine.store.marks import CQ_KEY, latest_commit_value, queue_marks
from engine.store.sequencer import COMMIT_LOG_ROW_GROUP_ROWS, HWM_KEY, read_hwm
from engine.store.store import Store

MiB = 1024 * 1024
HOUR_MS = 3_600_000
DEFAULT_MIN_FILES = 8
# Removed files stay on disk this long so pulls and stream readers holding an older snapshot finish.
DEFAULT_VACUUM_RETENTION_HOURS = 24
# A file smaller than this fraction of the target size is a candidate for compaction.
SMALL_FILE_FRACTION = 0.5
# The consume queue rewrites at most this many target sizes of small files per pass.
_MAX_CLUSTER_TARGETS = 4
MAINTENANCE_KEY = "mq.maintenance"
_COMMIT_ATTEMPTS = 64


@dataclass(frozen=True)
class Layout:
    """How one table's files are compacted."""

    target_file_size: int
    sort_by: tuple[str, ...] = ()  # row order inside a rewritten file; () keeps the written order
    ordered_by: str | None = None  # files ordered by this column's ranges, which must stay disjoint
    clustered: bool = False  # rewrite all small files together, sorted by ``sort_by``
    row_group_rows: int | None = None


LAYOUTS: dict[str, Layout] = {
    schemas.COMMIT_LOG: Layout(
        64 * MiB, ("physical_offset",), "physical_offset", row_group_rows=COMMIT_LOG_ROW_GROUP_ROWS
    ),
    schemas.CONSUME_QUEUE: Layout(8 * MiB, ("topic", "queue_id", "queue_offset"), clustered=True),
}
DEFAULT_LAYOUT = Layout(32 * MiB)

# commitInfo keys that describe the table's state as of a commit and must survive maintenance commits.
# A per-commit key (such as the sequencer's batch id) must never be listed here.
CARRIED_MARKERS: dict[str, tuple[str, ...]] = {
    schemas.COMMIT_LOG: (HWM_KEY,),
    schemas.CONSUME_QUEUE: (CQ_KEY,),
    schemas.PULL_LOG: (PULL_LOG_MARKS_KEY,),
}


class CompactionReport(TypedDict):
    """What :func:`compact` did to one table (file counts and bytes of the live snapshot)."""

    table: str
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    files_removed: int
    files_added: int
    rows_rewritten: int
    version: int | None  # the compaction commit, None when there was nothing to do


class RetentionReport(TypedDict):
    """What :func:`retain` did."""

    cutoff_ms: int
    forced: bool
    files_removed: int  # commit-log files deleted whole
    files_rewritten: int  # commit-log files rewritten without their deleted rows
    rows_removed: int
    bytes_removed: int
    consume_queue_entries_removed: int
    index_files_removed: int
    min_offsets: dict[str, dict[int, int]]  # queues whose minimum offset rose -> the new minimum
    protected_topics: list[str]  # topics with expired messages kept because no group consumes them
    versions: dict[str, int]  # commits made, per table


# ----------------------------------------------------------------------------- argument checks
def _table_names(table: str | Sequence[str] | None) -> list[str]:
    if table is None:
        return list(schemas.SCHEMAS)
    names = [table] if isinstance(table, str) else list(table)
    for name in names:
        if name not in schemas.SCHEMAS:
            raise InvalidArgumentError(
                f"unknown table {name!r}; tables: {', '.join(schemas.SCHEMAS)}", table=name
            )
    return names


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}", **{name: value})
    return value


def _check_hours(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise InvalidArgumentError(f"{name} must be a number of hours >= 0, got {value!r}", **{name: value})
    return float(value)


# ----------------------------------------------------------------------------- snapshot and files
@dataclass(frozen=True)
class DataFile:
    """One live data file of a snapshot, with the range of the layout's ordering column."""

    path: str
    size: int
    rows: int
    modified: int
    lo: int | None = None  # min / max of the layout's ordering column
    hi: int | None = None


def _actions(dt: DeltaTable) -> pa.Table:
    return pa.table(dt.get_add_actions(flatten=True))


def _int_column(actions: pa.Table, name: str) -> list[int | None]:
    if name not in actions.column_names:
        return [None] * actions.num_rows
    return [None if v is None else int(v) for v in actions[name].to_pylist()]


def _str_column(actions: pa.Table, name: str) -> list[str | None]:
    if name not in actions.column_names:
        return [None] * actions.num_rows
    return [None if v is None else str(v) for v in actions[name].to_pylist()]


def _files(actions: pa.Table, column: str | None = None) -> list[DataFile]:
    paths = actions["path"].to_pylist()
    sizes = _int_column(actions, "size_bytes")
    rows = _int_column(actions, "num_records")
    modified = _int_column(actions, "modification_time")
    los = _int_column(actions, f"min.{column}") if column else [None] * len(paths)
    his = _int_column(actions, f"max.{column}") if column else [None] * len(paths)
    return [
        DataFile(p, s or 0, r or 0, m or 0, lo, hi)
        for p, s, r, m, lo, hi in zip(paths, sizes, rows, modified, los, his, strict=True)
    ]


def _dispatched_physical(store: Store) -> int:
    """Largest physical offset the consume queue points at: commit-log files ending at or below it
    were committed no later than a dispatched version, so the dispatch job has read them."""
    maxs = _int_column(_actions(store.open_table(schemas.CONSUME_QUEUE)), "max.physical_offset")
    known = [v for v in maxs if v is not None]
    return max(known) if known else -1


def _indexed_columns(dt: DeltaTable) -> int:
    raw = dt.metadata().configuration.get("delta.dataSkippingNumIndexedCols")
    try:
        value = int(raw) if raw is not None else 32
    except ValueError:
        value = 32
    return 1 << 30 if value < 0 else value


def _read_file(fs: pa_fs.FileSystem, path: str, schema: pa.Schema) -> tuple[pa.Table, str]:
    """A data file's rows cast to the table schema, and its compression codec."""
    try:
        pf = pq.ParquetFile(fs.open_input_file(path))
        codec = pf.metadata.row_group(0).column(0).compression if pf.metadata.num_row_groups else "SNAPPY"
        table = pf.read()
    except (FileNotFoundError, OSError) as exc:
        raise StoreError(f"data file {path} cannot be read: {exc}", path=path, cause=exc) from exc
    return table.select(schema.names).cast(schema), str(codec)


def _read_columns(fs: pa_fs.FileSystem, path: str, columns: list[str]) -> pa.Table:
    try:
        return pq.read_table(path, filesystem=fs, columns=columns)
    except (FileNotFoundError, OSError) as exc:
        raise StoreError(f"data file {path} cannot be read: {exc}", path=path, cause=exc) from exc


_CODECS = {"UNCOMPRESSED": "none", "LZ4_RAW": "lz4"}


def _file_stats(rows: pa.Table, indexed: int) -> str:
    """Delta add-action statistics (the first ``indexed`` leaf columns), as delta-rs writes them."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    leaves = 0
    for f in rows.schema:
        if leaves >= indexed:
            break
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


def _write_file(
    fs: pa_fs.FileSystem, rows: pa.Table, codec: str, row_group_rows: int | None, indexed: int
) -> AddAction:
    """Write one data file into the table directory; the add action moves rows (dataChange=false)."""
    compression = _CODECS.get(codec, codec.lower())
    suffix = "" if compression == "none" else f"{compression}."
    path = f"part-00000-{uuid.uuid4()}-c000.{suffix}parquet"
    try:
        pq.write_table(rows, path, filesystem=fs, compression=compression, row_group_size=row_group_rows)
        size = int(fs.get_file_info(path).size)
    except OSError as exc:
        _delete_files(fs, [path])
        raise StoreError(f"cannot write data file {path}: {exc}", path=path, cause=exc) from exc
    return AddAction(path, size, {}, _store_module.now_ms(), False, _file_stats(rows, indexed))


def _delete_files(fs: pa_fs.FileSystem, paths: Iterable[str]) -> None:
    """Remove files written by a commit that did not happen (best effort; vacuum --full finds the rest)."""
    for path in paths:
        with contextlib.suppress(OSError):
            fs.delete_file(path)


def _remove(f: DataFile, data_change: bool) -> RemoveAction:
    return RemoveAction(f.path, data_change, _store_module.now_ms(), f.size)


# ----------------------------------------------------------------------------- committing
@dataclass
class _Commit:
    actions: list[AddAction | RemoveAction]
    markers: dict[str, str] | None = None  # None: carry the table's markers forward


def _markers(name: str, dt: DeltaTable) -> dict[str, str]:
    """The table's markers as of ``dt``'s version."""
    out: dict[str, str] = {}
    for key in CARRIED_MARKERS.get(name, ()):
        if key == HWM_KEY:
            out[key] = read_hwm(dt).to_json()
        else:
            value = latest_commit_value(dt, key)
            if value is not None:
                out[key] = value
    return out


def _commit(
    store: Store, name: str, plan: Callable[[DeltaTable], _Commit | None], operation: str
) -> int | None:
    """Plan and commit on the latest snapshot until a commit wins; returns its version.

    ``plan`` is called again after every lost race with the newer snapshot; None means nothing to do.

    Raises:
        CommitConflictError: every attempt lost its race (nothing was committed).
        CommitStateUnknownError: the commit failed mid-way and may have happened.
    """
    dt = store.open_table(name)
    for attempt in range(_COMMIT_ATTEMPTS):
        if attempt:
            time.sleep(random.uniform(0, min(0.05, 0.001 * (2 ** min(attempt, 6)))))
            dt.update_incremental()
        commit = plan(dt)
        if commit is None:
            return None
        base = int(dt.version())
        markers = _markers(name, dt) if commit.markers is None else commit.markers
        props = CommitProperties(
            custom_metadata={**markers, MAINTENANCE_KEY: operation}, max_commit_retries=0
        )
        try:
            if commit.actions:
                dt.create_write_transaction(commit.actions, "append", dt.schema(), commit_properties=props)
            else:  # a markers-only commit
                write_deltalake(
                    dt, schemas.SCHEMAS[name].empty_table(), mode="append", commit_properties=props
                )
        except CommitFailedError:
            continue
        except (DeltaError, OSError) as exc:
            raise CommitStateUnknownError(
                f"{operation} commit to {name} failed and may or may not have happened: {exc}",
                table=name,
                cause=exc,
            ) from exc
        return base + 1
    raise CommitConflictError(
        f"{operation} of {name} lost {_COMMIT_ATTEMPTS} races in a row to other writers; retry later",
        table=name,
    )


# ----------------------------------------------------------------------------- compaction
def plan_bins(
    files: Sequence[DataFile], layout: Layout, min_files: int, target: int, watermark: int | None = None
) -> list[list[DataFile]]:
    """Groups of files to rewrite, one output group per bin (pure).

    Ordered layouts only merge consecutive files (by ``layout.ordered_by`` ranges); a large file,
    a file without statistics or one past ``watermark`` ends a run. Files whose ranges overlap are
    always merged together, which restores disjoint ranges. Nothing is planned unless at least
    ``min_files`` files would be merged.
    """
    small = target * SMALL_FILE_FRACTION
    if layout.clustered:
        chosen: list[DataFile] = []
        total = 0
        for f in sorted((f for f in files if f.size < small), key=lambda f: (f.modified, f.path)):
            if chosen and total + f.size > _MAX_CLUSTER_TARGETS * target:
                break
            chosen.append(f)
            total += f.size
        return [chosen] if len(chosen) >= max(min_files, 2) else []

    units: list[list[DataFile]] = []
    eligible: list[bool] = []
    if layout.ordered_by:
        placed = sorted(
            (f for f in files if f.lo is not None and f.hi is not None), key=lambda f: (f.lo, f.path)
        )
        hi = None
        for f in placed:
            assert f.lo is not None and f.hi is not None
            if units and hi is not None and f.lo <= hi:
                units[-1].append(f)
                hi = max(hi, f.hi)
            else:
                units.append([f])
                hi = f.hi
        for unit in units:
            eligible.append(watermark is None or all(f.hi is not None and f.hi <= watermark for f in unit))
    else:
        units = [[f] for f in sorted(files, key=lambda f: (f.modified, f.path))]
        eligible = [True] * len(units)

    bins: list[list[DataFile]] = []
    current: list[DataFile] = []
    total = 0

    def close() -> None:
        nonlocal current, total
        if len(current) >= 2:
            bins.append(current)
        current, total = [], 0

    for unit, ok in zip(units, eligible, strict=True):
        size = sum(f.size for f in unit)
        if not ok or (size >= small and len(unit) == 1):
            if layout.ordered_by:
                close()  # merging across it would make ranges overlap
            continue
        if current and total + size > target:
            close()
        current.extend(unit)
        total += size
    close()
    if sum(len(b) for b in bins) < min_files:
        return []
    return bins


def _rewrite(
    fs: pa_fs.FileSystem,
    sources: Sequence[DataFile],
    schema: pa.Schema,
    layout: Layout,
    target: int,
    indexed: int,
) -> tuple[list[AddAction], int]:
    """Write the rows of ``sources`` as new files of about ``target`` bytes; returns adds and rows."""
    parts = []
    codec = "SNAPPY"
    for i, f in enumerate(sources):
        rows, file_codec = _read_file(fs, f.path, schema)
        if i == 0:
            codec = file_codec
        parts.append(rows)
    rows = pa.concat_tables(parts) if parts else schema.empty_table()
    if rows.num_rows == 0:
        return [], 0
    if layout.sort_by:
        rows = rows.sort_by([(c, "ascending") for c in layout.sort_by])
    per_row = max(1.0, sum(f.size for f in sources) / rows.num_rows)
    per_file = max(1, int(target / per_row))
    adds: list[AddAction] = []
    try:
        for start in range(0, rows.num_rows, per_file):
            chunk = rows.slice(start, per_file)
            adds.append(_write_file(fs, chunk, codec, layout.row_group_rows, indexed))
    except BaseException:
        _delete_files(fs, [a.path for a in adds])
        raise
    return adds, int(rows.num_rows)


def _compact_table(store: Store, name: str, min_files: int, target: int | None) -> CompactionReport:
    layout = LAYOUTS.get(name, DEFAULT_LAYOUT)
    size = target or layout.target_file_size
    dt = store.open_table(name)
    actions = _actions(dt)
    files = _files(actions, layout.ordered_by)
    watermark = _dispatched_physical(store) if name == schemas.COMMIT_LOG else None
    bins = plan_bins(files, layout, min_files, size, watermark)
    report = CompactionReport(
        table=name,
        files_before=len(files),
        files_after=len(files),
        bytes_before=sum(f.size for f in files),
        bytes_after=sum(f.size for f in files),
        files_removed=0,
        files_added=0,
        rows_rewritten=0,
        version=None,
    )
    if not bins:
        return report
    fs = table_filesystem(store.uri(name), store.storage_options)
    schema = schemas.SCHEMAS[name]
    indexed = _indexed_columns(dt)
    written: list[tuple[list[DataFile], list[AddAction], int]] = []
    dropped: set[int] = set()

    def plan(snapshot: DeltaTable) -> _Commit | None:
        live = set(_actions(snapshot)["path"].to_pylist())
        out: list[AddAction | RemoveAction] = []
        for i, (sources, adds, _) in enumerate(written):
            if i in dropped:
                continue
            if all(f.path in live for f in sources):
                out.extend(adds)
                out.extend(_remove(f, False) for f in sources)
            else:  # another compactor (or retention) got to these files first
                dropped.add(i)
                _delete_files(fs, [a.path for a in adds])
        return _Commit(out) if out else None

    try:
        for sources in bins:
            adds, rows = _rewrite(fs, sources, schema, layout, size, indexed)
            written.append((sources, adds, rows))
        version = _commit(store, name, plan, "compact")
    except CommitStateUnknownError:
        raise  # the files may be referenced now: leave them to vacuum
    except BaseException:
        _delete_files(
            fs, [a.path for i, (_, adds, _) in enumerate(written) if i not in dropped for a in adds]
        )
        raise
    if version is None:
        return report
    kept = [w for i, w in enumerate(written) if i not in dropped]
    after = _files(_actions(store.open_table(name)))
    report["files_after"] = len(after)
    report["bytes_after"] = sum(f.size for f in after)
    report["files_removed"] = sum(len(s) for s, _, _ in kept)
    report["files_added"] = sum(len(a) for _, a, _ in kept)
    report["rows_rewritten"] = sum(r for _, _, r in kept)
    report["version"] = version
    return report


def compact(
    store: Store,
    table: str | Sequence[str] | None = None,
    *,
    min_files: int = DEFAULT_MIN_FILES,
    target_file_size: int | None = None,
) -> dict[str, CompactionReport]:
    """Rewrite the small files of one, several or all tables (see the module docstring for layouts).

    Safe beside running producers, dispatchers and pulls: the compaction commit either lands on the
    version it was planned from (and carries that version's markers) or is planned again; pulls that
    hold an older snapshot keep reading the old files until :func:`vacuum` removes them.

    Args:
        store: the store.
        table: a table name, a list of them, or None for every table.
        min_files: compact a table only when at least this many small files would be merged (>= 2).
        target_file_size: size in bytes of the files written; default per table (:data:`LAYOUTS`).

    Returns:
        A report per table.

    Raises:
        InvalidArgumentError: an unknown table or a bad size; nothing was changed.
        CommitConflictError: a table's compaction lost every race (retryable).
        CommitStateUnknownError, StoreError: I/O failed.
    """
    names = _table_names(table)
    _check_int("min_files", min_files, 2)
    if target_file_size is not None:
        _check_int("target_file_size", target_file_size, 1)
    return {name: _compact_table(store, name, min_files, target_file_size) for name in names}


# ----------------------------------------------------------------------------- checkpoints, vacuum
def checkpoint(store: Store, table: str | Sequence[str] | None = None) -> dict[str, int]:
    """Write a Delta checkpoint of each table and delete its expired log files.

    Log files are expired after the table's ``delta.logRetentionDuration`` (30 days by default) and
    only before the newest checkpoint, so the table stays readable and time travel within the
    retention keeps working. Returns the checkpointed version per table.

    Raises:
        InvalidArgumentError: an unknown table.
        StoreError: the checkpoint could not be written.
    """
    out: dict[str, int] = {}
    for name in _table_names(table):
        dt = store.open_table(name)
        try:
            dt.create_checkpoint()
            dt.cleanup_metadata()
        except (DeltaError, OSError) as exc:
            raise StoreError(f"checkpoint of {name} failed: {exc}", table=name, cause=exc) from exc
        out[name] = int(dt.version())
    return out


def _listing(store: Store, name: str) -> set[str]:
    """Data files present in a table's directory (one listing; the tables are not partitioned)."""
    fs = table_filesystem(store.uri(name), store.storage_options)
    try:
        infos = fs.get_file_info(pa_fs.FileSelector("", recursive=False))
    except OSError as exc:
        raise StoreError(f"cannot list table {name}: {exc}", table=name, cause=exc) from exc
    return {i.path.rsplit("/", 1)[-1] for i in infos if i.type == pa_fs.FileType.File}


def vacuum(
    store: Store,
    retention_hours: float | None = None,
    *,
    table: str | Sequence[str] | None = None,
    enforce_retention_duration: bool = False,
) -> dict[str, int]:
    """Delete data files removed from the tables more than ``retention_hours`` ago.

    Only files the log has tombstones for are deleted (delta-rs "lite" vacuum), never a file a writer
    has written but not committed yet. Readers holding a snapshot older than the window may fail, so
    keep it above the longest pull or stream lag (default 24 h; 0 is for tests).

    Args:
        store: the store.
        retention_hours: the window; default :data:`DEFAULT_VACUUM_RETENTION_HOURS`.
        table: a table name, a list of them, or None for every table.
        enforce_retention_duration: refuse windows below the table's
            ``delta.deletedFileRetentionDuration`` (7 days by default), as Delta does.

    Returns:
        The number of files deleted per table.

    Raises:
        InvalidArgumentError: a negative window, an unknown table, or a window below the table's
            minimum while enforcing it; nothing was deleted.
        StoreError: vacuum failed.
    """
    hours = _check_hours(
        "retention_hours", DEFAULT_VACUUM_RETENTION_HOURS if retention_hours is None else retention_hours
    )
    whole = int(hours) if hours == int(hours) else int(hours) + 1  # delta-rs takes whole hours
    names = _table_names(table)
    out: dict[str, int] = {}
    for name in names:
        dt = store.open_table(name)
        try:
            candidates = dt.vacuum(
                retention_hours=whole, dry_run=True, enforce_retention_duration=enforce_retention_duration
            )
            # Tombstones outlive their files (for the table's deletedFileRetentionDuration): count and
            # vacuum only files still on disk, so an idle pass makes no VACUUM commits.
            if candidates:
                present = _listing(store, name)
                candidates = [c for c in candidates if c in present]
            if candidates:
                candidates = dt.vacuum(
                    retention_hours=whole,
                    dry_run=False,
                    enforce_retention_duration=enforce_retention_duration,
                )
        except (DeltaError, OSError) as exc:
            if enforce_retention_duration and "retention" in str(exc).lower():
                raise InvalidArgumentError(
                    f"retention_hours {hours:g} is below the minimum of table {name}: {exc}",
                    retention_hours=hours,
                    table=name,
                ) from exc
            raise StoreError(f"vacuum of {name} failed: {exc}", table=name, cause=exc) from exc
        out[name] = len(candidates)
    return out


# ----------------------------------------------------------------------------- retention
def protected_offsets(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, int]]:
    """Per topic that has committed offsets, per queue, the smallest offset a consumer still needs.

    ``rows`` are ``consumer_offset`` rows; the latest (by ``ts_ms``) per group, consumer id, topic and
    queue counts. A consumer (group and consumer id) that committed offsets for a topic but never for
    one of its queues needs that queue from 0. Pure function.
    """
    latest: dict[tuple[str, str, str, int], tuple[int, int]] = {}
    for r in rows:
        key = (str(r["group"]), str(r["consumer_id"]), str(r["topic"]), int(r["queue_id"]))
        ts, offset = int(r["ts_ms"]), int(r["offset"])
        if key not in latest or ts >= latest[key][0]:
            latest[key] = (ts, offset)
    members: dict[str, set[tuple[str, str]]] = {}
    by_queue: dict[str, dict[int, dict[tuple[str, str], int]]] = {}
    for (group, consumer, topic, queue_id), (_, offset) in latest.items():
        members.setdefault(topic, set()).add((group, consumer))
        by_queue.setdefault(topic, {}).setdefault(queue_id, {})[(group, consumer)] = offset
    out: dict[str, dict[int, int]] = {}
    for topic, queues in by_queue.items():
        need = members[topic]
        out[topic] = {q: (min(offs.values()) if set(offs) == need else 0) for q, offs in queues.items()}
    return out


def consumed_offsets(store: Store) -> dict[str, dict[int, int]]:
    """:func:`protected_offsets` of the store's consumer offsets, plus the schedule's progress.

    The schedule job is the consumer of ``SCHEDULE_TOPIC_XXXX``: its queues are needed from just past
    what it delivered (level queues) or handled (the timer queue's prefix).
    """
    consumed = protected_offsets(store.read(schemas.CONSUMER_OFFSET).to_pylist())
    progress = {qid: last + 1 for qid, last in schedule_progress(store).items() if last >= 0}
    if progress:
        consumed[SCHEDULE_TOPIC] = progress
    return consumed


def _queue_keys(table: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(table["topic"], pc.cast(table["queue_id"], pa.string()), "\x1f")


def _per_row(keys: pa.Array, values: Mapping[str, int], default: int) -> np.ndarray:
    """``values[key]`` for every row's key (``default`` where missing)."""
    names = list(values)
    lookup = np.asarray([values[n] for n in names] + [default], dtype=np.int64)
    index = pc.index_in(keys, value_set=pa.array(names, pa.string())).fill_null(len(names))
    picked: np.ndarray = lookup[index.to_numpy(zero_copy_only=False)]
    return picked


@dataclass
class _RetentionPlan:
    removes: list[DataFile] = field(default_factory=list)
    rewrites: list[tuple[DataFile, AddAction]] = field(default_factory=list)
    deleted_max: dict[tuple[str, int], int] = field(default_factory=dict)
    rows: int = 0
    bytes: int = 0
    protected: set[str] = field(default_factory=set)


def _plan_commit_log(store: Store, cutoff: int, force: bool, fs: pa_fs.FileSystem) -> _RetentionPlan:
    """Which commit-log files to delete or rewrite; rewritten files are written already."""
    log = store.open_table(schemas.COMMIT_LOG)
    cq = store.open_table(schemas.CONSUME_QUEUE)
    marks = queue_marks(cq)
    consumed = consumed_offsets(store)
    watermark = _dispatched_physical(store)
    indexed = _indexed_columns(log)
    files = sorted(
        (f for f in _files(_actions(log), "physical_offset") if f.lo is not None),
        key=lambda f: (f.lo, f.path),
    )
    plan = _RetentionPlan()
    try:
        for f in files:
            if f.hi is None or f.hi > watermark:
                break  # not dispatched yet: nothing here or after it is consumed
            cols = _read_columns(fs, f.path, ["topic", "queue_id", "queue_offset", "store_ts_ms"])
            if cols.num_rows == 0:
                plan.removes.append(f)
                continue
            keys = _queue_keys(cols)
            limits: dict[str, int] = {}
            old_mins: dict[str, int] = {}
            uniq = cols.select(["topic", "queue_id"]).group_by(["topic", "queue_id"]).aggregate([])
            for topic, qid in zip(uniq["topic"].to_pylist(), uniq["queue_id"].to_pylist(), strict=True):
                key = f"{topic}\x1f{qid}"
                dispatched = marks.max_offset(topic, qid)
                if force:
                    limits[key] = dispatched
                elif topic in consumed:
                    limits[key] = min(consumed[topic].get(qid, 0), dispatched)
                else:
                    limits[key] = 0
                old_mins[key] = marks.min_offset(topic, qid)
            limit = _per_row(keys, limits, 0)
            old_min = _per_row(keys, old_mins, 0)
            offsets = cols["queue_offset"].to_numpy()
            expired = cols["store_ts_ms"].to_numpy() < cutoff
            indexed_rows = offsets >= 0
            deletable = np.where(indexed_rows, (expired & (offsets < limit)) | (offsets < old_min), expired)
            if not force:
                kept_old = expired & indexed_rows & ~deletable
                if kept_old.any():
                    topics = set(pc.filter(cols["topic"], pa.array(kept_old)).to_pylist())
                    plan.protected.update(t for t in topics if t not in consumed)
            if not expired.any() and not deletable.any():
                break  # store times only grow with physical offsets: every later file is newer
            if not deletable.any():
                continue
            gone = deletable & indexed_rows
            if gone.any():
                topic_col = cols["topic"].to_numpy(zero_copy_only=False)
                qid_col = cols["queue_id"].to_numpy()
                for i in np.flatnonzero(gone):
                    qkey = (str(topic_col[i]), int(qid_col[i]))
                    if offsets[i] > plan.deleted_max.get(qkey, -1):
                        plan.deleted_max[qkey] = int(offsets[i])
            removed_rows = int(deletable.sum())
            plan.rows += removed_rows
            if deletable.all():
                plan.removes.append(f)
                plan.bytes += f.size
                continue
            rows, codec = _read_file(fs, f.path, schemas.COMMIT_LOG_SCHEMA)
            kept = rows.filter(pa.array(~deletable))
            add = _write_file(fs, kept, codec, COMMIT_LOG_ROW_GROUP_ROWS, indexed)
            plan.rewrites.append((f, add))
            plan.bytes += max(0, f.size - int(add.size))
    except BaseException:
        _delete_files(fs, [a.path for _, a in plan.rewrites])
        raise
    return plan


def _trim_consume_queue(
    fs: pa_fs.FileSystem, dt: DeltaTable, mins: Mapping[str, int], indexed: int, written: list[str]
) -> tuple[list[AddAction | RemoveAction], int]:
    """Actions deleting consume-queue entries below their queue's minimum; returns them and the count."""
    if not mins:
        return [], 0
    queues = [(k.split("\x1f")[0], int(k.split("\x1f")[1]), m) for k, m in mins.items()]
    actions_table = _actions(dt)
    files = _files(actions_table, "queue_offset")
    stats = {
        side: (_str_column(actions_table, f"{side}.topic"), _int_column(actions_table, f"{side}.queue_id"))
        for side in ("min", "max")
    }
    actions: list[AddAction | RemoveAction] = []
    removed = 0
    for i, f in enumerate(files):
        t_lo, t_hi = stats["min"][0][i], stats["max"][0][i]
        q_lo, q_hi = stats["min"][1][i], stats["max"][1][i]
        # Statistics rule a file out when no queue it may hold has its minimum above the file's first offset.
        if f.lo is not None and not any(
            m > f.lo
            and (t_lo is None or t_lo <= topic)
            and (t_hi is None or topic <= t_hi)
            and (q_lo is None or q_lo <= qid)
            and (q_hi is None or qid <= q_hi)
            for topic, qid, m in queues
        ):
            continue
        cols = _read_columns(fs, f.path, ["topic", "queue_id", "queue_offset"])
        below = cols["queue_offset"].to_numpy() < _per_row(_queue_keys(cols), mins, 0)
        if not below.any():
            continue
        removed += int(below.sum())
        actions.append(_remove(f, True))
        if not below.all():
            rows, codec = _read_file(fs, f.path, schemas.CONSUME_QUEUE_SCHEMA)
            add = _write_file(fs, rows.filter(pa.array(~below)), codec, None, indexed)
            written.append(add.path)
            actions.append(add)
    return actions, removed


def retain(
    store: Store,
    file_reserved_hours: float | None = None,
    force: bool = False,
    now_ms: int | None = None,
) -> RetentionReport:
    """Delete commit-log messages stored more than ``file_reserved_hours`` ago that are consumed.

    Protection rule. A message is deleted only when it is older than the window *and* below, in its
    queue, the smallest committed offset of every consumer (group, consumer id) with offsets for its
    topic (a consumer without an offset for that queue needs it from 0). Unlike RocketMQ, which
    deletes by age alone, messages of a topic no group has offsets for are kept: they may not have
    been read yet. ``force=True`` restores RocketMQ's rule (age alone, for dispatched messages).
    Transaction halves and rollbacks, which no consumer reads, go by age alone.

    Steps, in the order that keeps concurrent pulls correct:

    1. commit-log files whose rows are all deletable are chosen whole; a file with some deletable
       rows is rewritten without them (the kept rows are added with ``dataChange = false``);
    2. the consume queue gets a commit raising each affected queue's minimum offset (``mq.cq``) and
       deleting its entries below it, so a pull below the minimum now gets OFFSET_ILLEGAL with next =
       the new minimum before any message it could point at is gone;
    3. the commit log gets a commit removing the files (the sequencer's marks carried forward);
    4. index files that only point below the commit log's first remaining offset are removed.

    Files leave the disk only when :func:`vacuum` runs after its window.

    Args:
        store: the store.
        file_reserved_hours: the age window; default the config's ``file_reserved_hours`` (72).
        force: delete by age alone, even messages no group has consumed.
        now_ms: the current time (tests); default the clock.

    Returns:
        What was deleted and the new minimum offsets.

    Raises:
        InvalidArgumentError: negative hours or a bad ``now_ms``; nothing was changed.
        CommitConflictError, CommitStateUnknownError, StoreError: a commit failed (rerun to finish).
    """
    hours = _check_hours(
        "file_reserved_hours",
        store.config.file_reserved_hours if file_reserved_hours is None else file_reserved_hours,
    )
    if now_ms is not None:
        _check_int("now_ms", now_ms, 0)
    now = _store_module.now_ms() if now_ms is None else now_ms
    cutoff = now - int(hours * HOUR_MS)
    report = RetentionReport(
        cutoff_ms=cutoff,
        forced=bool(force),
        files_removed=0,
        files_rewritten=0,
        rows_removed=0,
        bytes_removed=0,
        consume_queue_entries_removed=0,
        index_files_removed=0,
        min_offsets={},
        protected_topics=[],
        versions={},
    )
    log_fs = table_filesystem(store.uri(schemas.COMMIT_LOG), store.storage_options)
    plan = _plan_commit_log(store, cutoff, bool(force), log_fs)
    report["protected_topics"] = sorted(plan.protected)
    try:
        _retain_consume_queue(store, plan, report)
        _retain_commit_log(store, plan, report, log_fs)
    except CommitStateUnknownError:
        raise
    except BaseException:
        _delete_files(log_fs, [a.path for _, a in plan.rewrites])
        raise
    _retain_index(store, report)
    return report


def _retain_consume_queue(store: Store, plan: _RetentionPlan, report: RetentionReport) -> None:
    fs = table_filesystem(store.uri(schemas.CONSUME_QUEUE), store.storage_options)
    written: list[str] = []
    result: dict[str, Any] = {}

    def plan_cq(dt: DeltaTable) -> _Commit | None:
        _delete_files(fs, written)
        written.clear()
        marks = queue_marks(dt)
        raised: dict[str, dict[int, int]] = {}
        for (topic, qid), last in plan.deleted_max.items():
            if last + 1 > marks.min_offset(topic, qid):
                marks.set_min(topic, qid, last + 1)
                raised.setdefault(topic, {})[qid] = last + 1
        mins = {f"{t}\x1f{q}": m for t, values in marks.min.items() for q, m in enumerate(values) if m > 0}
        actions, removed = _trim_consume_queue(fs, dt, mins, _indexed_columns(dt), written)
        if not raised and not actions:
            return None
        result.update(raised=raised, removed=removed)
        return _Commit(actions, {CQ_KEY: marks.to_json()})

    try:
        version = _commit(store, schemas.CONSUME_QUEUE, plan_cq, "retain")
    except CommitStateUnknownError:
        raise
    except BaseException:
        _delete_files(fs, written)
        raise
    if version is not None:
        report["versions"][schemas.CONSUME_QUEUE] = version
        report["min_offsets"] = result["raised"]
        report["consume_queue_entries_removed"] = result["removed"]


def _retain_commit_log(
    store: Store, plan: _RetentionPlan, report: RetentionReport, fs: pa_fs.FileSystem
) -> None:
    if not plan.removes and not plan.rewrites:
        return
    needed = {f.path for f in plan.removes} | {f.path for f, _ in plan.rewrites}

    def plan_log(dt: DeltaTable) -> _Commit | None:
        live = set(_actions(dt)["path"].to_pylist())
        if not needed <= live:
            return None  # compacted meanwhile: the rows are below the new minimums; the next run deletes them
        actions: list[AddAction | RemoveAction] = [_remove(f, True) for f in plan.removes]
        for f, add in plan.rewrites:
            actions.extend([add, _remove(f, True)])
        return _Commit(actions)

    version = _commit(store, schemas.COMMIT_LOG, plan_log, "retain")
    if version is None:
        _delete_files(fs, [a.path for _, a in plan.rewrites])
        return
    report["versions"][schemas.COMMIT_LOG] = version
    report["files_removed"] = len(plan.removes)
    report["files_rewritten"] = len(plan.rewrites)
    report["rows_removed"] = plan.rows
    report["bytes_removed"] = plan.bytes


def _retain_index(store: Store, report: RetentionReport) -> None:
    def plan_index(dt: DeltaTable) -> _Commit | None:
        log = store.open_table(schemas.COMMIT_LOG)
        starts = [f.lo for f in _files(_actions(log), "physical_offset") if f.lo is not None]
        first = min(starts) if starts else read_hwm(log).physical
        gone = [f for f in _files(_actions(dt), "physical_offset") if f.hi is not None and f.hi < first]
        if not gone:
            return None
        report["index_files_removed"] = len(gone)
        return _Commit([_remove(f, True) for f in gone])

    version = _commit(store, schemas.INDEX, plan_index, "retain")
    if version is not None:
        report["versions"][schemas.INDEX] = version
    else:
        report["index_files_removed"] = 0


# ----------------------------------------------------------------------------- one pass
@dataclass(frozen=True)
class MaintenanceReport:
    """One pass of :func:`maintain`."""

    retention: RetentionReport | None
    compaction: dict[str, CompactionReport]
    checkpoints: dict[str, int]
    vacuumed: dict[str, int]
    elapsed_s: float
    errors: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: files before/after per compacted table, what retention removed, what vacuum did."""
        parts = []
        changed = [c for c in self.compaction.values() if c["version"] is not None]
        if changed:
            parts.append(
                "compacted "
                + ", ".join(
                    f"{c['table']} {c['files_before']}->{c['files_after']} files "
                    f"({_mib(c['bytes_before'])}->{_mib(c['bytes_after'])})"
                    for c in changed
                )
            )
        else:
            parts.append("compacted nothing")
        r = self.retention
        if r is not None:
            mins = " ".join(
                f"{t}:{q}={m}"
                for t, queues in sorted(r["min_offsets"].items())
                for q, m in sorted(queues.items())
            )
            parts.append(
                f"retention removed {r['rows_removed']} rows ({_mib(r['bytes_removed'])}, "
                f"{r['files_removed']} files deleted, {r['files_rewritten']} rewritten, "
                f"{r['consume_queue_entries_removed']} queue entries)"
                + (f", new min offsets {mins}" if mins else "")
                + (
                    f", kept unconsumed topics {','.join(r['protected_topics'])}"
                    if r["protected_topics"]
                    else ""
                )
            )
        parts.append(f"checkpointed {len(self.checkpoints)} tables")
        parts.append(f"vacuumed {sum(self.vacuumed.values())} files")
        if self.errors:
            parts.append("errors: " + "; ".join(self.errors))
        return f"maintenance: {'; '.join(parts)} ({self.elapsed_s:.1f}s)"


def _mib(n: int) -> str:
    """A byte count for humans (B, KiB, MiB, GiB)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def maintain(
    store: Store,
    *,
    force: bool = False,
    file_reserved_hours: float | None = None,
    vacuum_retention_hours: float | None = None,
    min_files: int = DEFAULT_MIN_FILES,
    target_file_size: int | None = None,
    now_ms: int | None = None,
) -> MaintenanceReport:
    """One maintenance pass: retention, compaction, checkpoints, vacuum, in that order.

    Retention runs first so compaction does not rewrite what is about to be deleted; checkpoints
    follow the pass's commits; vacuum runs last. A step that fails on a store-level error (a lost
    race, an I/O error) is reported in ``errors`` and the pass goes on; the next pass retries it.

    Raises:
        InvalidArgumentError: a bad argument (checked before any step runs).
    """
    began = time.monotonic()
    _check_hours(
        "file_reserved_hours",
        store.config.file_reserved_hours if file_reserved_hours is None else file_reserved_hours,
    )
    _check_hours(
        "vacuum_retention_hours",
        DEFAULT_VACUUM_RETENTION_HOURS if vacuum_retention_hours is None else vacuum_retention_hours,
    )
    _check_int("min_files", min_files, 2)
    if target_file_size is not None:
        _check_int("target_file_size", target_file_size, 1)
    if now_ms is not None:
        _check_int("now_ms", now_ms, 0)
    errors: list[str] = []
    retention: RetentionReport | None = None
    compaction: dict[str, CompactionReport] = {}
    checkpoints: dict[str, int] = {}
    vacuumed: dict[str, int] = {}
    try:
        retention = retain(store, file_reserved_hours, force=force, now_ms=now_ms)
    except MQError as exc:
        errors.append(f"retention: {exc}")
    for name in schemas.SCHEMAS:
        try:
            compaction.update(compact(store, name, min_files=min_files, target_file_size=target_file_size))
        except MQError as exc:
            errors.append(f"compaction of {name}: {exc}")
    try:
        checkpoints = checkpoint(store)
    except MQError as exc:
        errors.append(f"checkpoint: {exc}")
    try:
        vacuumed = vacuum(store, vacuum_retention_hours)
    except MQError as exc:
        errors.append(f"vacuum: {exc}")
    return MaintenanceReport(
        retention, compaction, checkpoints, vacuumed, time.monotonic() - began, tuple(errors)
    )
