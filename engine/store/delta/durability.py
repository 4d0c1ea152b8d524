"""SYNC_FLUSH: making a committed version durable before it is acknowledged.

delta-rs writes a commit's data files and its ``_delta_log`` JSON itself and does not fsync them on
a local file system, so a power loss can take an acknowledged commit away. With ``flush_disk_type =
SYNC_FLUSH`` the writer calls :func:`fsync_version` after the commit and before acknowledging: the
commit file names the data files it adds, so every file the version wrote is known without asking
delta-rs. Files are flushed first, then the directories that name them (a new file's directory
entry is only durable once its directory is fsynced). Object stores are durable on put: nothing to
do there.
"""

from __future__ import annotations

import json
import os
from urllib.parse import unquote

from engine.errors import CommitStateUnknownError


def version_files(table_dir: str, version: int) -> tuple[list[str], str]:
    """The data files version ``version`` of the table at ``table_dir`` adds (absolute paths) and
    its commit file.

    Raises:
        OSError: the commit file cannot be read.
    """
    log_file = os.path.join(table_dir, "_delta_log", f"{version:020d}.json")
    with open(log_file, encoding="utf-8") as f:
        lines = f.read().splitlines()
    data = [
        os.path.join(table_dir, unquote(action["add"]["path"]))
        for action in (json.loads(line) for line in lines if line.strip())
        if "add" in action
    ]
    return data, log_file


def _fsync(path: str, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_version(table_dir: str, version: int) -> list[str]:
    """fsync what version ``version`` of a local table wrote: its data files, its commit file, then
    their directories. Returns the paths flushed, in order.

    Raises:
        CommitStateUnknownError: a flush failed: the version is committed (readers see it) but may
            not survive a power loss, so it must not be acknowledged as durable.
    """
    try:
        data, log_file = version_files(table_dir, version)
        files = [*data, log_file]
        directories = list(dict.fromkeys(os.path.dirname(p) for p in files))
        for path in files:
            _fsync(path)
        for path in directories:
            _fsync(path, directory=True)
    except OSError as exc:
        raise CommitStateUnknownError(
            f"version {version} of {table_dir} is committed but could not be flushed to disk: {exc}",
            table=table_dir,
            version=version,
            cause=exc,
        ) from exc
    return [*files, *directories]
