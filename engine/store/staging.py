"""Staged rows: Arrow IPC files under ``<store>/_staging/<write id>/`` that Spark tasks write and the
driver reads back one at a time (the ``mq`` sink: the tasks check their rows and stage them, so a
DataFrame larger than the driver's memory reaches the commit log without being collected).

Files are named by their writer (a task attempt), so retried and speculated attempts never share
one; the driver reads only the files of the attempts Spark committed and drops the whole write
directory afterwards (leftovers of failed attempts with it).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pa_fs

from engine.errors import InvalidArgumentError, StoreError
from engine.store.delta import table_filesystem
from engine.store.store import Store

STAGING_DIR = "_staging"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


def _check(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise InvalidArgumentError(f"{what} {name!r} must match {_NAME.pattern}", name=name)
    return name


def _fs(store: Store) -> pa_fs.FileSystem:
    return table_filesystem(f"{store.root}/{STAGING_DIR}", store.storage_options)


def new_write_id() -> str:
    """A fresh id for one write's staging directory."""
    return uuid.uuid4().hex


def stage(store: Store, write_id: str, name: str, table: pa.Table) -> str:
    """Write ``table`` as ``<write id>/<name>.arrow``; returns the file's path (for :func:`read_staged`).

    Raises:
        InvalidArgumentError: a write id or name with characters outside ``[A-Za-z0-9_.-]``.
        StoreError: the file could not be written.
    """
    path = f"{_check(write_id, 'write id')}/{_check(name, 'staged name')}.arrow"
    fs = _fs(store)
    try:
        fs.create_dir(write_id, recursive=True)
        with fs.open_output_stream(path) as out, pa.ipc.new_stream(out, table.schema) as writer:
            writer.write_table(table)
    except OSError as exc:
        raise StoreError(f"cannot stage rows at {path}: {exc}", path=path, cause=exc) from exc
    return path


def read_staged(store: Store, path: str) -> pa.Table:
    """The rows of one staged file.

    Raises:
        StoreError: the file is gone or unreadable.
    """
    try:
        with _fs(store).open_input_stream(path) as source:
            return pa.ipc.open_stream(source).read_all()
    except OSError as exc:
        raise StoreError(f"staged rows at {path} cannot be read: {exc}", path=path, cause=exc) from exc


def drop_write(store: Store, write_id: str) -> None:
    """Delete a write's staging directory and everything in it (nothing happens if it is gone)."""
    fs = _fs(store)
    try:
        fs.delete_dir(_check(write_id, "write id"))
    except FileNotFoundError:
        return
    except OSError as exc:
        if "not exist" in str(exc).lower() or "no such" in str(exc).lower():
            return
        raise StoreError(f"cannot delete staged rows of {write_id}: {exc}", write_id=write_id) from exc


def staged_files(store: Store, write_id: str) -> Iterator[str]:
    """Paths of the files staged under ``write_id`` (in name order)."""
    fs = _fs(store)
    try:
        infos = fs.get_file_info(pa_fs.FileSelector(_check(write_id, "write id"), allow_not_found=True))
    except OSError:
        return
    yield from sorted(i.path for i in infos if i.type == pa_fs.FileType.File)
