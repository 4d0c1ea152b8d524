"""Store maintenance: compaction, checkpoints, consumer-aware retention and vacuum, one pass at a time.

Micro-batches leave one small file per commit; pulls then open many files and scans slow down by an
order of magnitude. :func:`compact` rewrites them without blocking producers or consumers
(:mod:`engine.broker.compaction`), :func:`retain` deletes old messages every group has consumed
(:mod:`engine.broker.retention`), :func:`checkpoint` and :func:`vacuum` keep the Delta logs and the
directories small. :func:`maintain` runs one pass of all four.

The Delta-level mechanics (reading a snapshot's files, rewriting them, committing remove + add with the
table's markers carried forward and automatic retries off, checkpoints, vacuum) live in
:mod:`engine.store.delta.data_files` and :mod:`engine.store.maintenance`; this package decides what to do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from engine.broker.compaction import (
    DEFAULT_LAYOUT,
    DEFAULT_MIN_FILES,
    LAYOUTS,
    SMALL_FILE_FRACTION,
    CompactionReport,
    Layout,
    MiB,
    check_int,
    compact,
    plan_bins,
    table_names,
)
from engine.broker.retention import (
    HOUR_MS,
    RetentionReport,
    check_hours,
    consumed_offsets,
    protected_offsets,
    retain,
)
from engine.errors import MQError
from engine.store.commit_markers import MAINTENANCE_KEY
from engine.store.delta import DataFile
from engine.store.maintenance import checkpoint_table, vacuum_table
from engine.store.store import Store

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_LAYOUT",
    "DEFAULT_MIN_FILES",
    "DEFAULT_VACUUM_RETENTION_HOURS",
    "HOUR_MS",
    "LAYOUTS",
    "MAINTENANCE_KEY",
    "SMALL_FILE_FRACTION",
    "CompactionReport",
    "DataFile",
    "Layout",
    "MaintenanceReport",
    "MiB",
    "RetentionReport",
    "checkpoint",
    "compact",
    "consumed_offsets",
    "maintain",
    "plan_bins",
    "protected_offsets",
    "retain",
    "vacuum",
]

# Seconds between the passes of a running broker (the maintenance job's ``--interval``, the in-process
# loop's maintenance cadence): a pass is seconds of I/O on a big store, and small files pile up slowly.
DEFAULT_INTERVAL_S = 300.0
# Removed files stay on disk this long so pulls and stream readers holding an older snapshot finish.
DEFAULT_VACUUM_RETENTION_HOURS = 24


# ----------------------------------------------------------------------------- checkpoints, vacuum
def checkpoint(store: Store, table: str | Sequence[str] | None = None) -> dict[str, int]:
    """Write a Delta checkpoint of each table and delete its expired log files.

    Log files are expired after the table's ``delta.logRetentionDuration`` (the store's
    ``log_retention_minutes``, 7 days by default, applied to a table that has another) and
    only before the newest checkpoint, so the table stays readable and time travel within the
    retention keeps working. Returns the checkpointed version per table.

    Raises:
        InvalidArgumentError: an unknown table.
        StoreError: the checkpoint could not be written.
    """
    return {name: checkpoint_table(store, name) for name in table_names(store, table)}


def vacuum(
    store: Store,
    retention_hours: float | None = None,
    *,
    table: str | Sequence[str] | None = None,
    enforce_retention_duration: bool = False,
) -> dict[str, int]:
    """Delete data files removed from the tables, or never committed, more than ``retention_hours`` ago.

    A full vacuum (:func:`engine.store.maintenance.vacuum_table`): besides the files the log removed, it
    deletes files no commit names once they are older than the window (a crashed writer's leftovers);
    a writer's file in the making is seconds old. Readers holding a snapshot older than the window may
    fail, so keep it above the longest pull or stream lag (default 24 h; 0 is for tests).

    Args:
        store: the store.
        retention_hours: the window; default :data:`DEFAULT_VACUUM_RETENTION_HOURS`.
        table: a table name, a list of them, or None for every table (every commit-log shard
            included).
        enforce_retention_duration: refuse windows below the table's
            ``delta.deletedFileRetentionDuration`` (7 days by default), as Delta does.

    Returns:
        The number of files deleted per table.

    Raises:
        InvalidArgumentError: a negative window, an unknown table, or a window below the table's
            minimum while enforcing it; nothing was deleted.
        StoreError: vacuum failed.
    """
    hours = check_hours(
        "retention_hours", DEFAULT_VACUUM_RETENTION_HOURS if retention_hours is None else retention_hours
    )
    names = table_names(store, table)
    return {name: vacuum_table(store, name, hours, enforce_retention_duration) for name in names}


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
    check_hours(
        "file_reserved_hours",
        store.config.file_reserved_hours if file_reserved_hours is None else file_reserved_hours,
    )
    check_hours(
        "vacuum_retention_hours",
        DEFAULT_VACUUM_RETENTION_HOURS if vacuum_retention_hours is None else vacuum_retention_hours,
    )
    check_int("min_files", min_files, 2)
    if target_file_size is not None:
        check_int("target_file_size", target_file_size, 1)
    if now_ms is not None:
        check_int("now_ms", now_ms, 0)
    errors: list[str] = []
    retention: RetentionReport | None = None
    compaction: dict[str, CompactionReport] = {}
    checkpoints: dict[str, int] = {}
    vacuumed: dict[str, int] = {}
    try:
        retention = retain(store, file_reserved_hours, force=force, now_ms=now_ms)
    except MQError as exc:
        errors.append(f"retention: {exc}")
    for name in store.tables():
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
