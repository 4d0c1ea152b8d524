"""Keeping a Delta table's log and directory small: checkpoints, expired log files, vacuum.

Mechanics only; :mod:`engine.broker.maintenance` decides when and with which windows.
"""

from __future__ import annotations

import contextlib

import pyarrow.fs as pa_fs

from engine.errors import InvalidArgumentError, StoreError
from engine.store import schemas
from engine.store.commit_log_marks import checkpoint_commit_log, read_hwm
from engine.store.delta_log import table_filesystem
from engine.store.store import Store
from engine.store.table_properties import LOG_RETENTION_KEY, log_retention

# Untracked files are deleted only with a window of at least this many hours: younger, one may be a
# live writer's commit in the making.
UNTRACKED_MIN_HOURS = 1


def apply_log_retention(store: Store, name: str) -> bool:
    """Give table ``name`` the store's log retention (``log_retention_minutes``) if it has another
    one (a store created before the setting, or with a different one): one metadata commit.

    Returns whether the table was changed.

    Raises:
        StoreError: the commit failed (another writer changed the table at the same moment; the next
            pass tries again).
    """
    wanted = log_retention(store.config)
    snapshot = store.snapshot(name)
    if snapshot.configuration().get(LOG_RETENTION_KEY) == wanted:
        return False
    snapshot.set_properties({LOG_RETENTION_KEY: wanted})
    return True


def checkpoint_table(store: Store, name: str) -> int:
    """Write a Delta checkpoint of table ``name`` and delete its expired log files.

    Log files are expired after the table's ``delta.logRetentionDuration`` (the store's
    ``log_retention_minutes``, applied first if the table has another) and only before the newest
    checkpoint, so the table stays readable and time travel within the retention keeps working.
    Returns the checkpointed version.

    Raises:
        StoreError: the checkpoint could not be written.
    """
    snapshot = store.snapshot(name)
    if snapshot.configuration().get(LOG_RETENTION_KEY) != log_retention(store.config):
        with contextlib.suppress(StoreError):  # lost a race with a writer: the next pass applies it
            apply_log_retention(store, name)
        snapshot = store.snapshot(name)
    if schemas.shard_of_table(name) is not None:  # every commit-log shard snapshots its marks
        checkpoint_commit_log(snapshot, read_hwm(snapshot))
    else:
        snapshot.checkpoint()
    return snapshot.version()


def listing(store: Store, name: str) -> set[str]:
    """Data files present in a table's directory (one listing; the tables are not partitioned)."""
    fs = table_filesystem(store.uri(name), store.storage_options)
    try:
        infos = fs.get_file_info(pa_fs.FileSelector("", recursive=False))
    except OSError as exc:
        raise StoreError(f"cannot list table {name}: {exc}", table=name, cause=exc) from exc
    return {i.path.rsplit("/", 1)[-1] for i in infos if i.type == pa_fs.FileType.File}


def vacuum_table(store: Store, name: str, retention_hours: float, enforce_retention_duration: bool) -> int:
    """Delete table ``name``'s data files that no version within ``retention_hours`` needs.

    delta-rs takes whole hours: a fractional window is rounded up.

    A full vacuum, as Delta Lake's own: files the log removed more than ``retention_hours`` ago, and
    files no commit names (left by a writer that crashed before committing) last modified more than
    ``retention_hours`` ago. A writer commits its files within seconds of writing them, so with a
    window of hours a commit in the making is never touched; below :data:`UNTRACKED_MIN_HOURS` only
    removed files are deleted. ``_``-prefixed entries (the log, the quarantine) are never listed.
    Returns the number of files deleted.

    Raises:
        InvalidArgumentError: the window is below the table's ``delta.deletedFileRetentionDuration``
            while ``enforce_retention_duration``; nothing was deleted.
        StoreError: vacuum failed.
    """
    hours = retention_hours
    whole = int(hours) if hours == int(hours) else int(hours) + 1
    full = whole >= UNTRACKED_MIN_HOURS
    snapshot = store.snapshot(name)
    try:
        candidates = snapshot.vacuum(whole, dry_run=True, enforce=enforce_retention_duration, full=full)
        # Tombstones outlive their files (for the table's deletedFileRetentionDuration): count and
        # vacuum only files still on disk, so an idle pass makes no VACUUM commits.
        if candidates:
            present = listing(store, name)
            candidates = [c for c in candidates if c in present]
        if candidates:
            candidates = snapshot.vacuum(whole, dry_run=False, enforce=enforce_retention_duration, full=full)
    except StoreError as exc:
        cause = exc.context.get("cause", exc)
        if enforce_retention_duration and "retention" in str(cause).lower():
            raise InvalidArgumentError(
                f"retention_hours {hours:g} is below the minimum of table {name}: {cause}",
                retention_hours=hours,
                table=name,
            ) from exc
        raise
    return len(candidates)
