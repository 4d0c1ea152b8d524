"""Reading a Delta table's log version by version: the feed of every streaming broker job.

A version's new rows are the files its commit adds with ``dataChange = true``; compaction commits
(``dataChange = false``) add no new rows and are skipped. Works on local paths and object stores
through delta-rs's storage handler.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake.fs import DeltaStorageHandler

from engine.errors import CommitTruncatedError, StoreError
from engine.store.commit_markers import COUNTS_KEY
from engine.store.delta.objects import get_object, list_objects, local_path
from engine.store.delta.table_cache import TableCache

VERSION_COLUMN = "_version"
COMMIT_FILE = re.compile(r"^(\d{20})\.json$")  # a commit file's name in _delta_log; group 1: its version


@dataclass(frozen=True)
class VersionFiles:
    """What one commit added: data files, its commitInfo, and the app transactions it records.

    Attributes:
        version: the commit's version.
        files: the data files it added with ``dataChange = true``.
        commit_info: its commitInfo (empty when it has none).
        transactions: ``{app id: (version, lastUpdated or None)}`` of its ``txn`` actions.
        stats: the statistics (Delta's JSON) of each file of ``files``, None where it has none.
        rearranged: it removed files or added some without new data (compaction, retention).
    """

    version: int
    files: tuple[str, ...]
    commit_info: Mapping[str, Any]
    transactions: Mapping[str, tuple[int, int | None]] = field(default_factory=dict)
    stats: tuple[str | None, ...] = ()
    rearranged: bool = False


class _BytesOut:
    """An output stream of delta-rs's storage handler that takes what pyarrow writes: pyarrow hands
    a ``Buffer``, the handler's ``write`` only ``bytes`` (``TypeError`` otherwise)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.closed = False

    def write(self, data: Any) -> int:
        return int(self._raw.write(data if isinstance(data, bytes) else memoryview(data).tobytes()))

    def close(self) -> None:
        self.closed = True
        self._raw.close()

    def flush(self) -> None:
        return None  # each flush of the handler uploads a part: the whole file goes at close

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return int(self._raw.tell())


class _StorageHandler(DeltaStorageHandler):
    """delta-rs's storage handler, with output streams pyarrow can write to (:class:`_BytesOut`)."""

    def open_output_stream(self, path: str, metadata: dict[str, str] | None = None) -> pa.PythonFile:
        return pa.PythonFile(_BytesOut(self._handler.open_output_stream(path, metadata)), mode="w")


@lru_cache(maxsize=64)
def _filesystem(uri: str, options_key: tuple[tuple[str, str], ...]) -> pa_fs.FileSystem:
    path = local_path(uri)
    if path is not None:
        # Arrow's own local filesystem: a Python-backed filesystem (delta-rs's storage handler) called
        # from Arrow's I/O threads makes short-lived processes abort at exit ("terminate called
        # without an active exception"), see delta-rs#2184 and arrow#34314.
        return pa_fs.SubTreeFileSystem(path, pa_fs.LocalFileSystem())
    return pa_fs.PyFileSystem(_StorageHandler(uri, dict(options_key) or None))


def table_filesystem(uri: str, storage_options: Mapping[str, str] | None = None) -> pa_fs.FileSystem:
    """A PyArrow filesystem rooted at a Delta table (paths relative to the table)."""
    return _filesystem(uri, tuple(sorted((storage_options or {}).items())))


# delta-rs's operationMetrics keys that count a commit's file actions (writes; optimize).
_METRIC_COUNTS = {
    "add": ("num_added_files", "numFilesAdded"),
    "remove": ("num_removed_files", "numFilesRemoved"),
}


def expected_counts(commit_info: Mapping[str, Any]) -> dict[str, int]:
    """How many actions of each kind a commit's commitInfo says it holds (the kinds it records)."""
    expected: dict[str, int] = {}
    metrics = commit_info.get("operationMetrics")
    if isinstance(metrics, Mapping):
        for kind, keys in _METRIC_COUNTS.items():
            for key in keys:
                if isinstance(metrics.get(key), int):
                    expected[kind] = int(metrics[key])
    raw = commit_info.get(COUNTS_KEY)
    if raw is not None:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            expected.update({str(k): int(v) for k, v in json.loads(str(raw)).items()})
    return expected


def missing_actions(actions: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """``{kind: (recorded, present)}`` for each kind of action a commit holds fewer of than its
    commitInfo records: non-empty when the commit file was cut short at a line break (whole lines
    gone, so it still parses). Empty for a complete commit, and for one without a commitInfo."""
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), None)
    if not isinstance(info, Mapping):
        return {}
    present: dict[str, int] = {}
    for action in actions:
        for kind in action:
            present[kind] = present.get(kind, 0) + 1
    return {
        kind: (count, present.get(kind, 0))
        for kind, count in expected_counts(info).items()
        if present.get(kind, 0) != count
    }


