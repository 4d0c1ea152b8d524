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
(temporary name, then rename, on a local disk; a single put on an object store).
"""

from __future__ import annotations

import contextlib
import uuid

import pyarrow.fs as pa_fs

from engine.errors import StoreError
from engine.store.commit_log.marks import HighWaterMarks
from engine.store.delta import table_filesystem

DIRECTORY = "_mq_marks"
KEEP = 3  # saved marks kept: the newest, and a few in case a checkpoint was written without one


def _name(version: int) -> str:
    return f"{DIRECTORY}/{version:020d}.json"


def save(uri: str, storage_options: dict[str, str] | None, version: int, hwm: HighWaterMarks) -> None:
    """Save the full marks after ``version`` of the commit log at ``uri``; prune older ones.

    Raises:
        StoreError: the file could not be written (then write no checkpoint: nothing else would
            survive a cleanup of the commits that carry the marks).
    """
    fs = table_filesystem(uri, storage_options)
    data = hwm.to_json().encode()
    try:
        fs.create_dir(DIRECTORY, recursive=True)
        if isinstance(fs, pa_fs.SubTreeFileSystem) and isinstance(fs.base_fs, pa_fs.LocalFileSystem):
            temporary = f"{DIRECTORY}/.{uuid.uuid4().hex}.tmp"
            with fs.open_output_stream(temporary) as out:
                out.write(data)
            fs.move(temporary, _name(version))
        else:
            with fs.open_output_stream(_name(version)) as out:
                out.write(data)
    except (OSError, TypeError) as exc:  # TypeError: pyarrow Buffer vs delta-rs handler on S3
        raise StoreError(f"cannot save the marks of commit-log version {version}: {exc}", cause=exc) from exc
    with contextlib.suppress(OSError):
        for old in _versions(fs)[:-KEEP]:
            fs.delete_file(_name(old))


def load(uri: str, storage_options: dict[str, str] | None, at_most: int) -> tuple[int, HighWaterMarks] | None:
    """The newest saved marks at or before version ``at_most``: ``(version, marks)``, or None."""
    fs = table_filesystem(uri, storage_options)
    for version in reversed(_versions(fs)):
        if version > at_most:
            continue
        try:
            with fs.open_input_stream(_name(version)) as f:
                return version, HighWaterMarks.from_json(f.read().decode())
        except (OSError, ValueError):
            continue  # unreadable: an older one may do
    return None


def _versions(fs: pa_fs.FileSystem) -> list[int]:
    try:
        infos = fs.get_file_info(pa_fs.FileSelector(DIRECTORY, allow_not_found=True))
    except OSError:
        return []
    names = (info.base_name for info in infos if info.type == pa_fs.FileType.File)
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
