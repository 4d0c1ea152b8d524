"""Blind appends to a Delta table, committed by the engine itself instead of through delta-rs.

An append to the commit log is one data file and one commit file. delta-rs takes about 12 ms of CPU
for it on the bench machine (its writer, its conflict check and the replay of every commit since the
last checkpoint), most of which a writer that already knows the version it commits on (the
sequencer does: it read every commit before it) does not need. Here the data file is written with
pyarrow (with the statistics Delta readers skip files by) and the commit file is put at exactly the
next version with put-if-absent: written as a file without a name (``O_TMPFILE``; where the file
system has none, under a temporary name), then hard-linked to ``<version>.json``, which fails if that
name exists, so two writers never both take a version (the same primitive delta-rs uses on a local
file system). Measured on the bench machine: about 2.5 ms
per one-message append against 12.6 ms through ``write_deltalake``.

The files go through a small seam, :data:`LogObjects`: a data file written, a commit put at its
version if absent, a commit read, a version looked for, the last checkpoint read. On a local disk
(:class:`LocalLogObjects`) as above; on S3 (:class:`S3LogObjects`, the reference) through obstore, the
bindings of the ``object_store`` crate delta-rs itself uses: the data file in one PUT and the commit
in one conditional PUT (``If-None-Match: *``), so a one-message append costs two round trips where
delta-rs lists and reads the log before its own conditional PUT. A put whose answer was lost (a 5xx
that object_store retried into a 412, a timeout) is resolved by reading the commit back and comparing
it with the text put: the same text is this commit (landed), another is a lost race, none is unknown.
Only writers that follow the log closely enough to know the next version ask for S3
(``direct_appender(..., on_s3=True)``: the commit-log writer); the other direct writers stay local.

The commit is what Delta's protocol asks of a writer of version 1/2 tables: a ``commitInfo``
(operation ``WRITE``, ``isBlindAppend``) and one ``add`` action with ``dataChange`` and its
statistics (``numRecords``, ``minValues``, ``maxValues``, ``nullCount`` over the table's statistics
columns). Only tables that ask nothing more qualify (:func:`direct_appender`): reader version 1,
writer version at most 2 (appendOnly and invariants; no invariant may be set on a column), not
partitioned, and of exactly the schema the rows have. A commit may carry app transactions (``txn``
actions, which version 2 writers write): the action log's lease decisions
(:mod:`engine.store.delta.followed_log`). Anything else (other object stores, newer protocols) goes through
delta-rs, and both kinds of commit interleave on one log: each lands on the next version or not at
all.

A writer that commits here follows the log by reading the commit files after its version
(:meth:`DirectAppender.read_commit`) instead of refreshing a delta-rs handle (about 5 ms per version
at 50 files, 14 ms at 1,000). One hazard is its own: a writer whose next commit file was removed by
log cleanup (it sat idle beyond the log retention while others committed and checkpointed) would see
no successor and put its commit at a version the log has passed. Cleanup only removes commit files
older than the newest checkpoint, so a writer that finds no successor first checks that no
checkpoint stands past its version (:meth:`DirectAppender.passed_by_checkpoint`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction

from engine.errors import (
    BucketNotFoundError,
    CommitConflictError,
    CommitStateUnknownError,
    StoreAccessDeniedError,
    StoreError,
)
from engine.store.commit_markers import BATCH_KEY, COUNTS_KEY
from engine.store.delta.data_files import StatsColumns, file_stats
from engine.store.delta.file_feed import wrote_local_file
from engine.store.delta.log import last_checkpoint_version, parse_commit, probe_latest_version
from engine.store.delta.objects import (
    get_object,
    local_path,
    object_exists,
    put_new_object,
    put_object,
    s3_client,
)
from engine.store.delta.snapshot import Snapshot

DIRECT_ENV = "MQ_DIRECT_APPEND"
ENGINE_INFO = "lakemq"
# A writer that found no commit after its version trusts that look this long (far below any log
# retention, which is at least a minute): a commit file is only cleaned up once older than the log
# retention, so a successor made after the look is still there while the look is younger than that.
# An older look proves nothing (the successor may be gone, see the module docstring): look again
# another way (a checkpoint past the version, or a snapshot opened anew).
STALE_LOOK_S = 60.0


class LogCommit:
    """One commit file read by a direct appender: its commitInfo, and whether it changed the table's
    protocol or metadata (then the appender must be made anew, see :func:`direct_appender`).

    A commit this module wrote (:func:`plain_info_line`) keeps its commitInfo line unparsed until
    :attr:`commit_info` is asked for: a writer following the log parses only the newest commits it
    needs for its marks (:func:`engine.store.commit_log.marks.covering`), and reads the batch id of the others
    from the line (:attr:`batch_id`).
    """

    __slots__ = ("_info", "_line", "changes_table", "version")

    def __init__(
        self,
        version: int,
        commit_info: Mapping[str, Any] | None,
        changes_table: bool,
        *,
        info_line: str | None = None,
    ) -> None:
        self.version = version
        self.changes_table = changes_table
        self._info = commit_info
        self._line = info_line

    @property
    def commit_info(self) -> Mapping[str, Any]:
        """The commitInfo action (empty for a commit without one).

        Raises:
            StoreError: the commitInfo line is not JSON.
        """
        if self._info is None:
            try:
                info = json.loads(self._line or "{}").get("commitInfo", {})
            except (ValueError, AttributeError) as exc:
                raise StoreError(f"commit {self.version} has a commitInfo that is not JSON: {exc}") from exc
            self._info = info if isinstance(info, Mapping) else {}
        return self._info

    @property
    def batch_id(self) -> str | None:
        """The commit's batch id (``mq.batch``), read from the unparsed line where there is one."""
        if self._info is None and self._line is not None:
            start = self._line.find(_BATCH_FIELD)
            if start < 0:
                return None
            start += len(_BATCH_FIELD)
            end = self._line.find('"', start)
            return self._line[start:end] if end > start else None
        batch = self.commit_info.get(BATCH_KEY)
        return batch if isinstance(batch, str) else None


