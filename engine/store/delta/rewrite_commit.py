"""A maintenance rewrite committed on the version after the last commit, by following the log.

A compaction or retention commit decides from a snapshot which files it removes and which markers it
carries, and must land exactly on the version after that snapshot's (:mod:`engine.store.maintenance`).
Through delta-rs a lost race meant a refresh of the handle and a new plan before the next try: on S3
against a producer committing every 15 ms, a refresh took 60 to 250 ms (growing with the small
files the compaction could not remove), so every one of 64 tries lost and the files piled up.

Here a commit that lost its race reads the commit files that won it, as the commit log's writers
follow the log (:mod:`engine.store.delta.direct_append`): one read each, no refresh. A winner that
removed one of its files, or changed the table's protocol or metadata, ends the following (the caller
plans again from a new snapshot); any other winner is handed to ``saw`` (its ``commitInfo``, from
which the caller moves its markers on) and the rewrite is put at the next free version with
put-if-absent. The rows it rewrites were committed before the snapshot and the files it adds are its
own, so nothing a winner appended can conflict with it: what delta-rs's conflict check of the same
commit looks at (a file removed twice, a new protocol or metadata) is what is looked at here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deltalake.transaction import AddAction, RemoveAction

from engine.errors import CommitConflictError, StoreError
from engine.store.delta.commits import failed_link_landed
from engine.store.delta.direct_append import DirectAppender

FOLLOWED_COMMITS = 1024
"""Most commits one rewrite follows before it gives up (the caller's next try starts afresh)."""


def commit_following(
    appender: DirectAppender,
    version: int,
    actions: Sequence[AddAction | RemoveAction],
    metadata: Callable[[], Mapping[str, str]],
    saw: Callable[[Mapping[str, Any]], None],
    batch_id: str,
) -> int | None:
    """Put the rewrite ``actions`` at ``version`` or, when that is taken, at the first free version
    after it, following the commits that took them; returns the version it landed at, or None when
    following cannot do (see the module): nothing was committed then.

    Args:
        appender: the table's direct appender.
        version: the first version to try (the one after the snapshot the rewrite was planned on).
        actions: the rewrite's adds (files written already) and removes.
        metadata: the commitInfo fields to commit with, asked for at each put (``saw`` moves them).
        saw: called with each winning commit's ``commitInfo``, oldest first.
        batch_id: the rewrite's ``mq.batch`` in ``metadata`` (a link that failed after it was made
            is told from a lost race by it).

    Raises:
        CommitStateUnknownError: a put failed and the commit may have landed (as
            :meth:`DirectAppender.commit`).
        StoreError: a put failed and nothing was committed.
    """
    removed = {a.path for a in actions if isinstance(a, RemoveAction)}
    for _ in range(FOLLOWED_COMMITS):
        try:
            found = appender.read_actions(version)
            if found is None and appender.passed_by_checkpoint(version - 1):
                return None  # the commit files after it may have been cleaned up: reload
        except StoreError:
            return None
        if found is None:
            try:
                appender.commit_rewrite(version, actions, metadata())
                return version
            except CommitConflictError:
                continue  # taken meanwhile: read the winner
            except StoreError as exc:
                if failed_link_landed(exc, appender, version, batch_id, appender.name):
                    return version
                raise
        info: Mapping[str, Any] = {}
        for action in found:
            if "metaData" in action or "protocol" in action:
                return None
            gone = action.get("remove")
            if isinstance(gone, Mapping) and gone.get("path") in removed:
                return None  # another rewrite (or retention) took one of its files: plan again
            if isinstance(action.get("commitInfo"), Mapping):
                info = action["commitInfo"]
        saw(info)
        version += 1
    return None
