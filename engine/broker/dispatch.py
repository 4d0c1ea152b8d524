"""Dispatch: commit-log rows -> consume-queue entries, exactly once.

The consume queue records, in each commit, the last commit-log version it covers (per commit-log
shard) and every queue's next offset (see :mod:`engine.store.consume_queue`). A queue lives in one
shard, so dispatching the shards one after another keeps every queue dense.
Rows of versions already covered are dropped, so a replayed or restarted micro-batch adds nothing,
whatever the stream's checkpoint says. Entries must continue each queue densely; a gap is a bug
upstream and stops the job rather than writing a hole.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from dataclasses import dataclass, field

import pyarrow as pa

from engine.errors import CommitConflictError, StoreError
from engine.store import schemas
from engine.store.consume_queue import (
    QueueMarks,
    commit_entries,
    commit_entries_directly,
    covered_version,
    queue_marks,
)
from engine.store.delta import (
    STALE_LOOK_S,
    DirectAppender,
    Snapshot,
    checkpoint_if_due,
    checkpoint_interval,
    direct_append_enabled,
    direct_appender,
)
from engine.store.queue_entries import PLAN_COLUMNS, plan_entries
from engine.store.store import Store

# What dispatch needs from a commit-log row; bodies stay on disk.
DISPATCH_COLUMNS = PLAN_COLUMNS
DISPATCH_SCHEMA = pa.schema([schemas.COMMIT_LOG_SCHEMA.field(c) for c in DISPATCH_COLUMNS])
# Commit-log versions read and dispatched in one consume-queue commit (bounds a catch-up's memory).
VERSIONS_PER_COMMIT = 1000


# Each store's consume-queue state, kept between dispatches by the dispatcher that made it: a
# snapshot opened anew reads every commit since the newest checkpoint (on an object store two GETs per
# commit: 8 for 4 commits, measured), one moved on reads only the new ones (on an object store, one
# HEAD when there are none). Taken out while in use, so concurrent dispatchers never share one.
#
# Where the table allows it (:func:`~engine.store.delta.direct_append.direct_appender`), dispatch
# commits without delta-rs: the entries' file written with pyarrow and the commit put at exactly the
# version after the last one known, with put-if-absent. Through delta-rs a commit of a few entries
# cost about 5.6 ms of CPU (its writer, its conflict check, its replay of the log), a quarter of a
# core at the broker loop's 20 ms ticks; directly about 1 ms. The dispatcher then follows the log by
# its own commits: while no other writer (compaction, retention, another dispatcher) committed after
# its last one, what that commit recorded (covered versions, marks) is all it needs, and the
# delta-rs snapshot is not moved on at all (it is reopened at each checkpoint the dispatcher writes,
# and whenever another writer's commit is found).
@dataclass
class _Kept:
    """A dispatcher's consume-queue snapshot and, while no other commit came after it, what its own
    last commit recorded (the version it made, the covered versions per shard, the marks): planning
    the next commit then reads nothing back."""

    snapshot: Snapshot
    appender: DirectAppender | None = None  # None: commits go through delta-rs
    made: int = -1
    covered: dict[int, int] = field(default_factory=dict)
    marks: QueueMarks | None = None
    looked_at: float = field(default_factory=time.monotonic)  # when ``made`` was last the latest

    @property
    def own(self) -> bool:
        """Whether the newest version known is this dispatcher's own commit."""
        return self.made >= 0 and self.made >= self.snapshot.version()

    @property
    def version(self) -> int:
        """The newest version known: the next commit must be the one after it."""
        return max(self.made, self.snapshot.version())

    def covered_version(self, shard: int) -> int:
        if self.own and shard in self.covered:
            return self.covered[shard]
        return covered_version(self.snapshot, shard)

    def queue_marks(self) -> QueueMarks:
        if self.own and self.marks is not None:
            return self.marks.copy()
        return queue_marks(self.snapshot)


_KEPT: weakref.WeakKeyDictionary[Store, _Kept] = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()


def _open(store: Store) -> _Kept:
    snapshot = store.snapshot(schemas.CONSUME_QUEUE)
    appender = (
        direct_appender(snapshot, schemas.CONSUME_QUEUE_SCHEMA, on_s3=True)
        if direct_append_enabled()
        else None
    )
    return _Kept(snapshot, appender)


def _take(store: Store) -> _Kept:
    """The consume-queue state kept for ``store``, brought to the latest version, or a new one (none
    kept, the kept snapshot aged (:attr:`Snapshot.aged`), or another writer committed after this
    dispatcher's own direct commits)."""
    with _KEPT_LOCK:
        kept = _KEPT.pop(store, None)
    if kept is None:
        return _open(store)
    if kept.appender is not None and kept.own:
        # Following its own direct commits: one look for a successor, trusted while the last look
        # is younger than any log retention (a successor made since cannot have been cleaned up).
        began = time.monotonic()
        if began - kept.looked_at <= STALE_LOOK_S and kept.appender.latest(kept.made) == kept.made:
            kept.looked_at = began
            return kept
        return _open(store)
    if kept.snapshot.aged:
        return _open(store)
    kept.snapshot.refresh()
    return kept