_BATCH_FIELD = f'"{BATCH_KEY}":"'
# What marks a commit file as one :meth:`DirectAppender.commit` wrote: its commitInfo names this
# engine and counts one add and nothing else, and the add line closes its statistics string.
_PLAIN_ENGINE = f'"engineInfo":"{ENGINE_INFO}"'
_COUNTS_ONE_ADD = json.dumps({"txn": 0, "add": 1}, separators=(",", ":"))
_PLAIN_COUNTS = json.dumps({COUNTS_KEY: _COUNTS_ONE_ADD}, separators=(",", ":"))[1:-1]


def plain_info_line(text: str) -> str | None:
    """The commitInfo line of a commit file :meth:`DirectAppender.commit` wrote (a commitInfo line
    and one whole ``add`` line, nothing else: it cannot change the table, and it was not cut short),
    or None for any other commit file, which is then parsed whole."""
    head, newline, add = text.partition("\n")
    if not newline or "\n" in add:
        return None
    if not (head.startswith('{"commitInfo":{') and add.startswith('{"add":{"path":"')):
        return None
    if not add.endswith('}"}}') or _PLAIN_ENGINE not in head or _PLAIN_COUNTS not in head:
        return None
    return head


def blocker(snapshot: Snapshot, schema: pa.Schema, *, on_s3: bool = False) -> str | None:
    """Why rows of ``schema`` cannot be appended to ``snapshot``'s table directly (None: they can);
    on S3 only with ``on_s3`` (for writers that resolve a lost answer: see :class:`S3LogObjects`)."""
    if local_path(snapshot.uri) is None and not (on_s3 and s3_client(snapshot.uri, snapshot.storage_options)):
        return "neither local nor on S3" if on_s3 else "not on a local file system"
    features = snapshot.features()
    if features.min_reader_version > 1 or features.min_writer_version > 2:
        return f"protocol {features.min_reader_version}/{features.min_writer_version} asks more than 1/2"
    if features.partition_columns:
        return "partitioned"
    if features.column_metadata:
        return "a column carries metadata (an invariant, or column mapping)"
    if not snapshot.arrow_schema().equals(schema):
        return "its schema is not the rows' schema"
    return None


