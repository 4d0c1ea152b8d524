"""The delta-rs mechanics every table module goes through: handles, app versions, files.

This is the one module that knows how delta-rs handles are driven. The rest of ``engine/store``
holds a :class:`Snapshot` (a delta-rs handle that only its owner moves) and asks it for versions,
app transactions, commit markers and live files; every commit goes through
:func:`engine.store.delta.commits.commit_next`, which lands exactly on the version after the snapshot's
or fails, and maps delta-rs's errors onto the engine's. No delta-rs object leaves
``engine/store``: callers outside it see snapshots, Arrow tables and plain values.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import (
    CommitProperties,
    DeltaTable,
    Transaction,
)
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.schema import Field as DeltaField
from deltalake.transaction import AddAction, RemoveAction

from engine.errors import (
    CommitTruncatedError,
    StoreError,
    TableMissingError,
)
from engine.store.commit_markers import EXPIRING_APP_PREFIX
from engine.store.delta.log import probe_latest_version, read_version, table_filesystem
from engine.store.delta.objects import local_path, object_exists, storage_failure

# A DeltaTable handle gets slower with every version it moves on by: delta-rs keeps the file list of
# each new version as one more Arrow batch and every later commit goes over all of them, and a
# refresh (update_incremental) keeps them too, even past a newer checkpoint. On the bench machine
# (bench/commit_cost.py) an append costs 4 ms on a fresh handle and 42 ms once the handle has moved
# on by 400 versions. So long-lived handles are reopened (:attr:`Snapshot.aged`) after this many
# versions, or after the table's checkpoint interval if that is shorter (they have then moved past a
# checkpoint, which a reopen starts from): on a 51-file table checkpointed every 10 versions, a
# 19-column one-row append took 12.8 ms with a reopen every 32 versions and 7.6 ms with a reopen
# after each checkpoint (never reopened: 30.3 ms).
RENEW_HANDLE_COMMITS = 32
# Reads of a log listed mid-commit (see Snapshot._reloading) before giving up. A local directory
# listing is no snapshot: with two commits linked in while it is read (direct appends make that
# common: the soak saw it at about 150 commits/s), the later one may be listed and the earlier not.
LISTING_ATTEMPTS = 12


def listing_pause(attempt: int) -> None:
    """The jittered pause before listing the log again (at most about 60 ms, 0.4 s in all)."""
    time.sleep(random.uniform(0.5, 1.0) * min(0.06, 0.005 * (attempt + 1)))


# App versions, by (table URI, app id): (the version they are known as of, the value). delta-rs's
# ``transaction_version`` replays every commit since the newest checkpoint on each call (on an object
# store a GET per commit file: 6 GETs for 6 commits, each time; on a local disk about 5 ms on a
# commit log 100 commits past its checkpoint), and the broker asks for about twenty app ids per pass
# (the schedule's state): 234 requests per message sent on an object store, measured, and a fifth
# of a core on a local disk. Moving a known value on reads only the new commit files, each once per
# process (engine.store.delta.log.read_version keeps them), once for all the ids asked together.
_APP_VERSIONS: dict[tuple[str, str], tuple[int, int]] = {}
_APP_VERSIONS_LOCK = threading.Lock()
# Most commits an app version is moved on by from what is known; further back, delta-rs replays.
APP_VERSION_CATCH_UP = 256

# How long a refresh on an object store trusts a HEAD of the next commit file alone. Missing, it
# means "nothing new" unless log retention cleaned that file up, which takes a handle left unrefreshed
# for longer than the retention while commits landed; past this long, delta-rs reads the log again
# (it starts from the newest checkpoint when the commits the handle needs are gone).
PROBE_TRUSTED_S = 30.0

DEFAULT_CHECKPOINT_INTERVAL = 100  # delta-rs's default delta.checkpointInterval (Delta on Spark: 10)


def checkpoint_interval(snapshot: Snapshot) -> int:
    """The table's ``delta.checkpointInterval`` (Delta's default 100 when unset or unreadable)."""
    raw = snapshot.configuration().get("delta.checkpointInterval")
    try:
        return max(1, int(raw)) if raw else DEFAULT_CHECKPOINT_INTERVAL
    except ValueError:
        return DEFAULT_CHECKPOINT_INTERVAL


def log_gone(exc: BaseException) -> bool:
    """Whether a delta-rs error says that commit files a handle needs were cleaned up (the handle is
    older than the log retention: its successors are gone, only a checkpoint stands for them)."""
    text = str(exc)
    if text.startswith("Invalid table version"):
        return True
    return "_delta_log" in text and "not found" in text and isinstance(exc, (DeltaError, FileNotFoundError))


def listing_gap(exc: BaseException) -> bool:
    """Whether a delta-rs error says its listing of the log had a gap between commit files: the
    directory was read while another writer's commit was being linked in (a listing is not a
    snapshot of the directory), so reading again finds the log whole."""
    return "Expected contiguous commit files" in str(exc)


# How far back to look for a commit marker before giving up (compaction and progress commits lack
# them).
MAX_WALK_BACK = 4096

Action = AddAction | RemoveAction


@dataclass(frozen=True)
class DataFile:
    """One live data file of a snapshot, with the range of one column (its ordering column)."""

    path: str
    size: int
    rows: int
    modified: int
    lo: int | None = None  # min / max of the column asked for
    hi: int | None = None


def int_column(actions: pa.Table, name: str) -> list[int | None]:
    """An add-action column as ints (None where missing, every row None when the column is)."""
    if name not in actions.column_names:
        return [None] * actions.num_rows
    return [None if v is None else int(v) for v in actions[name].to_pylist()]


def str_column(actions: pa.Table, name: str) -> list[str | None]:
    """An add-action column as strings (None where missing, every row None when the column is)."""
    if name not in actions.column_names:
        return [None] * actions.num_rows
    return [None if v is None else str(v) for v in actions[name].to_pylist()]


def data_files_of(actions: pa.Table, column: str | None = None) -> list[DataFile]:
    """The files of add ``actions`` (:meth:`Snapshot.add_actions`), with the min / max of ``column``."""
    paths = actions["path"].to_pylist()
    sizes = int_column(actions, "size_bytes")
    rows = int_column(actions, "num_records")
    modified = int_column(actions, "modification_time")
    los = int_column(actions, f"min.{column}") if column else [None] * len(paths)
    his = int_column(actions, f"max.{column}") if column else [None] * len(paths)
    return [
        DataFile(p, s or 0, r or 0, m or 0, lo, hi)
        for p, s, r, m, lo, hi in zip(paths, sizes, rows, modified, los, his, strict=True)
    ]


@dataclass(frozen=True)
class TableFeatures:
    """What a writer of a table must honour beyond adding files: its protocol, partitioning, and
    whether any column carries metadata (invariants, column mapping ids)."""

    min_reader_version: int
    min_writer_version: int
    partition_columns: tuple[str, ...]
    column_metadata: bool


_T = TypeVar("_T")


def open_snapshot(
    uri: str, storage_options: Mapping[str, str] | None = None, version: int | None = None, *, name: str = ""
) -> Snapshot:
    """A new snapshot of the Delta table at ``uri`` (at ``version`` for time travel).

    Raises:
        TableMissingError: no table there.
        StoreError: the table cannot be loaded (its log is damaged or unreadable).
    """
    label = name or uri
    for attempt in range(LISTING_ATTEMPTS):
        # the latest version, found without a listing, is loaded as exactly that version
        at = version if version is not None else probe_latest_version(uri)
        try:
            options = dict(storage_options) if storage_options else None
            dt = DeltaTable(uri, version=at, storage_options=options)
        except TableNotFoundError as exc:
            raise TableMissingError(f"table {uri} does not exist", table=label, cause=exc) from exc
        except (DeltaError, OSError) as exc:
            if listing_gap(exc) and attempt + 1 < LISTING_ATTEMPTS:
                listing_pause(attempt)  # the log was listed mid-commit: read it again
                continue
            raise storage_failure(
                exc, f"table {uri} cannot be loaded", uri, table=label, version=version
            ) from exc
        return Snapshot(dt, label, storage_options)
    raise AssertionError("unreachable")  # pragma: no cover


class Snapshot:
    """One table as of one version: a delta-rs handle that only its owner moves on.

    Not thread-safe: share a snapshot only under a lock. A writer that decides what to commit from a
    snapshot commits with :func:`commit_next` on that same snapshot, so the commit lands right after
    what it read or fails.
    """

    def __init__(self, dt: DeltaTable, name: str, storage_options: Mapping[str, str] | None = None) -> None:
        self._dt = dt
        self.name = name
        self.storage_options: dict[str, str] | None = dict(storage_options) if storage_options else None
        self._opened_at = int(dt.version())
        self._key = self.uri.rstrip("/")
        self._remote = local_path(self._key) is None
        self._listed_at = time.monotonic()  # when delta-rs last read the log for this handle
        self._configuration: tuple[int, Mapping[str, str | None]] | None = None  # (version, properties)

    # ------------------------------------------------------------------ where and when
    @property
    def uri(self) -> str:
        return str(self._dt.table_uri)

    def version(self) -> int:
        """The version this snapshot is at."""
        return int(self._dt.version())

    @property
    def moved_since_open(self) -> int:
        """Versions the handle has moved on by since it was opened (see :data:`RENEW_HANDLE_COMMITS`)."""
        return self.version() - self._opened_at

    @property
    def aged(self) -> bool:
        """Whether reopening the handle would make it cheaper to use: it has moved on by
        :data:`RENEW_HANDLE_COMMITS` versions, or by the table's checkpoint interval
        (``delta.checkpointInterval``) if shorter, which takes it past a checkpoint version."""
        moved = self.moved_since_open
        return moved >= RENEW_HANDLE_COMMITS or moved >= checkpoint_interval(self)

    def refresh(self, *, newer: bool = False) -> Snapshot:
        """Move on to the latest version; returns itself.

        Args:
            newer: the caller has just seen a commit after this version (saves the look for one).

        Raises:
            StoreError: the log cannot be read.
        """
        if (
            self._remote
            and not newer
            and time.monotonic() - self._listed_at < PROBE_TRUSTED_S
            and not self._next_commit_exists()
        ):
            return self
        self._listed_at = time.monotonic()
        latest = probe_latest_version(self.uri, self.version())
        if latest is None:
            self._reloading(lambda: self._dt.update_incremental(), "refreshed")
        elif latest > self.version():  # a load of exactly that version lists no half-made log
            self._reloading(lambda: self._load_up_to(latest), "refreshed")
        return self

    def _next_commit_exists(self) -> bool:
        """Whether the commit file after this version is there (one HEAD): on an object store a
        refresh that finds nothing new then costs one request, not delta-rs's listing and checkpoint
        hint (two). An object store's reads are consistent: a commit that landed is seen."""
        try:
            return object_exists(
                self._key, f"_delta_log/{self.version() + 1:020d}.json", self.storage_options
            )
        except StoreError:
            return True  # let delta-rs's refresh say what is wrong

    def _load_up_to(self, version: int) -> None:
        if self.version() < version:  # a reload may have gone further already
            self._dt.load_as_version(version)

    def _reloading(self, read: Callable[[], _T], doing: str) -> _T:
        """``read()``; when the commits this handle still needed were cleaned up (it fell behind the
        log retention while another process checkpointed), once more after loading the table anew
        from its newest checkpoint (the snapshot then stands at the latest version).

        A listing that caught the log mid-commit (a gap between commit files: another writer's
        commit was being linked in while the directory was read) is read again, a few times.

        Raises:
            StoreError: the log cannot be read for another reason.
        """
        for attempt in range(LISTING_ATTEMPTS):
            try:
                return read()
            except (DeltaError, OSError) as exc:
                if log_gone(exc):
                    break
                if listing_gap(exc) and attempt + 1 < LISTING_ATTEMPTS:
                    listing_pause(attempt)
                    continue
                raise storage_failure(
                    exc, f"table {self.name} cannot be {doing}", self.uri, table=self.name
                ) from exc
        self.reload()
        return read()

    def reload(self) -> Snapshot:
        """Load the table anew from its newest checkpoint, at its latest version; returns itself.

        A handle that moved on incrementally still lists the commit files since the checkpoint it
        was loaded from, and delta-rs may read them again (a write's conflict check or post-commit
        checkpoint): once log retention has cleaned them up, only a handle loaded anew works.

        Raises:
            StoreError: the table cannot be opened.
        """
        self._dt = open_snapshot(self.uri, self.storage_options, name=self.name)._dt
        self._opened_at = int(self._dt.version())
        return self

    # ------------------------------------------------------------------ metadata
    def app_version(self, app_id: str) -> int:
        """Last version recorded by Delta app transaction ``app_id`` (-1 when none).

        A snapshot whose commit files were cleaned up behind it (older than the log retention) cannot
        be read as of its version any more: it moves to the latest version and answers as of that.
        """
        return self.app_versions((app_id,))[app_id]

    def app_versions(self, app_ids: Sequence[str]) -> dict[str, int]:
        """:meth:`app_version` of each of ``app_ids``, the commit files after what is known read once
        for all of them (:data:`_APP_VERSIONS`)."""
        version = self.version()
        answers = self._app_versions_known(app_ids, version)
        for app_id in app_ids:
            if app_id in answers:
                continue
            value = self._reloading(functools.partial(self._transaction_version, app_id), "read")
            answers[app_id] = -1 if value is None else int(value)
            if not app_id.startswith(EXPIRING_APP_PREFIX):
                with _APP_VERSIONS_LOCK:
                    if _APP_VERSIONS.get((self._key, app_id), (-1, -1))[0] <= self.version():
                        _APP_VERSIONS[(self._key, app_id)] = (self.version(), answers[app_id])
        return answers

    def _transaction_version(self, app_id: str) -> int | None:
        return self._dt.transaction_version(app_id)  # the handle as it is then: a reload replaces it

    def _app_versions_known(self, app_ids: Sequence[str], version: int) -> dict[str, int]:
        """The app versions as of ``version`` that follow from the values known for the table (moved
        on by the app transactions of the commit files after them); an id is left out when it must
        be asked of delta-rs: nothing known, known only as of a later version, too far behind, a
        commit file gone, or a transaction that carries ``lastUpdated`` (it may expire: delta-rs
        applies the retention).

        Ids of :data:`EXPIRING_APP_PREFIX` are never kept (they expire after the table's retention).
        """
        with _APP_VERSIONS_LOCK:
            known = {
                a: _APP_VERSIONS.get((self._key, a)) for a in app_ids if not a.startswith(EXPIRING_APP_PREFIX)
            }
        usable = {
            a: k for a, k in known.items() if k is not None and 0 <= version - k[0] <= APP_VERSION_CATCH_UP
        }
        if not usable:
            return {}
        values = {a: k[1] for a, k in usable.items()}
        try:
            for v in range(min(k[0] for k in usable.values()) + 1, version + 1):
                transactions = read_version(self.uri, v, self.storage_options).transactions
                for app_id in list(values):
                    found = transactions.get(app_id)
                    if found is None or v <= usable[app_id][0]:
                        continue
                    if found[1] is not None:
                        del values[app_id]
                    else:
                        values[app_id] = found[0]
        except StoreError:
            return {}  # cleaned up after a checkpoint: delta-rs reads the checkpoint
        with _APP_VERSIONS_LOCK:
            for app_id, value in values.items():
                if _APP_VERSIONS.get((self._key, app_id), (-1, -1))[0] < version:
                    _APP_VERSIONS[(self._key, app_id)] = (version, value)
        return values

    def configuration(self) -> Mapping[str, str | None]:
        """The table's properties (``delta.*`` and others), read once per version of the handle (a
        writer asks at every commit whether its handle has aged, which depends on one of them)."""
        version = self.version()
        known = self._configuration
        if known is None or known[0] != version:
            known = self._configuration = (version, MappingProxyType(dict(self._dt.metadata().configuration)))
        return known[1]

    @property
    def table_id(self) -> str:
        return str(self._dt.metadata().id)

    def features(self) -> TableFeatures:
        """The table's protocol versions, partition columns and whether any column has metadata."""
        protocol = self._dt.protocol()
        return TableFeatures(
            int(protocol.min_reader_version),
            int(protocol.min_writer_version),
            tuple(self._dt.metadata().partition_columns),
            any(field.metadata for field in self._dt.schema().fields),
        )

    def arrow_schema(self) -> pa.Schema:
        return pa.schema(self._dt.schema().to_arrow())

    def indexed_columns(self) -> int | tuple[str, ...]:
        """Which columns the table keeps file statistics for: the names in
        ``delta.dataSkippingStatsColumns`` when set (it wins, as in Delta), else how many leading
        columns (``delta.dataSkippingNumIndexedCols``, default 32)."""
        named = self.configuration().get("delta.dataSkippingStatsColumns")
        if named and named.strip():
            return tuple(c.strip() for c in named.split(",") if c.strip())
        raw = self.configuration().get("delta.dataSkippingNumIndexedCols")
        try:
            value = int(raw) if raw is not None else 32
        except ValueError:
            value = 32
        return 1 << 30 if value < 0 else value

    def commit_info(self, version: int) -> Mapping[str, Any]:
        """The commitInfo of one version, read from its commit file.

        Raises:
            StoreError: the commit file is gone (cleaned up after a checkpoint) or unreadable.
            CommitTruncatedError: the commit file was cut short at a line break.
        """
        return read_version(self.uri, version, self.storage_options).commit_info

    def find_commit_value(
        self,
        key: str,
        accept: Callable[[str], bool] | None = None,
        walk_back: int | None = MAX_WALK_BACK,
    ) -> tuple[int, str] | None:
        """``(version, value)`` of the newest commit at or before this version whose commitInfo has
        ``key`` (with a value ``accept`` takes, when given).

        Reads each commit file by its exact version: delta-rs ``history()`` on a handle that is
        behind the log lists the newest commits under older version numbers, which would let a
        reader see marks ahead of the files it has. ``walk_back`` bounds the commits examined (None:
        back to the first one left in the log). None when no commit left in the log matches.
        """
        version = self.version()
        stop = -1 if walk_back is None else max(version - walk_back, -1)
        for v in range(version, stop, -1):
            try:
                info = self.commit_info(v)
            except CommitTruncatedError:
                raise
            except StoreError:
                return None  # older commits were cleaned up after a checkpoint
            if key in info and (accept is None or accept(str(info[key]))):
                return v, str(info[key])
        return None

    def commit_value(self, key: str) -> str | None:
        """Value of ``key`` in the newest commitInfo at or before this version that has it."""
        found = self.find_commit_value(key)
        return None if found is None else found[1]

    def recent_commit_infos(self, count: int) -> list[Mapping[str, Any]]:
        """The commitInfo of the last ``count`` versions, newest first, each with its ``version``."""
        return list(self._dt.history(count))

    # ------------------------------------------------------------------ files and rows
    def add_actions(self) -> pa.Table:
        """The live files' add actions, statistics flattened (``min.<column>``, ``max.<column>``)."""
        return pa.table(self._dt.get_add_actions(flatten=True))

    def files(self, column: str | None = None) -> list[DataFile]:
        """The live data files, with the min / max of ``column`` when given."""
        return data_files_of(self.add_actions(), column)

    def paths(self) -> list[str]:
        """The paths (relative to the table) of the live data files, in the log's order."""
        actions = self.add_actions()
        return [str(p) for p in actions["path"].to_pylist()] if actions.num_rows else []

    def live_paths(self) -> set[str]:
        """The paths of the live data files."""
        return set(self.paths())

    def column_max(self, column: str) -> int:
        """The largest ``column`` value by the files' statistics (-1 when no file has any)."""
        known = [v for v in int_column(self.add_actions(), f"max.{column}") if v is not None]
        return max(known) if known else -1

    def dataset(self, predicate: str | None = None) -> ds.Dataset:
        """A PyArrow dataset over this snapshot, on the table's own filesystem.

        ``predicate`` is a delta-rs SQL predicate that prunes files by their statistics. Arrow's
        local filesystem is used for local tables (see :func:`engine.store.delta.log.table_filesystem`).
        """
        fs = table_filesystem(self.uri, self.storage_options)
        return self._dt.to_pyarrow_dataset(file_pruning_predicate=predicate, filesystem=fs)

    # ------------------------------------------------------------------ log upkeep
    def checkpoint(self, *, cleanup: bool = True) -> None:
        """Write a checkpoint at this version and (with ``cleanup``) delete expired log files.

        Raises:
            StoreError: the checkpoint could not be written.
        """
        try:
            self._dt.create_checkpoint()
            if cleanup:
                self._dt.cleanup_metadata()
        except (DeltaError, OSError) as exc:
            raise StoreError(f"checkpoint of {self.name} failed: {exc}", table=self.name, cause=exc) from exc

    def vacuum(self, retention_hours: int, *, dry_run: bool, enforce: bool, full: bool) -> list[str]:
        """delta-rs ``vacuum``: the files deleted (or, with ``dry_run``, that would be).

        Raises:
            StoreError: vacuum failed (also when the window is below the table's minimum while
                ``enforce``; the message then says "retention").
        """
        try:
            return list(
                self._dt.vacuum(
                    retention_hours=retention_hours,
                    dry_run=dry_run,
                    enforce_retention_duration=enforce,
                    full=full,
                )
            )
        except (DeltaError, OSError) as exc:
            raise StoreError(f"vacuum of {self.name} failed: {exc}", table=self.name, cause=exc) from exc

    def set_properties(self, properties: Mapping[str, str]) -> None:
        """Add table properties (one metadata commit).

        Raises:
            StoreError: the commit failed (another writer changed the table, or the I/O failed).
        """
        try:
            self._dt.alter.set_table_properties(dict(properties), raise_if_not_exists=False)
        except (DeltaError, OSError) as exc:
            raise StoreError(
                f"cannot set properties of {self.name}: {exc}", table=self.name, cause=exc
            ) from exc

    def add_columns(self, fields: Sequence[pa.Field]) -> None:
        """Add nullable columns at the end of the table's schema (one metadata commit): a table
        created before a column was introduced gains it.

        Raises:
            StoreError: the commit failed (another writer changed the table, or the I/O failed).
        """
        try:
            self._dt.alter.add_columns([DeltaField.from_arrow(f) for f in fields])
        except (DeltaError, OSError) as exc:
            raise StoreError(f"cannot add columns to {self.name}: {exc}", table=self.name, cause=exc) from exc

    def __repr__(self) -> str:
        return f"Snapshot({self.name!r}, version={self.version()})"