def parse_commit(text: str, path: str, version: int | None = None) -> list[dict[str, Any]]:
    """The actions of one commit file, checked to be whole.

    Raises:
        CommitTruncatedError: the file holds fewer actions than its commitInfo records.
        ValueError: a line is not JSON.
    """
    actions = [json.loads(line) for line in text.splitlines() if line.strip()]
    missing = missing_actions(actions)
    if missing:
        detail = ", ".join(
            f"{kind}: {present} of {count}" for kind, (count, present) in sorted(missing.items())
        )
        raise CommitTruncatedError(
            f"commit file {path} is cut short ({detail} actions its commitInfo records are present); "
            "it was truncated at a line break, most likely by a crash before it reached the disk",
            path=path,
            version=version,
            missing=detail,
        )
    return actions


def _log_path(version: int) -> str:
    return f"_delta_log/{version:020d}.json"


def last_checkpoint_version(table_dir: str) -> int | None:
    """The version a local table's ``_delta_log/_last_checkpoint`` names; None when it has none.

    Raises:
        OSError, ValueError, KeyError, TypeError: the hint is unreadable or malformed.
    """
    hint = os.path.join(table_dir, "_delta_log", "_last_checkpoint")
    try:
        stat = os.stat(hint)
    except FileNotFoundError:
        return None
    # Long polling and every pull ask many times a second; the hint changes once per checkpoint.
    key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    known = _CHECKPOINT_HINTS.get(hint)
    if known is not None and known[0] == key:
        return known[1]
    try:
        with open(hint, encoding="utf-8") as f:
            version = int(json.load(f)["version"])
    except FileNotFoundError:
        return None
    if len(_CHECKPOINT_HINTS) >= 1024:
        _CHECKPOINT_HINTS.clear()
    _CHECKPOINT_HINTS[hint] = (key, version)
    return version


# Per local ``_last_checkpoint`` file: (mtime, size, inode) when read -> the version it names.
_CHECKPOINT_HINTS: dict[str, tuple[tuple[int, int, int], int]] = {}


def probe_latest_version(
    uri: str, at_least: int = -1, storage_options: Mapping[str, str] | None = None, *, remote: bool = False
) -> int | None:
    """The newest version of a local table, found by looking for its commit files one by one from
    ``at_least`` (or the newest checkpoint, if later) on; None for an object store, or when the
    version to start from has no commit file (cleaned up, or no table): list the log then.

    With ``remote``, an object store is probed too, from ``at_least`` (a version known to exist;
    None without one) by reading the commit files after it (:func:`latest_commit`).

    Why not list: a directory listing is no snapshot. A commit file linked in while the directory is
    read may be missed while a later one is seen, and delta-rs then refuses the log ("Expected
    contiguous commit files"); with commits arriving every few milliseconds and a ``_delta_log`` of
    thousands of files that is most listings (the soak's broker died of it). Every commit file up to
    the version probed here existed before a listing that follows starts, so a load of exactly that
    version sees them all.
    """
    path = local_path(uri)
    if path is None:
        return latest_commit(uri, at_least, storage_options) if remote and at_least >= 0 else None
    log = os.path.join(path, "_delta_log")
    start = at_least
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        checkpoint = last_checkpoint_version(path)
        if checkpoint is not None:
            start = max(start, checkpoint)
    start = max(start, 0)
    if not os.path.exists(os.path.join(log, f"{start:020d}.json")):
        return None
    version = start
    while os.path.exists(os.path.join(log, f"{version + 1:020d}.json")):
        version += 1
    return version


def earliest_version(uri: str, storage_options: Mapping[str, str] | None = None) -> int:
    """The oldest version of a table whose commit file is still in its log (0 when the log keeps
    every commit, or has none): log retention removes commits older than the newest checkpoint it
    keeps, and nothing can read changes from before this version.
    """
    listed = list_objects(uri, "_delta_log", storage_options)
    names = (info.path.removeprefix("_delta_log/") for info in listed)
    versions = [int(m.group(1)) for m in (COMMIT_FILE.match(name) for name in names) if m]
    return min(versions, default=0)


