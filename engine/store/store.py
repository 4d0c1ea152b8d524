"""The store: a root directory (or object-store URI) holding one Delta table per log.

Only ``engine/store/`` talks to Delta. Every other layer asks the store for Arrow data.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from engine.config import EngineConfig, load_config
from engine.errors import (
    CommitConflictError,
    ConfigError,
    InvalidTopicError,
    MQError,
    StoreError,
    TopicNotFoundError,
)
from engine.model import TopicConfig
from engine.store import schemas
from engine.store.log import table_dataset
from engine.store.repair import repair_log

# Columns that carry data-skipping statistics. Bodies and maps are left out: their stats cost log
# space and prune nothing.
_STATS_COLUMNS: dict[str, int] = {
    schemas.COMMIT_LOG: 8,
    schemas.CONSUME_QUEUE: 8,
    schemas.INDEX: 8,
}


# App transactions on the commit log that carry ``lastUpdated`` (the sequencer stamps it on one-shot
# guards only, see ``engine.store.sequencer.EXPIRING_APP_PREFIX``) are dropped by Delta readers and
# checkpoints after this long, so the snapshot does not grow by one per transaction forever.
TXN_RETENTION = "interval 7 days"
# Table properties set at creation, and added to existing tables that lack them when a store opens.
_TABLE_PROPERTIES: dict[str, dict[str, str]] = {
    schemas.COMMIT_LOG: {"delta.setTransactionRetentionDuration": TXN_RETENTION},
}


def now_ms() -> int:
    return int(time.time() * 1000)


def _is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


# A DeltaTable handle gets slower with every version it moves on by: delta-rs keeps the file list of
# each new version as one more Arrow batch and every later commit goes over all of them. On the bench
# machine (bench/commit_cost.py) an append costs 4 ms on a fresh handle and 42 ms once the handle has
# moved on by 400 versions. So long-lived writers reopen their handle after this many commits
# (reopening costs about one slow append).
RENEW_HANDLE_COMMITS = 32


def sql_literal(value: str) -> str:
    """Quote a string for a delta-rs SQL pruning predicate."""
    return "'" + value.replace("'", "''") + "'"


class Store:
    """A message store rooted at ``path``; open it with :meth:`Store.open`."""

    def __init__(self, root: str, storage_options: Mapping[str, str] | None, config: EngineConfig) -> None:
        self.root = root
        self.storage_options: dict[str, str] | None = dict(storage_options) if storage_options else None
        self.config = config
        self._tables: dict[str, DeltaTable] = {}
        self._commits_through: dict[str, int] = {}  # commits made through each shared handle
        self._lock = threading.RLock()
        self._topics: dict[str, TopicConfig] | None = None
        self._topics_version = -1
        self._store_id: str | None = None

    # ----------------------------------------------------------------- opening
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        config: EngineConfig | None = None,
    ) -> Store:
        """Open a store, creating its Delta tables with their fixed schemas on first use.

        Args:
            path: a directory or an object-store URI; default ``MQ_STORE`` or ``./mqdata``.
            storage_options: delta-rs storage options (credentials, endpoint) for URIs.
            config: engine settings; default :func:`engine.config.load_config`.

        A table whose last commit file was torn by a crash (it does not parse) is repaired first: the
        file is moved to ``_delta_log/_quarantine/`` with a logged warning and its version is free
        again, see :mod:`engine.store.repair`.

        Raises:
            StoreError: a table exists with another schema, or the location is unusable.
            StoreCorruptedError: a commit file other than the last one of a table does not parse.
            ConfigError: ``config`` or ``storage_options`` of the wrong type.
        """
        if config is not None and not isinstance(config, EngineConfig):
            raise ConfigError(
                f"config must be an EngineConfig (see engine.load_config), got {type(config).__name__}"
            )
        if storage_options is not None and (
            not isinstance(storage_options, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in storage_options.items())
        ):
            raise ConfigError("storage_options must be a mapping of strings to strings (delta-rs options)")
        cfg = config or load_config()
        raw: object = (
            os.fspath(path) if isinstance(path, os.PathLike) else (cfg.store if path is None else path)
        )
        if not isinstance(raw, str) or not raw:
            raise StoreError(f"store path must be a non-empty path or URI, got {path!r}", path=path)
        root = raw.rstrip("/") if _is_uri(raw) else str(Path(raw.removeprefix("file://")).resolve())
        if not _is_uri(root):
            try:
                Path(root).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create store directory {root}: {exc}", path=root) from exc
        store = cls(root, storage_options, cfg)
        for name in schemas.SCHEMAS:
            store._ensure_table(name)
        return store

    def uri(self, name: str) -> str:
        """Location of one table of the store."""
        return f"{self.root}/{name}"

    @property
    def is_local(self) -> bool:
        return not _is_uri(self.root)

    def _ensure_table(self, name: str) -> None:
        schema = schemas.SCHEMAS[name]
        uri = self.uri(name)
        try:
            dt = DeltaTable(uri, storage_options=self.storage_options)
        except TableNotFoundError:
            dt = None
        except DeltaError as exc:
            dt = self._load_repaired(name, exc)
        if dt is None:
            configuration: dict[str, str | None] = {}
            if name in _STATS_COLUMNS:
                configuration["delta.dataSkippingNumIndexedCols"] = str(_STATS_COLUMNS[name])
            configuration.update(_TABLE_PROPERTIES.get(name, {}))
            custom = {"mq.hwm": json.dumps({"p": 0, "t": 0, "q": {}})} if name == schemas.COMMIT_LOG else None
            try:
                dt = DeltaTable.create(
                    uri,
                    schema,
                    mode="error",
                    configuration=configuration,
                    storage_options=self.storage_options,
                    commit_properties=CommitProperties(custom_metadata=custom),
                )
            except DeltaError as exc:
                # Another process created it between our look and our create, or the location
                # refuses writes (then there is still no table).
                try:
                    dt = DeltaTable(uri, storage_options=self.storage_options)
                except DeltaError:
                    raise StoreError(f"cannot create table {uri}: {exc}", table=name, cause=exc) from exc
            except OSError as exc:
                raise StoreError(f"cannot create table {uri}: {exc}", table=name) from exc
        existing = {f.name for f in pa.schema(dt.schema().to_arrow())}
        missing = [f.name for f in schema if f.name not in existing]
        if missing:
            raise StoreError(f"table {uri} is not a {name} table: columns {missing} are missing", table=name)
        wanted = {
            k: v for k, v in _TABLE_PROPERTIES.get(name, {}).items() if k not in dt.metadata().configuration
        }
        if wanted:  # a store created before the property was introduced
            # Failing here means another process is changing the table; a later open tries again.
            with contextlib.suppress(DeltaError, OSError):
                dt.alter.set_table_properties(wanted)

    def _load_repaired(self, name: str, error: DeltaError) -> DeltaTable | None:
        """A table delta-rs cannot load: repair a torn last commit (see :mod:`engine.store.repair`)
        and load it again; None when the repair left no commit (the table is created anew)."""
        uri = self.uri(name)
        if not repair_log(uri).moved:
            raise StoreError(f"table {uri} cannot be loaded: {error}", table=name, cause=error) from error
        try:
            return DeltaTable(uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return None
        except DeltaError as exc:
            raise StoreError(f"table {uri} cannot be loaded: {exc}", table=name, cause=exc) from exc

    # ----------------------------------------------------------------- tables
    def table(self, name: str, *, fresh: bool = True) -> DeltaTable:
        """The store's handle on one table, brought up to the latest version when ``fresh``.

        The handle is shared by the store's users in this process; writers that need their own
        snapshot use :meth:`open_table`.
        """
        with self._lock:
            dt = self._tables.get(name)
            if dt is None:
                dt = self.open_table(name)
                self._tables[name] = dt
            elif fresh:
                dt.update_incremental()
            return dt

    def open_table(self, name: str, version: int | None = None) -> DeltaTable:
        """A new handle on a table (at ``version`` for time travel)."""
        if name not in schemas.SCHEMAS:
            raise StoreError(f"unknown table {name!r}; tables: {', '.join(schemas.SCHEMAS)}", table=name)
        try:
            return DeltaTable(self.uri(name), version=version, storage_options=self.storage_options)
        except TableNotFoundError as exc:
            raise StoreError(f"table {self.uri(name)} does not exist", table=name) from exc
        except DeltaError as exc:
            raise StoreError(
                f"table {self.uri(name)} cannot be loaded: {exc}", table=name, version=version, cause=exc
            ) from exc

    def version(self, name: str) -> int:
        """Latest committed version of a table."""
        return int(self.table(name).version())

    def latest_version_hint(self, name: str, known: int) -> int:
        """Cheap check for a version newer than ``known`` (used by long polling).

        On a local store it looks for the next commit file; elsewhere it refreshes the handle.
        """
        if self.is_local:
            log = Path(self.uri(name)) / "_delta_log"
            probe = known + 1
            while (log / f"{probe:020d}.json").exists():
                probe += 1
            return probe - 1
        return self.version(name)

    @property
    def store_id(self) -> str:
        """8-byte id of this store (hex), the first half of every offset message id.

        Derived from the commit log's Delta table id, so it survives moving the store.
        """
        if self._store_id is None:
            table_id = str(self.table(schemas.COMMIT_LOG, fresh=False).metadata().id)
            self._store_id = table_id.replace("-", "")[:16].upper()
        return self._store_id

    # ----------------------------------------------------------------- I/O
    def append(
        self,
        name: str,
        data: pa.Table,
        *,
        app_id: str | None = None,
        app_version: int | None = None,
        custom_metadata: Mapping[str, str] | None = None,
        max_retries: int | None = None,
        handle: DeltaTable | None = None,
    ) -> int:
        """Append an Arrow table as one Delta commit; returns the committed version.

        With ``app_id``/``app_version`` the commit carries a Delta app transaction, so a writer can
        check :meth:`app_version` before writing and make replays no-ops.

        A writer that decided what to write from a snapshot passes that snapshot's ``handle`` with
        ``max_retries=0``: the commit then lands exactly on the next version or fails, never on top
        of commits it did not see (the store's shared handle may be moved by other threads).

        Raises:
            CommitConflictError: the commit lost its race ``max_retries`` + 1 times.
            StoreError: the write failed; nothing was committed.
        """
        schema = schemas.SCHEMAS[name]
        data = data.select(schema.names).cast(schema)
        txns = [Transaction(app_id, app_version)] if app_id is not None and app_version is not None else None
        dt = handle if handle is not None else self.table(name, fresh=False)
        with self._lock:
            try:
                write_deltalake(
                    dt,
                    data,
                    mode="append",
                    commit_properties=CommitProperties(
                        custom_metadata=dict(custom_metadata) if custom_metadata else None,
                        max_commit_retries=max_retries,
                        app_transactions=txns,
                    ),
                )
            except CommitFailedError as exc:
                dt.update_incremental()
                raise CommitConflictError(
                    f"commit to {name} conflicted with a concurrent writer: {exc}", table=name, cause=exc
                ) from exc
            except (DeltaError, OSError) as exc:
                raise StoreError(f"write to {name} failed: {exc}", table=name, cause=exc) from exc
            version = int(dt.version())
            if handle is None:
                self._renew_if_aged(name)
            return version

    def _renew_if_aged(self, name: str) -> None:
        """Swap the shared handle of ``name`` for a fresh one every :data:`RENEW_HANDLE_COMMITS` commits."""
        made = self._commits_through.get(name, 0) + 1
        if made < RENEW_HANDLE_COMMITS:
            self._commits_through[name] = made
            return
        try:
            self._tables[name] = self.open_table(name)
        except MQError:
            return  # the commit is done; the aged handle still works, the next commit tries again
        self._commits_through[name] = 0

    def app_version(self, name: str, app_id: str) -> int | None:
        """Last version recorded by app transaction ``app_id`` on a table, if any."""
        value = self.table(name).transaction_version(app_id)
        return None if value is None else int(value)

    def dataset(self, name: str, predicate: str | None = None, *, version: int | None = None) -> ds.Dataset:
        """A PyArrow dataset over a table's current (or past) snapshot.

        ``predicate`` is a delta-rs SQL predicate that prunes files by their statistics.
        """
        dt = self.open_table(name, version) if version is not None else self.table(name)
        with self._lock:
            return table_dataset(dt, predicate)

    def read(
        self,
        name: str,
        *,
        predicate: str | None = None,
        filter: ds.Expression | None = None,
        columns: list[str] | None = None,
        version: int | None = None,
    ) -> pa.Table:
        """Read rows of a table: files pruned by ``predicate``, rows kept by ``filter``."""
        return self.dataset(name, predicate, version=version).to_table(columns=columns, filter=filter)

    # ----------------------------------------------------------------- topics
    def topic_configs(self, *, refresh: bool = False) -> dict[str, TopicConfig]:
        """Every topic's latest configuration (the ``topics`` table, latest row per name)."""
        version = self.version(schemas.TOPICS) if (refresh or self._topics is None) else self._topics_version
        if self._topics is not None and version == self._topics_version:
            return self._topics
        rows = self.read(schemas.TOPICS).to_pylist()
        rows.sort(key=lambda r: r["created_ts_ms"])
        topics: dict[str, TopicConfig] = {}
        for r in rows:
            if r["queues"] <= 0:  # a deletion marker
                topics.pop(r["name"], None)
                continue
            topics[r["name"]] = TopicConfig(r["name"], r["queues"], r["perm"], r["type"], r["created_ts_ms"])
        self._topics, self._topics_version = topics, version
        return topics

    def topic(self, name: str) -> TopicConfig:
        """One topic's configuration, re-reading the table once if it is not known yet.

        Raises:
            InvalidTopicError: ``name`` is not a string.
            TopicNotFoundError: no such topic.
        """
        if not isinstance(name, str):
            raise InvalidTopicError(f"topic must be a non-empty string, got {name!r}", topic=name)
        topic = self.topic_configs().get(name) or self.topic_configs(refresh=True).get(name)
        if topic is None:
            raise TopicNotFoundError(
                f"topic {name!r} does not exist; create it with Admin.create_topic", topic=name
            )
        return topic

    def put_topic(self, config: TopicConfig) -> None:
        row = {
            "name": config.name,
            "queues": config.queues,
            "perm": config.perm,
            "type": config.type,
            "created_ts_ms": config.created_ts_ms or now_ms(),
        }
        self.append(schemas.TOPICS, pa.Table.from_pylist([row], schema=schemas.TOPICS_SCHEMA))
        self._topics = None

    def __repr__(self) -> str:
        return f"Store({self.root!r})"