def create_table(
    uri: str,
    schema: pa.Schema,
    *,
    name: str,
    storage_options: Mapping[str, str] | None,
    configuration: Mapping[str, str | None],
    custom_metadata: Mapping[str, str] | None,
) -> Snapshot:
    """Create an empty table (version 0), failing if one exists there already.

    Raises:
        StoreError: it exists, or the location refuses writes.
    """
    try:
        dt = DeltaTable.create(
            uri,
            schema,
            mode="error",
            configuration=dict(configuration),
            storage_options=dict(storage_options) if storage_options else None,
            # No retries: with them a create that loses the race for version 0 to another process
            # lands as version 1, a second CREATE TABLE with a new table id (and a new store id).
            commit_properties=CommitProperties(
                custom_metadata=dict(custom_metadata) if custom_metadata else None, max_commit_retries=0
            ),
        )
    except (DeltaError, OSError) as exc:
        raise storage_failure(exc, f"cannot create table {uri}", uri, table=name) from exc
    return Snapshot(dt, name, storage_options)


def app_transactions(
    versions: Mapping[str, int], expiring_prefix: str = "", now_ms: int = 0
) -> list[Transaction] | None:
    """Delta app transactions for ``versions``; ids starting with ``expiring_prefix`` carry
    ``lastUpdated`` (so they expire after the table's transaction retention), the others never do."""
    return [
        Transaction(app, v, now_ms)
        if expiring_prefix and app.startswith(expiring_prefix)
        else Transaction(app, v)
        for app, v in versions.items()
    ] or None