# Commit files read, by (table URI, version). A commit file never changes once
# written, and on an object store each read costs round trips (a HEAD and a GET): the broker jobs
# read every new commit-log version for its rows, and again for the app transactions it records
# (Snapshot.app_version), so each is fetched once. Local reads are kept by the commit file's
# identity (inode, size, modification time): a local table may be removed and made again under the
# same path, and the dispatch and index jobs and the pull path parse each new commit in turn.
COMMIT_CACHE_SIZE = 1024
_commits: OrderedDict[tuple[int | str, ...], VersionFiles] = OrderedDict()
_commits_lock = threading.Lock()


def read_version(uri: str, version: int, storage_options: Mapping[str, str] | None = None) -> VersionFiles:
    """Parse one commit file of a table's log (on an object store, once per process: see
    :data:`COMMIT_CACHE_SIZE`).

    Raises:
        StoreError: the commit file is gone (the reader fell behind log retention) or unreadable.
        CommitTruncatedError: the commit file was cut short at a line break.
    """
    parsed = _version_if_there(uri, version, storage_options)
    if parsed is None:
        raise StoreError(
            f"commit {version} of {uri} is gone; a reader that fell behind the log retention must be "
            "restarted from a newer version",
            table=uri,
            version=version,
        )
    return parsed


def _version_if_there(
    uri: str, version: int, storage_options: Mapping[str, str] | None
) -> VersionFiles | None:
    """:func:`read_version`, or None when the commit file is not there (not kept: it may come)."""
    root = local_path(uri)
    key: tuple[str, int] | tuple[str, int, int, int, int] = (uri.rstrip("/"), version)
    if root is not None:
        # A local commit file is known by its identity too: a table removed and made again under
        # the same path is read anew, and a file still being written is not kept as it was.
        try:
            st = os.stat(os.path.join(root, _log_path(version)))
        except FileNotFoundError:
            return None
        except OSError:
            st = None
        key = (*key, st.st_ino, st.st_size, st.st_mtime_ns) if st is not None else key
        cacheable = st is not None
    else:
        cacheable = True
    if cacheable:
        with _commits_lock:
            cached = _commits.get(key)
            if cached is not None:
                _commits.move_to_end(key)
                return cached
    parsed = _read_version(uri, version, storage_options)
    if cacheable and parsed is not None:
        with _commits_lock:
            _commits[key] = parsed
            while len(_commits) > COMMIT_CACHE_SIZE:
                _commits.popitem(last=False)
    return parsed


def _read_version(uri: str, version: int, storage_options: Mapping[str, str] | None) -> VersionFiles | None:
    try:
        data = get_object(uri, _log_path(version), storage_options)
        text = None if data is None else data.decode()
    except (StoreError, UnicodeDecodeError) as exc:
        raise StoreError(
            f"commit {version} of {uri} cannot be read: {exc}", table=uri, version=version, cause=exc
        ) from exc
    if text is None:
        return None
    files: list[str] = []
    stats: list[str | None] = []
    rearranged = False
    info: Mapping[str, Any] = {}
    txns: dict[str, tuple[int, int | None]] = {}
    for action in parse_commit(text, f"{uri}/{_log_path(version)}", version):
        if "add" in action and action["add"].get("dataChange", True):
            files.append(unquote(action["add"]["path"]))
            stats.append(action["add"].get("stats"))
        elif "add" in action or "remove" in action:
            rearranged = True
        elif "commitInfo" in action:
            info = action["commitInfo"]
        elif "txn" in action:
            txn = action["txn"]
            updated = txn.get("lastUpdated")
            txns[str(txn["appId"])] = (int(txn["version"]), None if updated is None else int(updated))
    return VersionFiles(version, tuple(files), info, txns, tuple(stats), rearranged)


# Files fetched at once from an object store by one read of versions (each fetch is a HEAD and a GET
# of a round trip each; a dispatch batch reads one commit file and one data file per version).
PARALLEL_FETCHES = 8
_FETCHES = ThreadPoolExecutor(PARALLEL_FETCHES, thread_name_prefix="mq-log-reads")