def _keep(store: Store, kept: _Kept) -> None:
    with _KEPT_LOCK:
        _KEPT[store] = kept


def _commit(store: Store, kept: _Kept, entries: pa.Table, covered: int, marks: QueueMarks, shard: int) -> int:
    """Commit ``entries`` as the version after the newest one ``kept`` knows; that version.

    Raises:
        CommitConflictError: another writer committed first.
        StoreError, CommitStateUnknownError: the write failed (see :func:`commit_entries_directly`).
    """
    if kept.appender is None:
        return commit_entries(store, kept.snapshot, entries, covered, marks, shard)
    made = kept.version + 1
    began = time.monotonic()
    commit_entries_directly(kept.appender, made, entries, covered, marks, shard)
    kept.looked_at = began  # the version was free when the commit was asked for
    if made % checkpoint_interval(kept.snapshot) == 0:
        # the checkpoint delta-rs's post-commit hook would write, on a snapshot opened at the
        # version, which is kept (it is as new as the dispatcher's own commits)
        with contextlib.suppress(StoreError):
            kept.snapshot = store.snapshot(schemas.CONSUME_QUEUE, made)
            checkpoint_if_due(kept.snapshot, made)
    return made


def dispatch_rows(store: Store, rows: pa.Table, attempts: int = 8, *, shard: int = 0) -> int:
    """Append consume-queue entries for rows of commit-log shard ``shard`` carrying ``_version``;
    returns entries added.

    Idempotent per commit-log version: called twice with the same rows, it adds them once.
    Safe against a concurrent dispatcher (the losing commit re-evaluates).

    Raises:
        StoreError: a queue-offset gap, or a write failure.
        CommitConflictError: lost ``attempts`` races in a row.
        CommitStateUnknownError: on an object store, a commit got no answer and may land yet (a
            dispatch after it finds out, and adds what it did not).
    """
    for _ in range(attempts):
        # A private view: what is written is decided from exactly the version it commits after.
        kept = _take(store)
        last = kept.covered_version(shard)
        marks = kept.queue_marks()
        log_version = marks.log_version
        entries, covered = plan_entries(rows, last, marks)
        if covered <= last and entries.num_rows == 0:
            _keep(store, kept)
            return 0
        if shard:
            marks.log_version = log_version  # the marks' ``v`` is shard 0's covered version
        try:
            made = _commit(store, kept, entries, covered, marks, shard)
        except CommitConflictError:
            continue  # the state is dropped: the next attempt plans on a new one
        known = kept.covered if kept.own else {}
        kept.made, kept.covered, kept.marks = made, {**known, shard: covered}, marks
        if kept.appender is None and kept.snapshot.version() != made:
            kept.snapshot.refresh()  # the handle may not have moved on to its own commit
        _keep(store, kept)
        return int(entries.num_rows)
    raise CommitConflictError("dispatch lost every race for the consume queue", table=schemas.CONSUME_QUEUE)


def dispatch_committed(store: Store, max_versions: int = VERSIONS_PER_COMMIT) -> tuple[int, int]:
    """Dispatch every commit-log version committed after the consume queue's marker, at most
    ``max_versions`` versions per consume-queue commit (bounds a catch-up's memory); in a store of
    several commit-log shards, every shard's, each from its own marker.

    What the Spark dispatch job does on its driver each micro-batch. Only the
    :data:`DISPATCH_COLUMNS` of the commit log are read; bodies stay on disk.

    Returns:
        (commit-log rows read, consume-queue entries added).

    Raises:
        StoreError: a queue-offset gap, or a read or write failure.
        CommitConflictError: lost every race against another dispatcher.
    """
    rows = entries = 0
    for shard, table in enumerate(store.commit_logs):
        chunks = store.versions_after(
            table, _dispatched(store, shard), DISPATCH_SCHEMA, max_versions=max_versions
        )
        for batch, _ in chunks:  # versions without rows (only transaction halves) leave no marker
            # dispatch_rows is idempotent per commit-log version, so a replayed batch adds nothing.
            if batch.num_rows:
                entries += dispatch_rows(store, batch, shard=shard) if shard else dispatch_rows(store, batch)
            rows += batch.num_rows
    return rows, entries


def _dispatched(store: Store, shard: int) -> int:
    """The last version of commit-log shard ``shard`` in the consume queue, as of now: from the
    dispatcher's own kept snapshot (:func:`_take`), not the store's shared one, which its commits
    never move (a refresh of it lists the log and reads each new commit twice)."""
    kept = _take(store)
    try:
        return kept.covered_version(shard)
    finally:
        _keep(store, kept)


def dispatch_pending(store: Store, max_versions: int = VERSIONS_PER_COMMIT) -> int:
    """Dispatch every committed commit-log version not yet dispatched, without Spark.

    :func:`dispatch_committed` without the streaming query around it: for tools and tests. Returns
    the number of entries added.
    """
    return dispatch_committed(store, max_versions)[1]
