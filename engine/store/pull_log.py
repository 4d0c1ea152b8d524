"""The ``pull_log`` table: per (group, consumer), pull sequence -> queue position, as QMQ's pull log.

Every commit carries a Delta app transaction (:data:`~engine.store.commit_markers.PULL_LOG_APP`,
version = the last action-log version it covers) and, in its commitInfo
(:data:`~engine.store.commit_markers.PULL_LOG_MARKS_KEY`), the next pull sequence of every consumer.
What to append is decided by :mod:`engine.broker.pull_log`.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

import pyarrow as pa

from engine.store import schemas
from engine.store.commit_markers import PULL_LOG_APP, PULL_LOG_MARKS_KEY
from engine.store.delta import Snapshot
from engine.store.store import Store

Marks = dict[str, dict[str, int]]  # group -> consumer_id -> next pull sequence

_writers: weakref.WeakKeyDictionary[Store, tuple[Store, threading.Lock]] = weakref.WeakKeyDictionary()
_writers_lock = threading.Lock()


def private_store(store: Store) -> tuple[Store, threading.Lock]:
    """A second set of shared snapshots on ``store``'s tables, and the lock its user holds while
    reading and committing.

    The store's shared snapshots are moved by any of its users at any time; an optimistic
    read-then-commit-the-next-version needs a snapshot that stays at the version it read.
    """
    with _writers_lock:
        found = _writers.get(store)
        if found is None:
            found = (Store(store.root, store.storage_options, store.config), threading.Lock())
            _writers[store] = found
        return found


def pulled_version(store: Store) -> int:
    """Last action-log version whose PULL rows are in the pull log (-1 before any)."""
    return store.app_version(schemas.PULL_LOG, PULL_LOG_APP)


def covered_version(snapshot: Snapshot) -> int:
    """Last action-log version covered as of a pull-log snapshot (-1 before any)."""
    return snapshot.app_version(PULL_LOG_APP)


def read_marks(snapshot: Snapshot) -> Marks:
    """Next pull sequence of every consumer, as of a pull-log snapshot.

    Taken from the newest commit that carries marks (compaction commits do not); if the log no longer
    has one, rebuilt by scanning that snapshot.
    """
    if snapshot.version() == 0:
        return {}
    raw = snapshot.commit_value(PULL_LOG_MARKS_KEY)
    if raw is not None:
        data: Any = json.loads(raw)
        return {g: {c: int(n) for c, n in consumers.items()} for g, consumers in data.items()}
    table = snapshot.dataset().to_table(columns=["group", "consumer_id", "pull_sequence"])
    marks: Marks = {}
    if table.num_rows:
        grouped = table.group_by(["group", "consumer_id"]).aggregate([("pull_sequence", "max")])
        for row in grouped.to_pylist():
            marks.setdefault(row["group"], {})[row["consumer_id"]] = int(row["pull_sequence_max"]) + 1
    return marks


def commit_pulls(writer: Store, rows: pa.Table, through_version: int, marks: Marks) -> int:
    """Commit pull-log ``rows`` covering action-log versions up to ``through_version``, with every
    consumer's next sequence (``marks``), as exactly the version after the one the caller read from
    ``writer.shared(PULL_LOG)`` (a :func:`private_store`, under its lock).

    Raises:
        CommitConflictError: another builder committed first (plan again from a new snapshot).
        StoreError: the write failed.
    """
    markers = {PULL_LOG_MARKS_KEY: json.dumps(marks, separators=(",", ":"), sort_keys=True)}
    return writer.append_progress(
        schemas.PULL_LOG, rows, app_id=PULL_LOG_APP, covered=through_version, markers=markers
    )