def _gone(uri: str, path: str, exc: BaseException | str) -> StoreError:
    return StoreError(
        f"data file {path} of {uri} is gone ({exc}); it was vacuumed before this reader got to it",
        table=uri,
        cause=exc if isinstance(exc, BaseException) else None,
    )


# Files smaller than this are read on the calling thread without read-ahead (:func:`read_whole`).
SMALL_FILE_BYTES = 1 << 20


def read_whole(source: str | pa.NativeFile, size: int) -> pa.Table:
    """A whole parquet file (a path, or an open file of ``size`` bytes). A small one is read on the
    calling thread without pre-buffering: for the files of a commit or a dispatch tick pyarrow's
    thread pool and read-ahead cost more than the decoding (a 4-row commit-log file: 566 -> 326 us).

    Raises:
        OSError, pyarrow.ArrowException: it cannot be read.
    """
    if size < SMALL_FILE_BYTES:
        return pq.ParquetFile(source, pre_buffer=False).read(use_threads=False)
    return pq.ParquetFile(source).read()


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table | None:
    """``table`` as ``schema`` (its columns in that order), or None when it lacks one of them or
    holds it as another type (a file of an older schema: read it as ``schema`` instead)."""
    if table.schema.equals(schema, check_metadata=False):
        return table
    if all(table.schema.get_field_index(n) >= 0 for n in schema.names):
        part = table.select(schema.names)
        if part.schema.equals(schema, check_metadata=False):
            return part
    return None


def _read_remote_file(
    uri: str, path: str, schema: pa.Schema, storage_options: Mapping[str, str] | None
) -> pa.Table:
    """One data file on an object store, fetched whole (a HEAD and a GET) and parsed in memory:
    pyarrow's reader over the storage handler would also list the path as a folder and fetch the
    footer and the columns apart (five requests for a one-message file)."""
    data = get_object(uri, path, storage_options)
    if data is None:
        raise _gone(uri, path, "not found")
    table = _conform(read_whole(pa.BufferReader(data), len(data)), schema)
    return table if table is not None else pq.read_table(pa.BufferReader(data), schema=schema)


def latest_commit(uri: str, known: int, storage_options: Mapping[str, str] | None = None) -> int:
    """The newest version of a table on an object store, found by reading its commit files on from
    ``known`` (an existing version): the next one, the one after, then two at once, four, ...
    until one is missing. Each commit file found is kept, so reading the new versions
    (:func:`read_versions`) costs no request more; finding nothing new costs one HEAD.

    Why not list the log: an object store's reads are consistent, so a commit file read is a
    commit made; and a listing of the log (delta-rs's refresh) is a request whatever it finds, with
    two more per new version. Use on object stores only: a local directory has
    :func:`probe_latest_version`.

    Raises:
        StoreError: the store cannot be reached.
    """
    windows = 0
    while True:
        # 1, 1, 2, 4, ...: a follower at the head finds one new commit most of the time, and a look
        # past it costs a request; a reader behind by many finds them several at once.
        window = min(1 << max(windows - 1, 0), PARALLEL_FETCHES)
        ahead = range(known + 1, known + 1 + window)
        found = list(_FETCHES.map(lambda v: _version_if_there(uri, v, storage_options), ahead))
        for v, there in zip(ahead, found, strict=True):
            if there is None:
                return known
            known = v
        windows += 1


def read_files(
    uri: str,
    files: Sequence[str],
    schema: pa.Schema,
    storage_options: Mapping[str, str] | None = None,
    version: int | None = None,
) -> pa.Table:
    """Read data files of a table, cast to ``schema``; adds ``_version`` when ``version`` is given.

    On an object store the files are fetched whole, several at once.

    Raises:
        StoreError: a file is gone (vacuumed) or cannot be read.
    """
    if local_path(uri) is None:
        parts = list(_FETCHES.map(lambda p: _read_remote_file(uri, p, schema, storage_options), files))
    else:
        root = local_path(uri)
        assert root is not None
        parts = []
        for path in files:
            try:
                parts.append(_read_local_file(root, path, schema, uri, storage_options))
            except (FileNotFoundError, OSError) as exc:
                raise _gone(uri, path, exc) from exc
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    if version is not None:
        table = table.append_column(VERSION_COLUMN, pa.array([version] * table.num_rows, pa.int64()))
    return table


