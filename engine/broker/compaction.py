"""Compaction: which small files of a table to rewrite together, and in which order.

Micro-batches leave one small file per commit; pulls then open many files and scans slow down by an
order of magnitude. :func:`compact` rewrites them without blocking producers or consumers; the
rewriting and the commit (markers carried, automatic retries off) are :mod:`engine.store.rewrite`'s.

Layouts. The commit log is bin-packed only across *consecutive* small files in physical-offset order
and each output is sorted by physical offset, so files keep contiguous, disjoint physical-offset
ranges (pull file pruning depends on it), with 256-row row groups as the sequencer writes them
(delta-rs ``optimize.compact`` packs files largest first and would interleave ranges; ``z_order``
rewrites the whole table every time). Only commit-log files the dispatch job has covered are
compacted; each commit-log shard is a table of its own, compacted alone with its own watermark.
The consume queue's small files are rewritten together, clustered by (topic, queue_id,
queue_offset). The index keeps the layout its builder writes
(:mod:`engine.broker.index`): one file per kind, rows sorted by (kind, topic, key, store time, physical
offset) in small row groups, so lookups still prune files and row groups by key after compaction.
Other tables are bin-packed in the order they were written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from engine.errors import CommitConflictError, CommitStateUnknownError, InvalidArgumentError
from engine.protocol.shards import SHARD_SPAN, shard_base
from engine.store import schemas
from engine.store.commit_log import COMMIT_LOG_ROW_GROUP_ROWS
from engine.store.delta import (
    Action,
    DataFile,
    Snapshot,
    delete_files,
    read_columns,
    remove_action,
    rewrite_files,
    table_filesystem,
)
from engine.store.index import INDEX_ROW_GROUP_ROWS, INDEX_SORT
from engine.store.maintenance import Commit, commit_planned
from engine.store.store import Store

MiB = 1024 * 1024
DEFAULT_MIN_FILES = 8
# A file smaller than this fraction of the target size is a candidate for compaction.
SMALL_FILE_FRACTION = 0.5
# The consume queue rewrites at most this many target sizes of small files per pass.
_MAX_CLUSTER_TARGETS = 4


@dataclass(frozen=True)
class Layout:
    """How one table's files are compacted."""

    target_file_size: int
    sort_by: tuple[str, ...] = ()  # row order inside a rewritten file; () keeps the written order
    ordered_by: str | None = None  # files ordered by this column's ranges, which must stay disjoint
    clustered: bool = False  # rewrite all small files together, sorted by ``sort_by``
    row_group_rows: int | None = None
    split_by: str | None = None  # a column whose values never share a rewritten file


LAYOUTS: dict[str, Layout] = {
    schemas.COMMIT_LOG: Layout(
        64 * MiB, ("physical_offset",), "physical_offset", row_group_rows=COMMIT_LOG_ROW_GROUP_ROWS
    ),
    schemas.CONSUME_QUEUE: Layout(8 * MiB, ("topic", "queue_id", "queue_offset"), clustered=True),
    schemas.INDEX: Layout(32 * MiB, INDEX_SORT, split_by="kind", row_group_rows=INDEX_ROW_GROUP_ROWS),
}
DEFAULT_LAYOUT = Layout(32 * MiB)


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


def dispatched_physical(store: Store, shard: int = 0) -> int:
    """Largest physical offset of commit-log shard ``shard`` the consume queue points at (-1 for
    none): that shard's files ending at or below it were committed no later than a dispatched
    version, so the dispatch job has read them (a shard's offsets grow with its commit order).

    With one shard this is the consume queue's largest ``physical_offset`` statistic. With several,
    files wholly inside the shard's offset range give theirs, and only files whose range reaches past
    it are read (their ``physical_offset`` column).
    """
    cq = store.snapshot(schemas.CONSUME_QUEUE)
    if store.commit_log_shards == 1:
        return cq.column_max("physical_offset")
    lo = shard_base(shard)
    hi = lo + SHARD_SPAN - 1
    best = -1
    straddling: list[str] = []
    for f in cq.files("physical_offset"):
        if f.lo is None or f.hi is None:
            straddling.append(f.path)
        elif lo <= f.hi <= hi:
            best = max(best, f.hi)
        elif f.lo <= hi < f.hi:
            straddling.append(f.path)
    fs = table_filesystem(store.uri(schemas.CONSUME_QUEUE), store.storage_options)
    for path in straddling:
        offsets = read_columns(fs, path, ["physical_offset"])["physical_offset"].to_numpy()
        inside = offsets[(offsets >= lo) & (offsets <= hi)]
        if len(inside):
            best = max(best, int(inside.max()))
    return best


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


