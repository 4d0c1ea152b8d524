"""Whether a commit-log write that failed landed after all: the writer's batch id, looked up in the
commit it may have made."""

from __future__ import annotations

from collections.abc import Callable

from engine.errors import CommitStateUnknownError, StoreError
from engine.store.commit_markers import BATCH_KEY
from engine.store.delta import Snapshot
from engine.store.direct_append import DirectAppender


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