LOCAL_FILES = TableCache(64 << 20)
"""Whole local data files read by :func:`read_versions` lately, or written by this process or fed
to it (:mod:`~engine.store.delta.file_feed`), 64 MiB, shared by every reader in the process: the
dispatch, index and schedule jobs and the pull path all read the newest commit-log versions. Known
by the file's path and identity (inode, size, modification time), so a table removed and made again
under the same path is read anew."""


LOCAL_FILE_MISS_HOOKS: list[Callable[[], object]] = []
"""Called when a local file is not in :data:`LOCAL_FILES`, before it is read: a file feed's intake
takes what was sent meanwhile (a file fed before its commit was there is in the feed's socket by
the time a reader sees the commit)."""


_local_files_read = False  # a reader of this process has looked in LOCAL_FILES


def local_files_read() -> bool:
    """Whether this process reads local data files through :data:`LOCAL_FILES` (a producer that
    only writes has no use for keeping what it wrote)."""
    return _local_files_read


def local_file_key(path: str, st: os.stat_result) -> tuple[str, int, int, int]:
    """The key of the local file ``path`` (``st``: its ``os.stat``) in :data:`LOCAL_FILES`."""
    return (path, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_local_file(
    root: str, path: str, schema: pa.Schema, uri: str, storage_options: Mapping[str, str] | None
) -> pa.Table:
    # ParquetFile(...).read() costs about half of read_table's dataset machinery on the small files
    # of one commit (360 against 630 us), and the followers of a log read one or more per version;
    # a file of an older schema (a column added since) goes through read_table, which fills it in.
    # A reader of some columns (the index and dispatch jobs) takes them from the whole file, which
    # the other readers of the same version share.
    global _local_files_read
    _local_files_read = True
    full = os.path.join(root, path)
    st = os.stat(full)
    key = local_file_key(full, st)
    table = LOCAL_FILES.get(key)
    if table is None and LOCAL_FILE_MISS_HOOKS:
        for hook in list(LOCAL_FILE_MISS_HOOKS):
            hook()
        table = LOCAL_FILES.get(key)
    if table is None:
        table = read_whole(full, st.st_size)
        LOCAL_FILES.put(key, table)
    conformed = _conform(table, schema)
    if conformed is not None:
        return conformed
    return pq.read_table(path, filesystem=table_filesystem(uri, storage_options), schema=schema)


ONE_CHUNK_BYTES = 64 << 20
"""Rows read from several files are copied into one chunk up to this size: a filter, take or sort
of a table costs per chunk (a filter of 65 chunks of 4 rows 1.4 ms, copying them into one 83 us).
Bigger reads stay in chunks (a binary column of one chunk holds at most 2 GiB)."""


def _one_chunk(table: pa.Table) -> pa.Table:
    return table.combine_chunks() if table.nbytes <= ONE_CHUNK_BYTES else table


def read_versions(
    uri: str,
    first: int,
    last: int,
    schema: pa.Schema,
    storage_options: Mapping[str, str] | None = None,
) -> pa.Table:
    """Rows added by versions ``first..last`` (inclusive), in commit order, with ``_version``, in one
    chunk unless they are big (:func:`_one_chunk`).

    On an object store the commit files, then the data files, are fetched several at once (a
    dispatch batch behind by a few versions would otherwise wait a round trip per request in turn).

    Raises:
        StoreError: a commit or data file is gone or unreadable.
    """
    out_schema = schema.append(pa.field(VERSION_COLUMN, pa.int64()))
    versions = range(first, last + 1)
    if local_path(uri) is None and len(versions) > 1:
        commits = list(_FETCHES.map(lambda v: read_version(uri, v, storage_options), versions))
        wanted = [(vf.version, path) for vf in commits for path in vf.files]
        tables = list(_FETCHES.map(lambda vp: _read_remote_file(uri, vp[1], schema, storage_options), wanted))
        parts = [
            t.append_column(VERSION_COLUMN, pa.array([v] * t.num_rows, pa.int64()))
            for (v, _), t in zip(wanted, tables, strict=True)
        ]
        return _one_chunk(pa.concat_tables(parts)) if parts else out_schema.empty_table()
    parts = []
    for v in versions:
        vf = read_version(uri, v, storage_options)
        if vf.files:
            parts.append(read_files(uri, vf.files, schema, storage_options, version=v))
    return _one_chunk(pa.concat_tables(parts)) if parts else out_schema.empty_table()
