"""The store's side files (saved marks, job statuses, staged rows, commit files read back): whole
objects put, got, listed and deleted under a root, on a local disk or on an object store.

On S3 (``s3://``, ``s3a://``) objects go through obstore (:func:`s3_client`): the Python bindings of
the Rust ``object_store`` crate delta-rs itself uses, built from the same storage options (one client
per bucket and set of options). A get is one GET (delta-rs's storage handler asks a HEAD first), a
put one PUT (the handler uploads through multipart: three requests), and a put can be conditional
(``If-None-Match: *``), which the handler cannot do: the direct commits of
:mod:`engine.store.delta.direct_append` stand on it. Other object stores go through delta-rs's
storage handler.

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
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import obstore
import pyarrow.fs as pa_fs
from deltalake._internal import DeltaFileSystemHandler
from obstore.store import S3Store

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
    if "://" in uri:
        return None
    # (an absolute path resolves the same from anywhere: no working directory to ask the kernel for;
    # the broker process's dispatch asked for it a few thousand times a second under sync sends)
    return _resolved(uri, "/" if os.path.isabs(uri) else os.getcwd())


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
    text = str(exc).lower()
    if "nosuchbucket" in text or "bucket does not exist" in text:
        return False  # the whole store is missing, not one object: an error (obstore: a 404 too)
    if isinstance(exc, FileNotFoundError):
        return True
    return "not found" in text or "notfound" in text or "no such" in text or "does not exist" in text


# ----------------------------------------------------------------------------- S3 through obstore
S3_SCHEMES = ("s3", "s3a")
# delta-rs's storage options that object_store's HTTP client takes (the rest, minus the S3 keys
# below, are delta-rs's own: locking providers, unsafe renames; object_store does not know them).
_CLIENT_KEYS = frozenset(
    [
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    ]
)
_S3_KEYS = frozenset(
    [
        "access_key_id",
        "checksum_algorithm",
        "conditional_put",
        "container_credentials_relative_uri",
        "container_credentials_full_uri",
        "copy_if_not_exists",
        "default_region",
        "disable_tagging",
        "endpoint",
        "metadata_endpoint",
        "region",
        "request_payer",
        "role_arn",
        "role_session_name",
        "secret_access_key",
        "server_side_encryption",
        "session_token",
        "skip_signature",
        "sse_bucket_key_enabled",
        "sse_kms_key_id",
        "sts_endpoint",
        "unsigned_payload",
        "virtual_hosted_style_request",
        "web_identity_token_file",
    ]
)
_S3_SYNONYMS = {"endpoint_url": "endpoint", "token": "session_token"}
_SECRET_PARTS = ("secret", "token", "password")


def s3_config(storage_options: Mapping[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """obstore's S3 configuration and HTTP client options for delta-rs ``storage_options``: the same
    keys (``AWS_ACCESS_KEY_ID``, ``aws_endpoint``, ``AWS_ALLOW_HTTP``, ``timeout``, ...), any case,
    with or without ``aws_``; delta-rs's own keys are left out (its retry keys: :func:`s3_retries`).
    Commits are put with ``If-None-Match: *`` (``conditional_put = etag`` unless given)."""
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    for key, value in (storage_options or {}).items():
        base = key.lower().removeprefix("aws_")
        base = _S3_SYNONYMS.get(base, base)
        if base in _CLIENT_KEYS:
            client[base] = value
        elif base in _S3_KEYS:
            config[base] = value
    config.setdefault("conditional_put", "etag")
    return config, client


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min)?\s*$")


def s3_retries(storage_options: Mapping[str, str] | None) -> dict[str, Any]:
    """obstore's retry settings from delta-rs's ``max_retries`` and ``retry_timeout`` (``"30s"``,
    ``"500ms"``, ``"2m"``; seconds without a unit); empty: object_store's defaults.

    Raises:
        StoreError: a value is not a count or a duration.
    """
    out: dict[str, Any] = {}
    for key, value in (storage_options or {}).items():
        name = key.lower()
        if name == "max_retries":
            if not value.strip().isdigit():
                raise StoreError(f"storage option max_retries must be a count, not {value!r}")
            out["max_retries"] = int(value)
        elif name == "retry_timeout":
            found = _DURATION.match(value)
            if found is None:
                raise StoreError(f"storage option retry_timeout must be a duration (30s), not {value!r}")
            scale = {"ms": 0.001, "m": 60.0, "min": 60.0}.get(found.group(2) or "s", 1.0)
            out["retry_timeout"] = timedelta(seconds=float(found.group(1)) * scale)
    return out


@lru_cache(maxsize=64)
def _s3_store(bucket: str, options_key: tuple[tuple[str, str], ...]) -> S3Store:
    options = dict(options_key)
    config, client = s3_config(options)
    retries = s3_retries(options)
    return S3Store(
        bucket,
        config=config,  # type: ignore[arg-type]
        client_options=client,  # type: ignore[arg-type]
        retry_config=retries or None,  # type: ignore[arg-type]
    )


def s3_client(root: str, storage_options: Mapping[str, str] | None) -> tuple[S3Store, str] | None:
    """The obstore client of the bucket of an ``s3://`` or ``s3a://`` ``root`` and the key prefix of
    the root in it (``""`` or ending with ``/``); None for any other root. One client per bucket and
    set of options, kept for the process.

    Raises:
        StoreError: the options are refused.
    """
    parts = urlsplit(root)
    if parts.scheme not in S3_SCHEMES or not parts.netloc:
        return None
    prefix = unquote(parts.path).strip("/")
    try:
        store = _s3_store(parts.netloc, tuple(sorted((storage_options or {}).items())))
    except StoreError:
        raise
    except Exception as exc:  # obstore's errors: bad options
        raise storage_failure(_secretless(exc, storage_options), f"cannot reach {root}", root) from exc
    return store, f"{prefix}/" if prefix else ""


def _secretless(exc: BaseException, storage_options: Mapping[str, str] | None) -> BaseException:
    """``exc``, or an error without its text when that text holds a secret of the options."""
    text = str(exc)
    for key, value in (storage_options or {}).items():
        if value and any(part in key.lower() for part in _SECRET_PARTS) and value in text:
            return RuntimeError(f"{type(exc).__name__} (its message held a credential and is not shown)")
    return exc


def put_new_object(
    root: str, path: str, data: bytes, storage_options: Mapping[str, str] | None = None
) -> bool:
    """Put ``data`` as the object ``path`` under an S3 ``root`` only if no object has that name (one
    conditional PUT, ``If-None-Match: *``); False when one has (412: nothing was written).

    A 412 may also answer a retry of this very put whose first answer was lost (object_store retries
    a PUT that answered 5xx): a caller that must know reads the object back.

    Raises:
        StoreError: the root is not on S3, or the put failed; the object may have been written all
            the same when the answer was lost (a timeout, a 5xx after every retry).
    """
    _check(path)
    client = s3_client(root, storage_options)
    if client is None:
        raise StoreError(f"conditional puts are made on S3 only, not at {root}", path=path)
    store, prefix = client
    try:
        obstore.put(store, prefix + path, data, mode="create")
    except FileExistsError:
        return False
    except Exception as exc:  # obstore's errors
        if isinstance(exc, obstore.exceptions.AlreadyExistsError):
            return False
        raise _s3_failure(exc, f"cannot write {root}/{path}", root, storage_options, path=path) from exc
    return True


def _s3_failure(
    exc: BaseException, message: str, root: str, storage_options: Mapping[str, str] | None, **context: Any
) -> StoreError:
    return storage_failure(_secretless(exc, storage_options), message, root, **context)


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
    client = s3_client(root, storage_options)
    if client is not None:
        store, prefix = client
        try:
            obstore.put(store, prefix + path, bytes(data))
        except Exception as exc:  # obstore's errors
            raise _s3_failure(exc, f"cannot write {root}/{path}", root, storage_options, path=path) from exc
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
        client = s3_client(root, storage_options)
        if client is not None:
            return obstore.get(client[0], client[1] + path).bytes().to_bytes()
        source = _remote(root, storage_options).open_input_file(path)
        return bytes(source.read(source.size()))
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return None
        raise _s3_failure(exc, f"cannot read {root}/{path}", root, storage_options, path=path) from exc


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
        client = s3_client(root, storage_options)
        if client is not None:
            obstore.head(client[0], client[1] + path)
        else:
            _remote(root, storage_options).open_input_file(path)
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return False
        raise _s3_failure(exc, f"cannot look for {root}/{path}", root, storage_options, path=path) from exc
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
        elif (client := s3_client(root, storage_options)) is not None:
            store, base = client
            for chunk in obstore.list(store, base + prefix + "/", chunk_size=1000):
                out += [ObjectInfo(str(o["path"]).removeprefix(base), int(o["size"])) for o in chunk]
        else:
            infos = _remote(root, storage_options).get_file_info_selector(prefix, True, True)
            out = [ObjectInfo(i.path, int(i.size or 0)) for i in infos if i.type == pa_fs.FileType.File]
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return []
        raise _s3_failure(exc, f"cannot list {root}/{prefix}", root, storage_options, path=prefix) from exc
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
        elif (client := s3_client(root, storage_options)) is not None:
            obstore.delete(client[0], client[1] + path)
        else:
            _remote(root, storage_options).delete_file(path)
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return
        raise _s3_failure(exc, f"cannot delete {root}/{path}", root, storage_options, path=path) from exc


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
        elif (client := s3_client(root, storage_options)) is not None:
            store, base = client
            for chunk in obstore.list(store, base + prefix + "/", chunk_size=1000):
                obstore.delete(store, [str(o["path"]) for o in chunk])
        else:
            _remote(root, storage_options).delete_dir(prefix)
    except StoreError:
        raise
    except Exception as exc:
        if _not_found(exc):
            return
        raise _s3_failure(exc, f"cannot delete {root}/{prefix}", root, storage_options, path=prefix) from exc
