"""The store's side files (saved marks, job statuses, staged rows, commit files read back): whole
objects put, got, listed and deleted under a root, on a local disk or through delta-rs's object
store (the one client of a store, with its one set of storage options).

On a local disk a put writes a temporary file and renames it over the name (readers see the old
file or the new one, never a part). On an object store a put is one upload, visible whole when it
completes. Paths are relative to the root and use ``/``.

Why not pyarrow's filesystem over delta-rs's storage handler
(:func:`engine.store.delta.log.table_filesystem`):
pyarrow hands its output stream a ``Buffer``, which the handler's ``write`` refuses (``TypeError``),
so nothing could be written that way; here the handler is given ``bytes``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow.fs as pa_fs
from deltalake._internal import DeltaFileSystemHandler

from engine.errors import StoreError


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its path relative to the root, and its size in bytes."""

    path: str
    size: int


def local_path(uri: str) -> str | None:
    """The directory of a table (or store) on the local filesystem, or None for an object-store URI."""
    if uri.startswith("file://"):
        return unquote(uri.removeprefix("file://")).rstrip("/") or "/"
    return None if "://" in uri else str(Path(uri).resolve())


@lru_cache(maxsize=64)
def _handler(root: str, options_key: tuple[tuple[str, str], ...]) -> DeltaFileSystemHandler:
    return DeltaFileSystemHandler(root, dict(options_key) or None)


def _remote(root: str, storage_options: Mapping[str, str] | None) -> DeltaFileSystemHandler:
    try:
        return _handler(root, tuple(sorted((storage_options or {}).items())))
    except Exception as exc:  # delta-rs's errors: an unknown scheme, bad options
        raise StoreError(f"cannot reach {root}: {_one_line(exc)}", path=root, cause=exc) from exc


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _not_found(exc: BaseException) -> bool:
    if isinstance(exc, FileNotFoundError):
        return True
    text = str(exc).lower()
    return "not found" in text or "notfound" in text or "no such" in text or "does not exist" in text


def _check(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"object path {path!r} must be relative, without empty, . or .. parts", path=path)
    return path


def put_object(root: str, path: str, data: bytes, storage_options: Mapping[str, str] | None = None) -> None:
    """Write ``data`` as the whole object ``path`` under ``root``, replacing any object there.

    Raises:
        StoreError: it could not be written (on a local disk nothing is left half written).
    """
    _check(path)
    local = local_path(root)
    if local is not None:
        target = os.path.join(local, *path.split("/"))
        temporary = os.path.join(os.path.dirname(target), f".{uuid.uuid4().hex}.tmp")
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(temporary, "wb") as f:
                f.write(data)
            os.replace(temporary, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise StoreError(f"cannot write {root}/{path}: {_one_line(exc)}", path=path, cause=exc) from exc
        return
    handler = _remote(root, storage_options)
    try:
        out: Any = handler.open_output_stream(path)  # its stub lacks close()
        try:
            out.write(bytes(data))
        finally:
            out.close()
    except Exception as exc:
        raise StoreError(f"cannot write {root}/{path}: {_one_line(exc)}", path=path, cause=exc) from exc


def get_object(root: str, path: str, storage_options: Mapping[str, str] | None = None) -> bytes | None:
    """The whole object ``path`` under ``root``, or None when there is none.

    Raises:
        StoreError: it exists but cannot be read, or the store cannot be reached.
    """
    _check(path)
    local = local_path(root)
    try:
        if local is not None:
            with open(os.path.join(local, *path.split("/")), "rb") as f:
                return f.read()
        source = _remote(root, storage_options).open_input_file(path)
        return bytes(source.read(source.size()))
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return None
        raise StoreError(f"cannot read {root}/{path}: {_one_line(exc)}", path=path, cause=exc) from exc


def list_objects(
    root: str, prefix: str, storage_options: Mapping[str, str] | None = None
) -> list[ObjectInfo]:
    """Every object under the folder ``prefix`` of ``root`` (recursively), sorted by path; empty
    when there is none.

    Raises:
        StoreError: the folder cannot be listed.
    """
    _check(prefix)
    local = local_path(root)
    out: list[ObjectInfo] = []
    try:
        if local is not None:
            base = os.path.join(local, *prefix.split("/"))
            for folder, _dirs, files in os.walk(base):
                rel = os.path.relpath(folder, local).replace(os.sep, "/")
                for name in files:
                    with contextlib.suppress(FileNotFoundError):  # removed while listed
                        size = os.stat(os.path.join(folder, name)).st_size
                        out.append(ObjectInfo(f"{rel}/{name}", size))
        else:
            infos = _remote(root, storage_options).get_file_info_selector(prefix, True, True)
            out = [ObjectInfo(i.path, int(i.size or 0)) for i in infos if i.type == pa_fs.FileType.File]
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return []
        raise StoreError(f"cannot list {root}/{prefix}: {_one_line(exc)}", path=prefix, cause=exc) from exc
    return sorted(out, key=lambda info: info.path)


def delete_object(root: str, path: str, storage_options: Mapping[str, str] | None = None) -> None:
    """Delete the object ``path`` under ``root`` (nothing happens when it is gone).

    Raises:
        StoreError: it could not be deleted.
    """
    _check(path)
    local = local_path(root)
    try:
        if local is not None:
            os.unlink(os.path.join(local, *path.split("/")))
        else:
            _remote(root, storage_options).delete_file(path)
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return
        raise StoreError(f"cannot delete {root}/{path}: {_one_line(exc)}", path=path, cause=exc) from exc


def delete_prefix(root: str, prefix: str, storage_options: Mapping[str, str] | None = None) -> None:
    """Delete every object under the folder ``prefix`` of ``root`` (nothing happens when there is none).

    Raises:
        StoreError: they could not be deleted.
    """
    _check(prefix)
    local = local_path(root)
    try:
        if local is not None:
            shutil.rmtree(os.path.join(local, *prefix.split("/")))
        else:
            _remote(root, storage_options).delete_dir(prefix)
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return
        raise StoreError(f"cannot delete {root}/{prefix}: {_one_line(exc)}", path=prefix, cause=exc) from exc
