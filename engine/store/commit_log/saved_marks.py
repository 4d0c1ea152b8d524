"""Full marks saved beside each commit-log checkpoint, for when the log no longer holds enough commits.

A reader rebuilds the marks by walking back over the commits' compact marks
(:mod:`engine.store.commit_log.marks`).
Cleaning up a checkpointed log (``delta.logRetentionDuration``) deletes the commits before the newest
checkpoint, so on a store with many queues and few commits since that checkpoint the walk can run out
of commits before it has met every queue; scanning the rows is then no answer, because retention may
have deleted a queue's last messages and the queue would start again at offset 0. So whoever writes a
checkpoint of the commit log first saves the full marks of that version here, at
``<commit_log>/_mq_marks/<version>.json``, and a reader whose walk runs out starts from the newest one
at or before its version and replays the commits after it (a cleanup never deletes those).

The directory starts with ``_``: Delta readers and vacuum leave it alone. A file is written whole
(temporary name, then rename, on a local disk; one upload on an object store:
:mod:`engine.store.delta.objects`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from engine.errors import StoreError
from engine.store.commit_log.marks import HighWaterMarks
from engine.store.delta import delete_object, get_object, list_objects, put_object

DIRECTORY = "_mq_marks"
KEEP = 3  # saved marks kept: the newest, and a few in case a checkpoint was written without one


def _name(version: int) -> str:
    return f"{DIRECTORY}/{version:020d}.json"


def save(uri: str, storage_options: Mapping[str, str] | None, version: int, hwm: HighWaterMarks) -> None:
    """Save the full marks after ``version`` of the commit log at ``uri``; prune older ones.

    Raises:
        StoreError: the file could not be written (then write no checkpoint: nothing else would
            survive a cleanup of the commits that carry the marks).
    """
    try:
        put_object(uri, _name(version), hwm.to_json().encode(), storage_options)
    except StoreError as exc:
        raise StoreError(f"cannot save the marks of commit-log version {version}: {exc}", cause=exc) from exc
    with contextlib.suppress(StoreError):
        for old in _versions(uri, storage_options)[:-KEEP]:
            delete_object(uri, _name(old), storage_options)


def load(
    uri: str, storage_options: Mapping[str, str] | None, at_most: int
) -> tuple[int, HighWaterMarks] | None:
    """The newest saved marks at or before version ``at_most``: ``(version, marks)``, or None."""
    for version in reversed(_versions(uri, storage_options)):
        if version > at_most:
            continue
        try:
            data = get_object(uri, _name(version), storage_options)
            if data is not None:
                return version, HighWaterMarks.from_json(data.decode())
        except (StoreError, ValueError):
            continue  # unreadable: an older one may do
    return None


def _versions(uri: str, storage_options: Mapping[str, str] | None) -> list[int]:
    try:
        infos = list_objects(uri, DIRECTORY, storage_options)
    except StoreError:
        return []
    names = (info.path.removeprefix(f"{DIRECTORY}/") for info in infos)
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
