"""Committing to a table through delta-rs: :func:`commit_next`, the one way the engine commits, and
what goes with it (the checkpoint at the interval, the test for a log cleaned up behind a handle,
the pause after a lost race).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import pyarrow as pa
from deltalake import (
    ColumnProperties,
    CommitProperties,
    PostCommitHookProperties,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from engine.errors import CommitConflictError, CommitStateUnknownError, StoreError
from engine.store.commit_markers import BATCH_KEY, COMMIT_ID_KEY, COUNTS_KEY
from engine.store.delta.direct_append import DirectAppender
from engine.store.delta.log import parse_commit
from engine.store.delta.objects import get_object, local_path, storage_failure
from engine.store.delta.snapshot import Action, Snapshot, checkpoint_interval, log_gone

_log = logging.getLogger(__name__)

Failure = Literal["failed", "unknown"]
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


def writer_properties(row_group_rows: int, plain_columns: Sequence[str] = ()) -> WriterProperties:
    """How delta-rs writes the data files of a commit of rows (:func:`commit_next`): ``row_group_rows``
    rows per parquet row group, and no dictionary or page statistics for ``plain_columns``."""
    return WriterProperties(
        max_row_group_size=row_group_rows,
        column_properties={
            name: ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")
            for name in plain_columns
        },
    )


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


class BackgroundCheckpoints:
    """Checkpoints written on a thread of their own, off the commit path.

    A checkpoint of the commit log costs tens of milliseconds (a handle opened at the version, the
    checkpoint written, expired log files removed); written inline, the send that made the
    version, and every send queued behind the writer's lock, waited for it (the p99 of a
    synchronous send). A checkpoint only speeds up loading the table, so it can come a little
    later: a job per table waits here, a newer one replacing one not started yet, and one
    daemon thread of the process writes them in turn. A job must not raise (best effort, as
    :func:`checkpoint_if_due`).
    """

    def __init__(self) -> None:
        self._jobs: dict[str, Callable[[], None]] = {}
        self._busy = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, table_uri: str, job: Callable[[], None]) -> None:
        """Write ``job``'s checkpoint of ``table_uri`` soon (in place of one still waiting)."""
        with self._cond:
            self._jobs[table_uri] = job
            if self._thread is None or not self._thread.is_alive():
                if self._thread is None:
                    # A daemon thread still inside delta-rs when the interpreter finalizes can crash
                    # the process on its way out: the checkpoint under way is finished first.
                    atexit.register(self.wait, 30)
                self._thread = threading.Thread(target=self._run, name="mq-checkpoints", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted checkpoint is written; False when ``timeout`` ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs))
                _, job = self._jobs.popitem()
                self._busy += 1
            try:
                job()
            except Exception as exc:  # best effort: the next interval (or maintenance) takes one
                _log.warning("background checkpoint failed: %s", exc)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()


background_checkpoints = BackgroundCheckpoints()
"""The process's one thread of checkpoints (:class:`BackgroundCheckpoints`)."""


