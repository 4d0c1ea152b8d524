"""Committing to a table through delta-rs: :func:`commit_next`, the one way the engine commits, and
what goes with it (the checkpoint at the interval, the test for a log cleaned up behind a handle,
the pause after a lost race).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from deltalake import (
    CommitProperties,
    PostCommitHookProperties,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from engine.errors import CommitConflictError, CommitStateUnknownError, StoreError
from engine.store.commit_markers import COUNTS_KEY

if TYPE_CHECKING:
    from engine.store.delta import Action, Snapshot

Failure = Literal["failed", "unknown"]
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
DEFAULT_CHECKPOINT_INTERVAL = 100  # delta-rs's default delta.checkpointInterval (Delta on Spark: 10)


def checkpoint_interval(snapshot: Snapshot) -> int:
    """The table's ``delta.checkpointInterval`` (Delta's default 100 when unset or unreadable)."""
    raw = snapshot.configuration().get("delta.checkpointInterval")
    try:
        return max(1, int(raw)) if raw else DEFAULT_CHECKPOINT_INTERVAL
    except ValueError:
        return DEFAULT_CHECKPOINT_INTERVAL


def expired_log_cleanup(snapshot: Snapshot) -> bool:
    """Whether a checkpoint also deletes log files past the retention (``delta.enableExpiredLogCleanup``)."""
    return str(snapshot.configuration().get("delta.enableExpiredLogCleanup", "true")).lower() != "false"


def checkpoint_if_due(snapshot: Snapshot, version: int, write: Callable[[bool], None] | None = None) -> None:
    """Write the checkpoint Delta's post-commit hook would have written after committing ``version``
    (with its cleanup of expired log files), when ``snapshot`` stands at it: ``write(cleanup)``,
    by default :meth:`Snapshot.checkpoint` (the commit log saves its marks first).

    Best effort, and never part of the commit: a checkpoint only speeds up loading the table, a
    missed one is taken at the next interval (or by the maintenance job). delta-rs's own hook runs
    inside the write, so its failure (a handle whose listed commit files were cleaned up) would
    report a commit that landed as failed.
    """
    if version <= 0 or snapshot.version() != version or version % checkpoint_interval(snapshot):
        return
    cleanup = expired_log_cleanup(snapshot)
    with contextlib.suppress(StoreError):
        if write is None:
            snapshot.checkpoint(cleanup=cleanup)
        else:
            write(cleanup)


def commit_next(
    snapshot: Snapshot,
    *,
    rows: pa.Table | None = None,
    actions: Sequence[Action] | None = None,
    transactions: Sequence[Transaction] | None = None,
    custom_metadata: Mapping[str, str] | None = None,
    writer_properties: WriterProperties | None = None,
    hooks: PostCommitHookProperties | None = None,
    on_error: Failure = "failed",
    max_retries: int | None = 0,
) -> int:
    """Commit ``rows`` (written as new files) or ready ``actions`` as the version after ``snapshot``.

    With ``max_retries=0`` (the default; None: delta-rs's own retries) the commit lands exactly on
    ``snapshot.version() + 1`` or fails: a writer that decided what to write from the snapshot never
    lands on top of commits it did not see. A commit with neither rows nor actions commits only its
    metadata (app transactions, markers). Returns the new version: after a commit of rows the
    snapshot is at it, after a commit of ready actions it stays where it was (refresh it to go on).
    Without ``hooks`` no delta-rs post-commit hook runs; a commit of rows is followed by
    :func:`checkpoint_if_due` instead, outside the commit.

    Raises:
        CommitConflictError: another writer took the version (retryable; nothing was committed).
        StoreError: the write failed (``on_error="failed"``: the caller knows nothing landed, e.g.
            the data files could not be written).
        CommitStateUnknownError: the write failed mid-way (``on_error="unknown"``) and may have
            happened.
    """
    if actions and max_retries != 0:
        raise ValueError("a commit of ready actions lands exactly on the next version: max_retries=0")
    own_checkpoint = hooks is None
    hooks = NO_HOOKS if hooks is None else hooks
    dt = snapshot._dt
    base = snapshot.version()
    counts = {"txn": len(transactions or ())}
    if actions:
        counts["add"] = sum(isinstance(a, AddAction) for a in actions)
        counts["remove"] = sum(isinstance(a, RemoveAction) for a in actions)
    props = CommitProperties(
        custom_metadata={**(custom_metadata or {}), COUNTS_KEY: json.dumps(counts, separators=(",", ":"))},
        max_commit_retries=max_retries,
        app_transactions=list(transactions) if transactions else None,
    )
    try:
        if actions:
            dt.create_write_transaction(
                list(actions),
                "append",
                dt.schema(),
                commit_properties=props,
                post_commithook_properties=hooks,
            )
        else:
            data = rows if rows is not None else pa.schema(dt.schema().to_arrow()).empty_table()
            if writer_properties is not None:
                write_deltalake(
                    dt,
                    data,
                    mode="append",
                    commit_properties=props,
                    writer_properties=writer_properties,
                    post_commithook_properties=hooks,
                )
            else:
                write_deltalake(
                    dt, data, mode="append", commit_properties=props, post_commithook_properties=hooks
                )
    except CommitFailedError as exc:
        raise CommitConflictError(
            f"commit to {snapshot.name} conflicted with a concurrent writer: {exc}",
            table=snapshot.name,
            cause=exc,
        ) from exc
    except (DeltaError, OSError) as exc:
        if log_gone(exc):
            # Commit files the handle still lists were cleaned up (it fell behind the log retention):
            # delta-rs could not read what it must check the commit against, before writing the
            # commit file. A lost race; the handle is loaded anew, since a refresh would leave it
            # listing the cleaned-up files (the soak's pull consumer died of that on its retry).
            with contextlib.suppress(StoreError):
                snapshot.reload()
            raise CommitConflictError(
                f"commit to {snapshot.name} was planned on version {base}, whose successors the log "
                f"no longer holds: {exc}",
                table=snapshot.name,
                cause=exc,
            ) from exc
        if on_error == "unknown":
            raise CommitStateUnknownError(
                f"commit to {snapshot.name} failed and may or may not have happened: {exc}",
                table=snapshot.name,
                cause=exc,
            ) from exc
        raise StoreError(f"write to {snapshot.name} failed: {exc}", table=snapshot.name, cause=exc) from exc
    if actions:  # delta-rs moves the handle on after a write, not after a transaction of actions
        return base + 1
    version = snapshot.version()
    if own_checkpoint:
        checkpoint_if_due(snapshot, version)
    return version


def log_gone(exc: BaseException) -> bool:
    """Whether a delta-rs error says that commit files a handle needs were cleaned up (the handle is
    older than the log retention: its successors are gone, only a checkpoint stands for them)."""
    text = str(exc)
    if text.startswith("Invalid table version"):
        return True
    return "_delta_log" in text and "not found" in text and isinstance(exc, (DeltaError, FileNotFoundError))


def listing_gap(exc: BaseException) -> bool:
    """Whether a delta-rs error says its listing of the log had a gap between commit files: the
    directory was read while another writer's commit was being linked in (a listing is not a
    snapshot of the directory), so reading again finds the log whole."""
    return "Expected contiguous commit files" in str(exc)


def backoff(attempt: int) -> None:
    """Sleep a jittered, growing moment after a lost race, so colliding writers do not collide again
    in lockstep (at most 50 ms)."""
    time.sleep(random.uniform(0, min(0.05, 0.001 * (2 ** min(attempt, 6)))))