def _compact_table(store: Store, name: str, min_files: int, target: int | None) -> CompactionReport:
    layout = LAYOUTS.get(schemas.kind_of(name), DEFAULT_LAYOUT)
    size = target or layout.target_file_size
    dt = store.snapshot(name)
    files = dt.files(layout.ordered_by)
    shard = schemas.shard_of_table(name)
    watermark = dispatched_physical(store, shard) if shard is not None else None
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
    schema = schemas.schema_of(name)
    indexed = dt.indexed_columns()
    written: list[tuple[list[DataFile], Sequence[Action], int]] = []
    dropped: set[int] = set()

    def plan(snapshot: Snapshot) -> Commit | None:
        live = snapshot.live_paths()
        out: list[Action] = []
        for i, (sources, adds, _) in enumerate(written):
            if i in dropped:
                continue
            if all(f.path in live for f in sources):
                out.extend(adds)
                out.extend(remove_action(f, False) for f in sources)
            else:  # another compactor (or retention) got to these files first
                dropped.add(i)
                delete_files(fs, [a.path for a in adds])
        return Commit(out) if out else None

    try:
        for sources in bins:
            adds, rows = rewrite_files(
                fs,
                sources,
                schema,
                target=size,
                indexed=indexed,
                sort_by=layout.sort_by,
                split_by=layout.split_by,
                row_group_rows=layout.row_group_rows,
            )
            written.append((sources, adds, rows))
        version = commit_planned(store, name, plan, "compact")
    except CommitStateUnknownError:
        raise  # the files may be referenced now: leave them to vacuum
    except BaseException:
        delete_files(fs, [a.path for i, (_, adds, _) in enumerate(written) if i not in dropped for a in adds])
        raise
    if version is None:
        return report
    kept = [w for i, w in enumerate(written) if i not in dropped]
    after = store.snapshot(name).files()
    report["files_after"] = len(after)
    report["bytes_after"] = sum(f.size for f in after)
    report["files_removed"] = sum(len(s) for s, _, _ in kept)
    report["files_added"] = sum(len(a) for _, a, _ in kept)
    report["rows_rewritten"] = sum(r for _, _, r in kept)
    report["version"] = version
    return report


def table_names(store: Store, table: str | Sequence[str] | None) -> list[str]:
    """The tables named (every table of ``store``, each commit-log shard included, for None);
    raises :class:`InvalidArgumentError` for names that are no table of ``store``.

    How every maintenance step (compaction, checkpoints, vacuum) reads its ``table`` argument.
    """
    known = store.tables()
    if table is None:
        return list(known)
    names = [table] if isinstance(table, str) else list(table)
    for name in names:
        if name not in known:
            raise InvalidArgumentError(f"unknown table {name!r}; tables: {', '.join(known)}", table=name)
    return names


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum``; raises :class:`InvalidArgumentError` otherwise
    (the sizes and counts of the maintenance steps)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}", **{name: value})
    return value


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
        table: a table name, a list of them, or None for every table (every commit-log shard
            included: ``commit_log``, ``commit_log_1``, …).
        min_files: compact a table only when at least this many small files would be merged (>= 2).
        target_file_size: size in bytes of the files written; default per table (:data:`LAYOUTS`).

    Returns:
        A report per table.

    Raises:
        InvalidArgumentError: an unknown table or a bad size; nothing was changed.
        CommitConflictError: a table's compaction lost every race (retryable). Of several tables,
            the others are compacted all the same: the error names the tables that lost
            (context ``tables``) and holds the reports of the others (context ``compacted``).
        CommitStateUnknownError, StoreError: I/O failed.
    """
    names = table_names(store, table)
    check_int("min_files", min_files, 2)
    if target_file_size is not None:
        check_int("target_file_size", target_file_size, 1)
    reports: dict[str, CompactionReport] = {}
    lost: list[str] = []
    for name in names:
        try:
            reports[name] = _compact_table(store, name, min_files, target_file_size)
        except CommitConflictError:
            if len(names) == 1:
                raise
            lost.append(name)  # a busy table: the others need not wait for it to be quieter
    if lost:
        raise CommitConflictError(
            f"compaction of {', '.join(lost)} lost every race to other writers; retry later "
            f"(the other {len(reports)} tables were compacted)",
            tables=lost,
            compacted=reports,
        )
    return reports