def checkpoint_at_interval(open_snapshot: Callable[[int], Snapshot], version: int, interval: int) -> None:
    """After a commit made without delta-rs at ``version``: the checkpoint its post-commit hook would
    have written, when ``version`` is a multiple of the table's ``interval``, on a snapshot
    ``open_snapshot(version)`` opens; best effort (:func:`checkpoint_if_due`)."""
    if version % interval:
        return
    try:
        snapshot = open_snapshot(version)
    except StoreError:
        return
    checkpoint_if_due(snapshot, version)


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

    Every commit carries a fresh id (:data:`COMMIT_ID_KEY`). On an object store a commit whose answer
    was lost (a 5xx or a timeout after the conditional PUT landed: object_store retries it, and the
    retry meets "version already exists") is told from a lost race by reading the commit at the
    version it tried and comparing ids: it is never reported failed when it landed, and never
    committed again. So there, retries (``max_retries`` other than 0) are this function's own, one
    version at a time, not delta-rs's (which would commit the landed one again on the next version).

    Raises:
        CommitConflictError: another writer took the version (retryable; nothing was committed).
        StoreError: the write failed (``on_error="failed"``: the caller knows nothing landed, e.g.
            the data files could not be written).
        CommitStateUnknownError: the write failed mid-way (``on_error="unknown"``) and may have
            happened, or a lost answer's commit cannot be read back.
    """
    if actions and max_retries != 0:
        raise ValueError("a commit of ready actions lands exactly on the next version: max_retries=0")
    remote = local_path(snapshot.uri) is None
    attempts = 1 if max_retries == 0 or not remote else (max_retries if max_retries is not None else 15) + 1
    for attempt in range(attempts):
        base = snapshot.version()
        commit_id = uuid.uuid4().hex
        try:
            version = _commit_once(
                snapshot,
                rows=rows,
                actions=actions,
                transactions=transactions,
                custom_metadata={**(custom_metadata or {}), COMMIT_ID_KEY: commit_id},
                writer_properties=writer_properties,
                hooks=hooks,
                on_error=on_error,
                max_retries=0 if remote else max_retries,
            )
        except (CommitConflictError, StoreError, CommitStateUnknownError) as exc:
            holder = _commit_id_at(snapshot, base + 1, exc) if remote else None
            if holder != commit_id:
                if isinstance(exc, CommitConflictError) and attempt + 1 < attempts:
                    snapshot.refresh()
                    backoff(attempt)
                    continue
                if (
                    holder is None
                    and remote
                    and isinstance(exc, StoreError)
                    and _commit_put_failed(exc, base + 1)
                ):
                    # The commit's own PUT failed without an answer (a timeout, 5xx to the last
                    # retry) and the version is still free: a request still in flight may land
                    # there. (Once another commit holds it, this one never can: a plain failure.)
                    raise CommitStateUnknownError(
                        f"commit to {snapshot.name} at version {base + 1} got no answer and is not "
                        f"there yet; it may still land: {exc}",
                        table=snapshot.name,
                        version=base + 1,
                        cause=exc,
                    ) from exc
                raise
            version = base + 1
            if not actions:
                with contextlib.suppress(StoreError):
                    snapshot.refresh()
                if hooks is None:
                    checkpoint_if_due(snapshot, version)
        return version
    raise AssertionError("unreachable")  # pragma: no cover


def _commit_put_failed(exc: StoreError, version: int) -> bool:
    """Whether a failed write's error is the failure of the PUT of commit ``version`` itself
    (object_store names the request it gave up on), not of a data file or a read before it."""
    return f"_delta_log/{version:020d}.json" in str(exc.context.get("cause", exc))


def _commit_id_at(snapshot: Snapshot, version: int, failure: Exception) -> str | None:
    """The commit id (:data:`COMMIT_ID_KEY`) of the commit at ``version``: "" for a commit without
    one, None when the version is free.

    Raises:
        CommitStateUnknownError: the commit at ``version`` cannot be read.
    """
    path = f"_delta_log/{version:020d}.json"
    try:
        data = get_object(snapshot.uri, path, snapshot.storage_options)
        if data is None:
            return None
        actions = parse_commit(data.decode(), f"{snapshot.uri}/{path}", version)
    except (StoreError, ValueError) as exc:
        raise CommitStateUnknownError(
            f"commit to {snapshot.name} failed ({failure}) and version {version}, which it may have "
            f"taken, cannot be read back: {exc}",
            table=snapshot.name,
            version=version,
            cause=exc,
        ) from exc
    info: object = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    found = info.get(COMMIT_ID_KEY) if isinstance(info, Mapping) else None
    return found if isinstance(found, str) else ""


def _commit_once(
    snapshot: Snapshot,
    *,
    rows: pa.Table | None,
    actions: Sequence[Action] | None,
    transactions: Sequence[Transaction] | None,
    custom_metadata: Mapping[str, str],
    writer_properties: WriterProperties | None,
    hooks: PostCommitHookProperties | None,
    on_error: Failure,
    max_retries: int | None,
) -> int:
    """One commit through delta-rs (:func:`commit_next` without the look-up of a lost answer)."""
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
        raise storage_failure(
            exc, f"write to {snapshot.name} failed", snapshot.uri, table=snapshot.name
        ) from exc
    if actions:  # delta-rs moves the handle on after a write, not after a transaction of actions
        return base + 1
    version = snapshot.version()
    if own_checkpoint:
        checkpoint_if_due(snapshot, version)
    return version


def backoff(attempt: int) -> None:
    """Sleep a jittered, growing moment after a lost race, so colliding writers do not collide again
    in lockstep (at most 50 ms)."""
    time.sleep(random.uniform(0, min(0.05, 0.001 * (2 ** min(attempt, 6)))))


# ----------------------------------------------------------------------------- outcomes
# Whether a write that failed landed after all: the writer's batch id, looked up in the commit it may
# have made.
def landed(direct: DirectAppender, version: int, batch_id: str, table: str) -> bool:
    """Whether ``version`` is the commit of ``batch_id`` (a link that failed, or was retried, after
    it was made: network file systems do that).

    Raises:
        CommitStateUnknownError: the commit file cannot be read.
    """
    try:
        commit = direct.read_commit(version)
    except StoreError as exc:
        raise CommitStateUnknownError(
            f"write to {table} failed and its outcome cannot be read back: {exc}", table=table, cause=exc
        ) from exc
    return commit is not None and commit.batch_id == batch_id


def failed_link_landed(
    failure: StoreError, direct: DirectAppender, version: int, batch_id: str, table: str
) -> bool:
    """Whether the commit of ``batch_id`` at ``version`` landed although putting it raised ``failure``:
    only a link that was made before it failed (network file systems do that) can have.

    Raises:
        CommitStateUnknownError: the commit file cannot be read.
    """
    return bool(failure.context.get("linked")) and landed(direct, version, batch_id, table)


def find_batch(
    open_latest: Callable[[], Snapshot], batch_id: str, base_version: int, table: str
) -> int | None:
    """After a failed write through delta-rs, the version after ``base_version`` that holds
    ``batch_id`` in the table ``open_latest()`` loads, or None when none does.

    Raises:
        CommitStateUnknownError: the table cannot be read back.
    """
    try:
        dt = open_latest()
        latest = dt.version()
        if latest <= base_version:
            return None
        for info in dt.recent_commit_infos(latest - base_version):
            if info.get(BATCH_KEY) == batch_id:
                return int(info["version"])
        return None
    except Exception as exc:
        raise CommitStateUnknownError(
            f"write to {table} failed and its outcome cannot be read back: {exc}", table=table, cause=exc
        ) from exc