def direct_append_enabled() -> bool:
    """Whether writers commit appends directly where a table allows it (``MQ_DIRECT_APPEND``,
    default on; ``0`` sends every append through delta-rs)."""
    return os.environ.get(DIRECT_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def direct_appender(
    snapshot: Snapshot,
    schema: pa.Schema,
    plain_columns: Sequence[str] = (),
    row_group_rows: int = 1 << 20,
    *,
    on_s3: bool = False,
) -> DirectAppender | None:
    """A :class:`DirectAppender` for rows of ``schema`` on ``snapshot``'s table, or None when the
    table needs more than a blind append of files (:func:`blocker`); on S3 with ``on_s3``."""
    if blocker(snapshot, schema, on_s3=on_s3) is not None:
        return None
    path = local_path(snapshot.uri)
    objects: LogObjects = (
        LocalLogObjects(path) if path is not None else S3LogObjects(snapshot.uri, snapshot.storage_options)
    )
    return DirectAppender(
        objects,
        snapshot.name,
        schema,
        snapshot.indexed_columns(),
        plain_columns=plain_columns,
        row_group_rows=row_group_rows,
    )


IN_MEMORY_FILE_BYTES = 16 << 20
"""Data files of rows taking at most this many bytes in memory are made in memory and written in
one call (:meth:`LocalLogObjects.write_data`); bigger ones are streamed to the file, with no buffer
to grow and copy. pyarrow's own file output (resolving the path's file system, opening the file
through it) cost 110-130 us more per file, whatever its size, on the bench machine: from a group
commit's 128 rows (about 600 us in all) to 20,000 consume-queue entries (6.6 ms)."""

PLAIN_FILE_ROWS = 256
"""Data files of at most this many rows are written without dictionaries and without parquet
statistics: such a file is one row group (the commit log's groups hold 256 rows), whose statistics
would repeat the add action's, which readers skip files by, and snappy alone keeps a few hundred
rows' repeated topics and tags as small as dictionaries do. Building both was about a tenth of
writing the file of a single send, and a quarter of writing a group commit of four batches of 32."""


def _parquet_bytes(rows: pa.Table, options: Mapping[str, Any]) -> pa.Buffer:
    """``rows`` as the bytes of a parquet file written with ``options``.

    Raises:
        pyarrow.ArrowException: they cannot be written so.
    """
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink, **options)
    return sink.getvalue()


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _write_all(fd: int, data: bytes | pa.Buffer) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_new(path: str, data: bytes | pa.Buffer) -> None:
    """Write ``data`` as the new file ``path`` (fails if it exists), without the buffered file
    object ``open()`` makes (its size and terminal checks cost as much as the write of a small file).

    Raises:
        OSError: it exists, or could not be written (what was written stays: the caller removes it).
    """
    fd = os.open(path, _NEW_FILE, 0o666)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


# Whether the file systems here take files without a name (O_TMPFILE: Linux 3.11 and later, local
# file systems); turned off for the process at the first refusal.
_unnamed_files = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")


def _unnamed_file(directory: str) -> int | None:
    """A new file of ``directory`` without a name, open for writing (linked in by :func:`_link_in`),
    or None when the file system has no such files: a crash leaves nothing behind, and the directory
    changes once instead of taking a temporary name and losing it again (a commit file's put:
    642-644 against 680-700 us of CPU on the bench machine's disk in a slow state, 43 against 87 us
    on tmpfs).

    Raises:
        OSError: the directory cannot take a file.
    """
    global _unnamed_files
    if not _unnamed_files:
        return None
    try:
        return os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
        _unnamed_files = False
        return None


def _link_in(fd: int, directory: str, name: str) -> None:
    """Give the unnamed file ``fd`` of ``directory`` the name ``name`` (put-if-absent).

    Raises:
        FileExistsError: ``name`` exists.
        OSError: it could not be linked.
    """
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N names the open file (open(2), O_TMPFILE);
        # given a dir_fd, os.link calls linkat with that flag.
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
    finally:
        os.close(dir_fd)


