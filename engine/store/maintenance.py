"""The store's side of maintenance: the commit every maintenance rewrite goes through, and keeping a
Delta table's log and directory small (checkpoints, expired log files, vacuum).

Mechanics only; :mod:`engine.broker.maintenance` (with :mod:`engine.broker.compaction` and
:mod:`engine.broker.retention`) decides what to rewrite, when and with which windows.

Every commit made through :func:`commit_planned` follows the sequencer's rules:

- It is a delta-rs write transaction with automatic retries disabled (``max_commit_retries=0``): it
  lands exactly on the version after the one it was planned from. A producer committing meanwhile
  either loses (it is re-stamped by the sequencer) or wins: then the commit reads the winners' commit
  files and is put at the next free version, its carried markers moved on over them
  (:func:`~engine.store.delta.commit_following`), or, when a winner removed one of its files or
  changed the table's protocol or metadata, it is planned again from a newer snapshot. Nothing is
  lost, no offset is given twice. On a local store a commit-log commit takes its turn on the
  producers' host lock instead of racing them.
- It carries the table's markers forward as of the version before the one it lands on (``mq.hwm``
  on the commit log, ``mq.cq`` on the consume queue, ...), so marker readers find them on the newest
  commit even after the older commit files are cleaned up. Only a commit that knows every commit
  before its own may do that, which is why delta-rs's own ``optimize`` (automatic retries onto later
  versions, unseen) is not used.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pa_fs

from engine.errors import CommitConflictError, CommitStateUnknownError, InvalidArgumentError, StoreError
from engine.store import schemas
from engine.store.commit_log import checkpoint_commit_log, marks_after, read_hwm, writers_host_lock
from engine.store.commit_markers import BATCH_KEY, HWM_KEY, MAINTENANCE_KEY, carried_markers
from engine.store.delta import (
    Action,
    Snapshot,
    backoff,
    commit_following,
    commit_next,
    direct_append_enabled,
    direct_appender,
    find_batch,
    listing_gap,
    table_filesystem,
)
from engine.store.store import Store
from engine.store.table_properties import LOG_RETENTION_KEY, log_retention

COMMIT_ATTEMPTS = 64

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


# ----------------------------------------------------------------------------- planned commits
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


def _commit_following(
    dt: Snapshot, name: str, commit: Commit, markers: dict[str, str], keys: Sequence[str], operation: str
) -> int | None:
    """After a lost race, ``commit`` put at the first free version after the winners, its carried
    ``markers`` moved on over them (:func:`~engine.store.delta.commit_following`); None when the
    table is not one the engine commits on directly, or following cannot do (plan again).

    Raises:
        CommitStateUnknownError: the commit failed mid-way and may have happened.
        StoreError: it failed and nothing was committed.
    """
    if not direct_append_enabled():
        return None
    appender = direct_appender(dt, schemas.schema_of(name), on_s3=True)
    if appender is None:
        return None
    moved = dict(markers)
    seen: list[Mapping[str, Any]] = []  # the winners' commitInfos, oldest first
    commit_id = uuid.uuid4().hex

    def saw(info: Mapping[str, Any]) -> None:
        seen.append(info)
        for key in keys:
            if key != HWM_KEY and key in info:
                moved[key] = str(info[key])  # the newest value wins, as current_markers reads it

    def metadata() -> dict[str, str]:
        out = {**moved, MAINTENANCE_KEY: operation, BATCH_KEY: commit_id}
        if HWM_KEY in moved:  # compact marks move the full ones on (parsed once a put)
            out[HWM_KEY] = marks_after(moved[HWM_KEY], seen)
        return out

    return commit_following(
        appender,
        dt.version() + 1,
        commit.actions,
        metadata,
        saw,
        commit_id,
    )


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

    On a local store, a commit on the commit log queues on the host lock of its writers
    (:func:`~engine.store.commit_log.writers_host_lock`) from its last look at the log to its commit:
    racing a steady producer instead, it lost every race once a refresh took longer than the pause
    between two appends (a busy table: refreshes of 40-300 ms against appends every 7 ms), the small
    files piled up and every refresh grew slower. Producers of the host wait that long once.

    On an object store (no host lock) a planned commit lost every race to a producer once a refresh
    took longer than the pause between two appends; a lost race now follows the winners instead
    (:func:`_commit_following`), so a plan is made again only when a winner changed what it planned.

    A commit that failed because delta-rs listed the log while another writer's commit was being
    linked in (``listing_gap``: the outcome is unknown, the failure may come after the commit) is
    looked up by its id in the log loaded anew: found, it is the commit; not found, a lost race.

    Raises:
        CommitConflictError: every attempt lost its race (nothing was committed).
        CommitStateUnknownError: the commit failed mid-way and may have happened.
    """
    dt = store.snapshot(name)
    lock = writers_host_lock(store, name) if schemas.kind_of(name) == schemas.COMMIT_LOG else None
    for attempt in range(COMMIT_ATTEMPTS):
        if attempt:
            backoff(attempt)
        held = lock is not None and lock.acquire()
        try:
            if attempt or held:
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
                if commit.markers is None:  # carried markers can be moved on over the winners
                    landed = _commit_following(dt, name, commit, markers, keys, operation)
                    if landed is not None:
                        return landed
                continue
            except CommitStateUnknownError as exc:
                if not listing_gap(exc.__cause__ or exc):
                    raise
                landed = find_batch(lambda: store.snapshot(name), commit_id, base, name)
                if landed is not None:
                    return landed
                dt = store.snapshot(name)  # not committed: plan again on a handle loaded anew
        finally:
            if held:
                assert lock is not None
                lock.release()
    raise CommitConflictError(
        f"{operation} of {name} lost {COMMIT_ATTEMPTS} races in a row to other writers; retry later",
        table=name,
    )
