"""Plain appends to a store's local tables (topics, offsets, action log, transactions) committed
directly, as the commit log's writers commit theirs (:mod:`engine.store.delta.direct_append`).

A plain append (rows only: no app transaction, no caller's snapshot) is a blind append: it may land
on any version, as long as no commit before it changed the table's protocol or metadata. delta-rs
spends about 7 ms of CPU on each (its writer, its conflict check, the replay of the log since the
last checkpoint), which made creating a topic cost 4.5 synchronous sends. Here the data file is
written once and its commit linked in at the version after the newest one (found by probing commit
files, :func:`~engine.store.delta.log.probe_latest_version`); a lost race links it at the next one.

Every commit after the last one this writer checked is read before its own lands on top: one that
changed the protocol or metadata makes the writer anew from a fresh snapshot (which may send the
table back to delta-rs, :func:`~engine.store.delta.direct_append.blocker`), and one whose file is gone (log
cleanup went past this writer while it sat idle) makes it start again from a fresh snapshot too. A
checkpoint is written at the table's interval, as delta-rs's post-commit hook would.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

import pyarrow as pa

from engine.errors import CommitConflictError, StoreError
from engine.store.commit_markers import BATCH_KEY
from engine.store.delta.commits import backoff, checkpoint_at_interval, failed_link_landed
from engine.store.delta.direct_append import DirectAppender, direct_appender
from engine.store.delta.snapshot import Snapshot, checkpoint_interval

# Lost races before giving up, as delta-rs's own default commit retries.
MAX_ATTEMPTS = 15


class BlindAppends:
    """The direct writer of one local table's plain appends; not thread-safe (the store serialises
    its appends).

    Args:
        name: the table's name.
        schema: its rows' schema.
        open_snapshot: opens a fresh snapshot of the table at the latest version, or at a version.
    """

    def __init__(self, name: str, schema: pa.Schema, open_snapshot: Callable[[int | None], Snapshot]) -> None:
        self.name = name
        self._schema = schema
        self._open = open_snapshot
        self._appender: DirectAppender | None = None
        self._interval = 0
        self._checked = -1  # the newest version whose commits this writer has read
        self.disabled: str | None = None  # why the table takes delta-rs commits only

    def append(self, rows: pa.Table, custom_metadata: Mapping[str, str] | None) -> int | None:
        """Commit ``rows`` as one new version; returns it, or None when the table cannot take a
        direct append (then nothing was written: commit through delta-rs).

        Raises:
            CommitConflictError: the commit lost its race :data:`MAX_ATTEMPTS` times.
            CommitStateUnknownError: a link failed and its outcome cannot be read back.
            StoreError: the data or commit file could not be written; nothing was committed.
        """
        if self.disabled is not None:
            return None
        appender = self._appender if self._appender is not None else self._renew(None)
        if appender is None:
            return None
        add = appender.write_file(rows)
        batch_id = uuid.uuid4().hex
        metadata = {**(custom_metadata or {}), BATCH_KEY: batch_id}
        for attempt in range(MAX_ATTEMPTS):
            latest = self._follow(appender)
            if latest is None:
                # the table changed under us (or its log was cleaned past us): made anew; the file
                # written stays unreferenced, for vacuum, as a lost race of delta-rs leaves it
                renewed = self._appender
                if renewed is None:
                    return None
                appender, add = renewed, renewed.write_file(rows)
                continue
            try:
                appender.commit(latest + 1, add, metadata)
            except CommitConflictError:
                backoff(attempt)
                continue
            except StoreError as exc:
                if exc.context.get("links_unsupported"):
                    self._disable("the file system has no hard links")
                    return None
                if not failed_link_landed(exc, appender, latest + 1, batch_id, self.name):
                    raise
            self._checked = latest + 1
            checkpoint_at_interval(self._open, latest + 1, self._interval)
            return latest + 1
        raise CommitConflictError(
            f"append to {self.name} lost its race {MAX_ATTEMPTS} times",
            table=self.name,
            attempts=MAX_ATTEMPTS,
        )

    def _follow(self, appender: DirectAppender) -> int | None:
        """The newest version, after reading every commit since the last one checked; None when the
        writer was made anew (see the module docstring): ``self._appender`` is the new one, or None
        when the table takes delta-rs commits only."""
        latest = appender.latest(self._checked)
        if latest is None:
            self._renew(None)
            return None
        for version in range(self._checked + 1, latest + 1):
            commit = appender.read_commit(version)
            if commit is None or commit.changes_table:
                self._renew(None)
                return None
        self._checked = latest
        return latest

    def _renew(self, version: int | None) -> DirectAppender | None:
        """Make the writer anew from a fresh snapshot; None (and disabled) when the table cannot be
        appended to directly."""
        snapshot = self._open(version)
        self._appender = direct_appender(snapshot, self._schema)
        if self._appender is None:
            self._disable("the table needs more than a blind append")
        self._interval = checkpoint_interval(snapshot)
        self._checked = snapshot.version()
        return self._appender

    def _disable(self, why: str) -> None:
        self._appender, self.disabled = None, why