def _commit_name(version: int) -> str:
    return f"_delta_log/{version:020d}.json"


class LocalLogObjects:
    """The files of a direct appender on a local disk: a data file written in place, a commit file
    put at its version by hard link (put-if-absent)."""

    def __init__(self, table_dir: str) -> None:
        self.uri = table_dir
        self._log_dir = os.path.join(table_dir, "_delta_log")

    def where(self, name: str) -> str:
        return os.path.join(self.uri, *name.split("/"))

    def write_data(self, name: str, rows: pa.Table, options: Mapping[str, Any]) -> int:
        """Write ``rows`` as the parquet file ``name`` of the table; its size in bytes.

        Raises:
            OSError, pyarrow.ArrowException: it could not be written (nothing is left behind).
        """
        path = self.where(name)
        try:
            if rows.nbytes > IN_MEMORY_FILE_BYTES:  # streamed to the file
                pq.write_table(rows, path, **options)
                size = os.stat(path).st_size
            else:
                data = _parquet_bytes(rows, options)
                _write_new(path, data)
                size = len(data)
        except (OSError, pa.ArrowException):
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        wrote_local_file(path, rows)  # before its commit: a reader of the version finds it kept
        return size

    def put_commit(self, version: int, text: str, table: str) -> None:
        """Put ``text`` as the commit file of ``version`` if it has none.

        Raises:
            CommitConflictError: it has one.
            StoreError: it could not be written (see :meth:`DirectAppender.commit`).
        """
        target = self.where(_commit_name(version))
        data = text.encode()
        temporary = None
        linking = False
        try:
            unnamed = _unnamed_file(self._log_dir)
            if unnamed is not None:
                try:
                    _write_all(unnamed, data)
                    linking = True
                    _link_in(unnamed, self._log_dir, os.path.basename(target))  # put-if-absent
                finally:
                    os.close(unnamed)
            else:
                temporary = os.path.join(self._log_dir, f"_commit_{uuid.uuid4()}.json.tmp")
                _write_new(temporary, data)
                linking = True
                os.link(temporary, target)  # put-if-absent: fails if the version exists
        except FileExistsError as exc:
            raise CommitConflictError(
                f"version {version} of {table} was taken by a concurrent writer", table=table, version=version
            ) from exc
        except OSError as exc:
            raise StoreError(
                f"commit {version} of {table} could not be written: {exc}",
                table=table,
                version=version,
                cause=exc,
                # the directory took the temporary file but the file system has no hard links
                links_unsupported=linking and exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP),
                # the link was asked for: on a network file system it may have happened all the same
                linked=linking,
            ) from exc
        finally:
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)

    def read_text(self, version: int) -> str | None:
        """The commit file of ``version`` (None: there is none).

        Raises:
            OSError: it cannot be read.
        """
        try:
            with open(self.where(_commit_name(version)), encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def exists(self, version: int) -> bool:
        return os.path.exists(self.where(_commit_name(version)))

    def last_checkpoint(self) -> int | None:
        """The version ``_last_checkpoint`` names (None: none).

        Raises:
            OSError, ValueError, KeyError, TypeError: it is unreadable or malformed.
        """
        return last_checkpoint_version(self.uri)

    def latest(self, at_least: int) -> int | None:
        """The newest version, probed from ``at_least`` on (:func:`probe_latest_version`)."""
        return probe_latest_version(self.uri, at_least)


class S3LogObjects:
    """The objects of a direct appender on S3, through obstore (:func:`s3_client`): a data file in
    one PUT, a commit file in one conditional PUT (``If-None-Match: *``), a commit read in one GET.

    A commit put whose answer was lost is resolved here, by reading the commit back: object_store
    retries a PUT that answered 5xx, and the retry of one that had landed meets 412, like a lost
    race; a put that timed out may still land. The commit read back is compared with the text put
    (which holds the batch id, the marks and a timestamp: no other commit has the same text).
    """

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None) -> None:
        self.uri = uri.rstrip("/")
        self.storage_options = dict(storage_options) if storage_options else None

    def where(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def write_data(self, name: str, rows: pa.Table, options: Mapping[str, Any]) -> int:
        """Write ``rows`` as the parquet file ``name`` (made in memory, put in one request).

        Raises:
            StoreError, pyarrow.ArrowException: it could not be written.
        """
        data = _parquet_bytes(rows, options).to_pybytes()
        put_object(self.uri, name, data, self.storage_options)
        return len(data)

    def put_commit(self, version: int, text: str, table: str) -> None:
        """Put ``text`` as the commit of ``version`` if it has none; returns when it is there.

        Raises:
            CommitConflictError: another commit holds the version.
            CommitStateUnknownError: the put failed, and the commit is not there (yet: it may land).
            StoreError: the put was refused (credentials, bucket): nothing was written.
        """
        name = _commit_name(version)
        try:
            if put_new_object(self.uri, name, text.encode(), self.storage_options):
                return
            failure: StoreError | None = None
        except (BucketNotFoundError, StoreAccessDeniedError):
            raise  # refused before anything was written
        except StoreError as exc:
            failure = exc
        try:
            found = self.read_text(version)
        except StoreError as exc:
            raise CommitStateUnknownError(
                f"commit {version} of {table} failed ({failure or 'version taken'}) and cannot be read "
                f"back: {exc}",
                table=table,
                version=version,
                cause=exc,
            ) from exc
        if found == text:
            return  # it landed; its answer was lost (and a retry met 412)
        if found is not None:
            raise CommitConflictError(
                f"version {version} of {table} was taken by a concurrent writer",
                table=table,
                version=version,
                read_back=True,
            ) from failure
        if failure is None:  # 412, yet nothing there: a commit cleaned up since, never a free version
            raise CommitConflictError(
                f"version {version} of {table} was taken and is gone already",
                table=table,
                version=version,
                read_back=True,
            )
        raise CommitStateUnknownError(
            f"commit {version} of {table} failed and may yet land: {failure}",
            table=table,
            version=version,
            cause=failure,
        ) from failure

    def read_text(self, version: int) -> str | None:
        """The commit of ``version`` (None: there is none).

        Raises:
            StoreError: it cannot be read.
        """
        data = get_object(self.uri, _commit_name(version), self.storage_options)
        return None if data is None else data.decode()

    def exists(self, version: int) -> bool:
        return object_exists(self.uri, _commit_name(version), self.storage_options)

    def last_checkpoint(self) -> int | None:
        """The version ``_last_checkpoint`` names (None: none).

        Raises:
            StoreError, ValueError, KeyError, TypeError: it is unreadable or malformed.
        """
        data = get_object(self.uri, "_delta_log/_last_checkpoint", self.storage_options)
        return None if data is None else int(json.loads(data)["version"])

    def latest(self, at_least: int) -> int | None:
        """The newest version: ``at_least`` (a version known to exist) and every commit found after
        it, one HEAD each (None: ``at_least`` is below 0)."""
        if at_least < 0:
            return None
        version = at_least
        while self.exists(version + 1):
            version += 1
        return version


LogObjects = LocalLogObjects | S3LogObjects


class DirectAppender:
    """Appends files to one Delta table and commits them at a given version (see the module
    docstring). Stateless between calls: the caller knows the version it commits on.

    Args:
        objects: where the table's files go (a local directory, or an S3 prefix).
        name: the table's name, for errors.
        schema: the rows' (and the table's) schema.
        indexed: which columns get file statistics (:meth:`Snapshot.indexed_columns`).
        plain_columns: columns the parquet writer neither dictionary-encodes nor keeps page
            statistics for (bodies: both cost CPU on every write and buy nothing).
        row_group_rows: rows per parquet row group.
    """

    def __init__(
        self,
        objects: LogObjects,
        name: str,
        schema: pa.Schema,
        indexed: StatsColumns,
        *,
        plain_columns: Sequence[str] = (),
        row_group_rows: int = 1 << 20,
    ) -> None:
        self.objects = objects
        self.name = name
        self.schema = schema
        self.indexed = indexed
        encoded = [n for n in schema.names if n not in plain_columns]
        self._parquet_options: dict[str, Any] = {
            "row_group_size": row_group_rows,
            "use_dictionary": encoded,
            "write_statistics": encoded,
            "compression": "snappy",
        }
        # A file of a few rows gains nothing from dictionaries nor statistics (PLAIN_FILE_ROWS).
        self._plain_options = {**self._parquet_options, "use_dictionary": False, "write_statistics": False}
        self._plain_rows = min(PLAIN_FILE_ROWS, row_group_rows)  # one row group: the add's stats say it all

    @property
    def uri(self) -> str:
        return self.objects.uri

    def commit_path(self, version: int) -> str:
        return self.objects.where(_commit_name(version))

    def exists(self, version: int) -> bool:
        """Whether version ``version`` has been committed (its commit file is there).

        Raises:
            StoreError: the object store cannot be asked.
        """
        return self.objects.exists(version)

    def latest(self, at_least: int) -> int | None:
        """The newest version, found from ``at_least`` on without a listing (None: look otherwise)."""
        return self.objects.latest(at_least)

    def _text(self, version: int) -> str | None:
        """The commit file of ``version`` (None: there is none)."""
        try:
            return self.objects.read_text(version)
        except StoreError as exc:
            raise StoreError(
                f"commit {version} of {self.name} cannot be read: {exc}", table=self.name, cause=exc
            ) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreError(
                f"commit {version} of {self.name} cannot be read: {exc}", table=self.name, cause=exc
            ) from exc

    def _parsed(self, text: str, version: int) -> list[dict[str, Any]]:
        try:
            return parse_commit(text, self.commit_path(version), version)
        except ValueError as exc:
            raise StoreError(
                f"commit {version} of {self.name} is not JSON: {exc}", table=self.name, cause=exc
            ) from exc

    def read_actions(self, version: int) -> list[dict[str, Any]] | None:
        """Every action of the commit at ``version``, or None when there is none (yet, or any more).

        Raises:
            CommitTruncatedError: the commit file was cut short at a line break.
            StoreError: it cannot be read or parsed.
        """
        text = self._text(version)
        return None if text is None else self._parsed(text, version)

    def read_commit(self, version: int) -> LogCommit | None:
        """The commit at ``version``, or None when there is none (yet, or any more).

        Raises:
            CommitTruncatedError: the commit file was cut short at a line break.
            StoreError: it cannot be read or parsed.
        """
        text = self._text(version)
        if text is None:
            return None
        line = plain_info_line(text)
        if line is not None:
            return LogCommit(version, None, False, info_line=line)
        actions = self._parsed(text, version)
        info: Mapping[str, Any] = {}
        changes = False
        for action in actions:
            if "commitInfo" in action:
                info = action["commitInfo"]
            elif "metaData" in action or "protocol" in action:
                changes = True
        return LogCommit(version, info, changes)

    def passed_by_checkpoint(self, version: int) -> bool:
        """Whether the table's newest checkpoint (``_last_checkpoint``) stands past ``version``: the
        commit files after it may have been cleaned up, so the absence of ``version + 1`` proves
        nothing."""
        try:
            checkpoint = self.objects.last_checkpoint()
        except (StoreError, OSError, ValueError, KeyError, TypeError):
            return True  # unreadable: assume the worst, the caller reloads the table
        return checkpoint is not None and checkpoint > version

    def write_file(self, rows: pa.Table) -> dict[str, Any]:
        """Write ``rows`` as a new data file of the table; its ``add`` action.

        Raises:
            StoreError: the file could not be written (nothing is left behind then).
        """
        name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        try:
            options = self._plain_options if rows.num_rows <= self._plain_rows else self._parquet_options
            size = self.objects.write_data(name, rows, options)
        except (StoreError, OSError, pa.ArrowException) as exc:
            raise StoreError(
                f"data file of {self.name} could not be written: {exc}", table=self.name, cause=exc
            ) from exc
        return {
            "path": name,
            "partitionValues": {},
            "size": size,
            "modificationTime": int(time.time() * 1000),
            "dataChange": True,
            "stats": file_stats(rows, self.indexed),
        }

    def commit(
        self,
        version: int,
        add: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
        custom_metadata: Mapping[str, str],
        transactions: Mapping[str, int] | None = None,
    ) -> None:
        """Commit the file of ``add`` (or the files of a sequence of adds) as exactly version
        ``version``, with ``custom_metadata`` in its commitInfo (as delta-rs places it) and a ``txn``
        action for each of ``transactions`` (Delta app transactions: app id -> version), which a
        writer of version 2 tables may write. Without ``add`` (None, or no adds) the commit records
        only its metadata and transactions (no file).

        Raises:
            CommitConflictError: the version exists already: another writer took it (nothing was
                committed, the data file is left for vacuum, as a lost race of delta-rs leaves it),
                or, on a network file system, a retried link of this very commit found it made.
                (On S3 a commit whose answer was lost is read back: it returns when it landed.)
            CommitStateUnknownError: on S3, the put failed and the commit is not there: it may land
                yet (a put that timed out).
            StoreError: the commit file could not be written; nothing was committed unless the
                error came from the link itself (context ``linked``): a network file system may
                have made it before failing. :meth:`read_commit` tells.
        """
        files = () if add is None else (add,) if isinstance(add, Mapping) else tuple(add)
        info = {
            "timestamp": int(time.time() * 1000),
            "operation": "WRITE",
            "operationParameters": {"mode": "Append"},
            "isBlindAppend": True,
            "engineInfo": ENGINE_INFO,
            **custom_metadata,
            COUNTS_KEY: json.dumps({"txn": len(transactions or {}), "add": len(files)}, separators=(",", ":"))
            if transactions or len(files) != 1
            else _COUNTS_ONE_ADD,
        }
        txns = [
            {"txn": {"appId": app, "version": int(v), "lastUpdated": info["timestamp"]}}
            for app, v in (transactions or {}).items()
        ]
        # one action a line and no newline after the last, as delta-rs writes them
        adds = [{"add": a} for a in files]
        text = "\n".join(json.dumps(a, separators=(",", ":")) for a in ({"commitInfo": info}, *txns, *adds))
        self.objects.put_commit(version, text, self.name)

    def commit_rewrite(
        self, version: int, actions: Sequence[AddAction | RemoveAction], custom_metadata: Mapping[str, str]
    ) -> None:
        """Commit a maintenance rewrite (files added and files removed, written already) as exactly
        version ``version``, in the lines delta-rs writes for the same actions
        (:func:`~engine.store.delta.commits.commit_next` with ``actions``): a ``commitInfo`` with
        ``custom_metadata`` and the action counts, then the ``add`` and the ``remove`` actions.

        Raises:
            CommitConflictError, CommitStateUnknownError, StoreError: as :meth:`commit`.
        """
        adds = [a for a in actions if isinstance(a, AddAction)]
        removes = [a for a in actions if isinstance(a, RemoveAction)]
        info = {
            "timestamp": int(time.time() * 1000),
            "operation": "WRITE",
            "operationParameters": {"mode": "Append", "partitionBy": "[]"},
            "engineInfo": ENGINE_INFO,
            **custom_metadata,
            COUNTS_KEY: json.dumps(
                {"txn": 0, "add": len(adds), "remove": len(removes)}, separators=(",", ":")
            ),
        }
        lines: list[dict[str, Any]] = [{"commitInfo": info}]
        lines += [
            {
                "add": {
                    "path": a.path,
                    "partitionValues": dict(a.partition_values),
                    "size": a.size,
                    "modificationTime": a.modification_time,
                    "dataChange": a.data_change,
                    "stats": a.stats,
                }
            }
            for a in adds
        ]
        lines += [
            {
                "remove": {
                    "path": r.path,
                    "dataChange": r.data_change,
                    "deletionTimestamp": r.deletion_timestamp,
                    "extendedFileMetadata": False,
                    "size": r.size,
                }
            }
            for r in removes
        ]
        text = "\n".join(json.dumps(line, separators=(",", ":")) for line in lines)
        self.objects.put_commit(version, text, self.name)
