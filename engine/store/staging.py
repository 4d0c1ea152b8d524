"""Staged rows: Arrow IPC files under ``<store>/_staging/<write id>/`` that Spark tasks write and the
driver reads back one at a time (the ``mq`` sink: the tasks check their rows and stage them, so a
DataFrame larger than the driver's memory reaches the commit log without being collected).

The files live on the store itself (a local directory, or the object store), never on the disk of
the process that writes them: on a cluster the tasks run on executors and the driver reads back.
Files are named by their writer (a task attempt), so retried and speculated attempts never share
one; the driver reads only the files of the attempts Spark committed and drops the whole write
directory afterwards (leftovers of failed attempts with it).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pyarrow as pa

from engine.errors import InvalidArgumentError, StoreError
from engine.store.delta import delete_prefix, get_object, list_objects, put_object
from engine.store.store import Store

STAGING_DIR = "_staging"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


def _check(name: str, what: str) -> str:
    if not _NAME.match(name) or name in (".", ".."):
        raise InvalidArgumentError(f"{what} {name!r} must match {_NAME.pattern}", name=name)
    return name


def new_write_id() -> str:
    """A fresh id for one write's staging directory."""
    return uuid.uuid4().hex


def stage(store: Store, write_id: str, name: str, table: pa.Table) -> str:
    """Write ``table`` as ``<write id>/<name>.arrow`` on the store itself (where every executor of a
    cluster reaches it); returns the file's path (for :func:`read_staged`).

    Raises:
        InvalidArgumentError: a write id or name with characters outside ``[A-Za-z0-9_.-]``.
        StoreError: the file could not be written.
    """
    path = f"{_check(write_id, 'write id')}/{_check(name, 'staged name')}.arrow"
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    try:
        put_object(store.root, f"{STAGING_DIR}/{path}", sink.getvalue().to_pybytes(), store.storage_options)
    except StoreError as exc:
        raise StoreError(f"cannot stage rows at {path}: {exc}", path=path, cause=exc) from exc
    return path


def read_staged(store: Store, path: str) -> pa.Table:
    """The rows of one staged file.

    Raises:
        StoreError: the file is gone or unreadable.
    """
    try:
        data = get_object(store.root, f"{STAGING_DIR}/{path}", store.storage_options)
        if data is None:
            raise StoreError(f"staged rows at {path} are gone", path=path)
        return pa.ipc.open_stream(data).read_all()
    except (StoreError, pa.ArrowInvalid) as exc:
        raise StoreError(f"staged rows at {path} cannot be read: {exc}", path=path, cause=exc) from exc


def drop_write(store: Store, write_id: str) -> None:
    """Delete a write's staging directory and everything in it (nothing happens if it is gone).

    Raises:
        StoreError: it could not be deleted.
    """
    try:
        delete_prefix(store.root, f"{STAGING_DIR}/{_check(write_id, 'write id')}", store.storage_options)
    except StoreError as exc:
        raise StoreError(f"cannot delete staged rows of {write_id}: {exc}", write_id=write_id) from exc


def staged_files(store: Store, write_id: str) -> Iterator[str]:
    """Paths of the files staged under ``write_id`` (in name order)."""
    try:
        folder = f"{STAGING_DIR}/{_check(write_id, 'write id')}"
        infos = list_objects(store.root, folder, store.storage_options)
    except StoreError:
        return
    yield from sorted(i.path.removeprefix(f"{STAGING_DIR}/") for i in infos)
