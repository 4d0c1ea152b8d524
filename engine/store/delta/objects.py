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
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pa_fs
from deltalake._internal import DeltaFileSystemHandler

from engine.errors import (
    BucketNotFoundError,
    StoreAccessDeniedError,
    StoreError,
    StoreUnreachableError,
)


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its path relative to the root, and its size in bytes."""

    path: str
    size: int


def local_path(uri: str) -> str | None:
    """The directory of a table (or store) on the local filesystem, or None for an object-store URI."""
    if uri.startswith("file://"):
        return unquote(uri.removeprefix("file://")).rstrip("/") or "/"
    return None if "://" in uri else _resolved(uri, os.getcwd())


@lru_cache(maxsize=256)
def _resolved(path: str, cwd: str) -> str:
    # Long polls ask for every table's newest commit on every poll: resolving the path (a stat of
    # each of its parts) cost more than the probe itself.
    return str(Path(cwd, path).resolve())


@lru_cache(maxsize=64)
def _handler(root: str, options_key: tuple[tuple[str, str], ...]) -> DeltaFileSystemHandler:
    return DeltaFileSystemHandler(root, dict(options_key) or None)


def _remote(root: str, storage_options: Mapping[str, str] | None) -> DeltaFileSystemHandler:
    # A root with a trailing slash (delta-rs's table URIs have one) makes the handler read empty
    # objects: it is cut off, as every root of the store is given without one.
    try:
        return _handler(root.rstrip("/"), tuple(sorted((storage_options or {}).items())))
    except Exception as exc:  # delta-rs's errors: an unknown scheme, bad options
        raise storage_failure(exc, f"cannot reach {root}", root, path=root) from exc


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ENDPOINT = re.compile(r"\b(https?://[^/\s]+)")
_DENIED = (
    "lacked the necessary privileges",
    "accessdenied",
    "signaturedoesnotmatch",
    "invalidaccesskeyid",
    "403 forbidden",
)
_UNREACHABLE = (
    "tcp connect error",
    "connection refused",
    "dns error",
    "failed to lookup address",
    "operation timed out",
    "connection reset",
    "error sending request",
)


def _one_line(exc: BaseException) -> str:
    """An error of delta-rs or object_store (a multi-line chain of causes, colour codes, an XML
    body) as one line: its first line and its innermost cause, at most 300 characters."""
    lines = [" ".join(line.replace("↳", " ").split()) for line in _ANSI.sub("", str(exc)).splitlines()]
    lines = [line for line in lines if line and not line.startswith("<")]
    text = lines[0] if lines else type(exc).__name__
    if len(lines) > 1 and lines[-1] != text:
        text = f"{text} ... {lines[-1]}"
    return text if len(text) <= 300 else text[:297] + "..."


def storage_failure(exc: BaseException, message: str, uri: str, **context: Any) -> StoreError:
    """The engine's error for a failure of delta-rs or its object store at ``uri``, in one line:
    :class:`BucketNotFoundError` (naming the bucket), :class:`StoreAccessDeniedError`,
    :class:`StoreUnreachableError` (naming the endpoint), else a :class:`StoreError` reading
    ``message: <the failure's first line and innermost cause>``."""
    raw = _ANSI.sub("", str(exc))
    low = raw.lower()
    bucket = urlsplit(uri).netloc if "://" in uri else ""
    if "nosuchbucket" in low or "bucket does not exist" in low:
        return BucketNotFoundError(
            f"bucket {bucket!r} does not exist (store location {uri}); create it first, or fix the URI",
            bucket=bucket,
            table=context.get("table", uri),
            cause=exc,
        )
    if any(marker in low for marker in _DENIED):
        code = next(
            (c for c in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied") if c in raw), "403"
        )
        return StoreAccessDeniedError(
            f"access to {uri} was denied by the object store ({code}): check the storage credentials "
            "and what they may do",
            table=context.get("table", uri),
            cause=exc,
        )
    if any(marker in low for marker in _UNREACHABLE):
        found = _ENDPOINT.search(raw)
        endpoint = found.group(1) if found else "?"
        return StoreUnreachableError(
            f"the object store of {uri} cannot be reached at {endpoint}: {_one_line(exc).split(' ... ')[-1]}",
            endpoint=endpoint,
            table=context.get("table", uri),
            cause=exc,
        )
    return StoreError(f"{message}: {_one_line(exc)}", cause=exc, **context)


def _not_found(exc: BaseException) -> bool:
    if isinstance(exc, FileNotFoundError):
        return True
    text = str(exc).lower()
    if "nosuchbucket" in text or "bucket does not exist" in text:
        return False  # the whole store is missing, not one object: an error
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
            raise storage_failure(exc, f"cannot write {root}/{path}", root, path=path) from exc
        return
    handler = _remote(root, storage_options)
    try:
        out: Any = handler.open_output_stream(path)  # its stub lacks close()
        try:
            out.write(bytes(data))
        finally:
            out.close()
    except Exception as exc:
        raise storage_failure(exc, f"cannot write {root}/{path}", root, path=path) from exc


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
        raise storage_failure(exc, f"cannot read {root}/{path}", root, path=path) from exc


def object_exists(root: str, path: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Whether the object ``path`` exists under ``root`` (one HEAD request on an object store).

    Raises:
        StoreError: the store cannot be asked.
    """
    _check(path)
    local = local_path(root)
    if local is not None:
        return os.path.exists(os.path.join(local, *path.split("/")))
    try:
        _remote(root, storage_options).open_input_file(path)
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return False
        raise storage_failure(exc, f"cannot look for {root}/{path}", root, path=path) from exc
    return True


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
        raise storage_failure(exc, f"cannot list {root}/{prefix}", root, path=prefix) from exc
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
        raise storage_failure(exc, f"cannot delete {root}/{path}", root, path=path) from exc


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
        raise storage_failure(exc, f"cannot delete {root}/{prefix}", root, path=prefix) from exc
