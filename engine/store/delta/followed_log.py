"""Decisions committed directly on a local table: its log followed by reading the commit files, and
commits carrying a Delta app transaction put at exactly the version after the last one read.

A consumer group's lease decisions (:class:`engine.store.action_log.ActionLogWriter`) are commits of
the action log carrying the queue's lease frontier as an app transaction: of two decisions about one
queue exactly one may land. Through delta-rs each cost a handle moved on to the latest version (about
10 ms with a few consumers committing: its replay of the log) and a write with its conflict check (15
to 20 ms), which made four consumer processes slower together than one alone. Here, as the commit
log's writers do (:mod:`engine.store.delta.direct_append`), the writer follows the log by reading
each new commit file once, keeping the app transactions they record, and links its commit in at the
next version; a lost race reads the commits that won it and gives up only when one of them records
the same app id (a decision about the same queue: read again and decide again), as delta-rs's
conflict check does. Commits through delta-rs (administrators' offset resets, checkpoints, object
stores) interleave on the same log: each lands on the next version or not at all.

Only local tables a blind appender may write qualify (:func:`~engine.store.delta.direct_append.blocker`),
and a commit that changes the table's protocol or metadata, or a commit file cleaned up behind the
writer, ends the following: the caller makes a new one from a fresh snapshot.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa

from engine.errors import CommitConflictError, StoreError
from engine.store.commit_markers import BATCH_KEY
from engine.store.delta.commits import backoff, checkpoint_at_interval, failed_link_landed
from engine.store.delta.direct_append import DirectAppender, direct_appender
from engine.store.delta.snapshot import Snapshot, checkpoint_interval


class FollowedLog:
    """One writer's view of a local table: every commit up to :attr:`version` read, the app
    transactions they recorded, and its own commits put at the next version. Not thread-safe.

    Made by :func:`follow_log`.

    Args:
        base: a snapshot of the table; its version is where following starts, and app transactions
            not recorded since are read from it.
        appender: the table's direct appender.
        open_snapshot: opens a snapshot of the table at a version (for checkpoints).
    """

    def __init__(
        self, base: Snapshot, appender: DirectAppender, open_snapshot: Callable[[int], Snapshot]
    ) -> None:
        self._base = base
        self._appender = appender
        self._open = open_snapshot
        self._interval = checkpoint_interval(base)
        self.version = base.version()
        self._apps: dict[str, int] = {}  # app id -> version recorded at or before self.version

    @property
    def name(self) -> str:
        return self._appender.name

    def follow(self) -> set[str] | None:
        """Read every commit after :attr:`version` up to the newest; returns the app ids they record,
        or None when the log cannot be followed any further (a commit changed the table's protocol
        or metadata, or was cleaned up before it was read): make a new one.

        Raises:
            StoreError: a commit file cannot be read or parsed.
        """
        latest = self._appender.latest(self.version)
        if latest is None:
            return None
        seen: set[str] = set()
        for version in range(self.version + 1, latest + 1):
            actions = self._appender.read_actions(version)
            if actions is None:
                return None
            for action in actions:
                txn = action.get("txn")
                if txn is not None:
                    self._apps[str(txn["appId"])] = int(txn["version"])
                    seen.add(str(txn["appId"]))
                elif "metaData" in action or "protocol" in action:
                    return None
            self.version = version
        return seen

    def app_version(self, app_id: str) -> int:
        """The version app transaction ``app_id`` recorded as of :attr:`version` (-1: none)."""
        found = self._apps.get(app_id)
        if found is None:
            found = self._apps[app_id] = self._base.app_version(app_id)
        return found

    def commit(
        self,
        rows: pa.Table | Sequence[pa.Table],
        app_id: str,
        app_version: int,
        custom_metadata: Mapping[str, str] | None = None,
        *,
        attempts: int = 32,
    ) -> int | None:
        """Commit ``rows`` (one data file, or one per table of a sequence of them; none for an empty
        sequence) with app transaction ``app_id`` = ``app_version``, decided as of :attr:`version`,
        as the version after it, or after the commits that land meanwhile as long as none of them
        records ``app_id``. Returns the version, or None when the log could not be followed
        (nothing was committed: make a new one, read again and decide again).

        Raises:
            CommitConflictError: a commit recording ``app_id`` landed first, or the commit lost
                ``attempts`` races (nothing was committed).
            CommitStateUnknownError: the link failed and its outcome cannot be read back.
            StoreError: a file could not be written or read; nothing was committed.
        """
        parts = [rows] if isinstance(rows, pa.Table) else rows
        add = [self._appender.write_file(part) for part in parts]
        batch_id = uuid.uuid4().hex
        metadata = {**(custom_metadata or {}), BATCH_KEY: batch_id}
        for attempt in range(attempts):
            target = self.version + 1
            try:
                self._appender.commit(target, add, metadata, {app_id: app_version})
            except CommitConflictError:
                seen = self.follow()
                if seen is None:
                    return None
                if app_id in seen:
                    raise CommitConflictError(
                        f"a decision about {app_id} of {self.name} landed first",
                        table=self.name,
                        app_id=app_id,
                    ) from None
                backoff(attempt)
                continue
            except StoreError as exc:
                if not failed_link_landed(exc, self._appender, target, batch_id, self.name):
                    raise
            self.version = target
            self._apps[app_id] = app_version
            checkpoint_at_interval(self._open, target, self._interval)
            return target
        raise CommitConflictError(
            f"commit to {self.name} lost its race {attempts} times", table=self.name, attempts=attempts
        )


def follow_log(
    snapshot: Snapshot,
    schema: pa.Schema,
    open_snapshot: Callable[[int], Snapshot],
    *,
    row_group_rows: int = 1 << 20,
) -> FollowedLog | None:
    """A :class:`FollowedLog` of ``snapshot``'s table from its version, for rows of ``schema``
    (written in row groups of ``row_group_rows``); None when the table cannot be committed to
    directly (an object store, or a table that asks more than a version 2 writer)."""
    appender = direct_appender(snapshot, schema, row_group_rows=row_group_rows)
    return None if appender is None else FollowedLog(snapshot, appender, open_snapshot)
