"""The store: a root directory (or object-store URI) holding one Delta table per log.

Only ``engine/store/`` talks to Delta. Every other layer asks the store for Arrow data.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from engine.config import EngineConfig, load_config
from engine.errors import CommitConflictError, ConfigError, MQError, StoreError, TableMissingError
from engine.model import TopicConfig
from engine.protocol.shards import shard_base
from engine.store import schemas
from engine.store.commit_markers import HWM_KEY
from engine.store.delta import (
    BlindAppends,
    Snapshot,
    app_transactions,
    commit_next,
    commit_parses,
    create_table,
    direct_append_enabled,
    log_gone,
    open_snapshot,
    probe_latest_version,
    read_versions,
    repair_log,
)
from engine.store.table_properties import creation_properties, table_properties
from engine.store.topics import TopicCatalog


def now_ms() -> int:
    return int(time.time() * 1000)


def _is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def sql_literal(value: str) -> str:
    """Quote a string for a delta-rs SQL pruning predicate."""
    return "'" + value.replace("'", "''") + "'"


class Store:
    """A message store rooted at ``path``; open it with :meth:`Store.open`."""

    def __init__(self, root: str, storage_options: Mapping[str, str] | None, config: EngineConfig) -> None:
        self.root = root
        self.storage_options: dict[str, str] | None = dict(storage_options) if storage_options else None
        self.config = config
        self._shared: dict[str, Snapshot] = {}
        self._blind: dict[str, BlindAppends] = {}
        self._lock = threading.RLock()
        self._topics = TopicCatalog(self)
        self._store_id: str | None = None
        self._shards = 1

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
            storage_options: delta-rs storage options (credentials, endpoint) for URIs, over the
                config's ``storage`` (``[storage]`` of engine.toml, ``MQ_STORAGE_<KEY>``, ``AWS_*``).
            config: engine settings; default :func:`engine.config.load_config`.

        A table whose last commit file was torn by a crash (it does not parse, or was cut at a line
        break so that it holds fewer actions than its commitInfo records) is repaired first: the
        file is moved to ``_delta_log/_quarantine/`` with a logged warning and its version is free
        again, see :mod:`engine.store.delta.repair`.

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
        # The config's options ([storage], MQ_STORAGE_*, AWS_*) under the explicit ones; a local root
        # takes none (they would only name an object store it does not use).
        options = {**cfg.storage, **(storage_options or {})} if _is_uri(root) else None
        store = cls(root, options, cfg)
        for name in schemas.SCHEMAS:
            store._ensure_table(name)
        store._shards = store._recorded_shards()
        for shard in range(1, store._shards):
            store._ensure_table(schemas.commit_log_table(shard))
        return store

    def _recorded_shards(self) -> int:
        """The commit-log shards this store was created with (its commit log's table property).

        Raises:
            ConfigError: the config asks for another count than the store has (a store keeps the
                count it was created with: its queues' offsets live in their shards' logs).
        """
        wanted = self.config.commit_log_shards
        snap = self.snapshot(schemas.COMMIT_LOG)
        recorded = snap.configuration().get(schemas.SHARDS_PROPERTY)
        if recorded is None and wanted > 1 and snap.version() == 0:
            # A new store (delta-rs refuses unknown properties at creation, so the count is the
            # commit after it). Processes creating one store at once all record the same count;
            # failing here means another did, so look again.
            with contextlib.suppress(StoreError):
                snap.set_properties({schemas.SHARDS_PROPERTY: str(wanted)})
            recorded = snap.refresh().configuration().get(schemas.SHARDS_PROPERTY)
        shards = int(recorded) if recorded else 1
        if wanted != shards and wanted != 1:
            raise ConfigError(
                f"store {self.root} has {shards} commit-log shard(s); commit_log_shards = {wanted} can "
                "only be set when a store is created",
                key="commit_log_shards",
            )
        return shards

    @property
    def commit_log_shards(self) -> int:
        """How many commit logs the store keeps (fixed when it was created; see
        :mod:`engine.protocol.shards`)."""
        return self._shards

    @property
    def commit_logs(self) -> tuple[str, ...]:
        """The table names of the commit-log shards, shard 0 first (``commit_log``, ``commit_log_1``, …)."""
        return tuple(schemas.commit_log_table(k) for k in range(self._shards))

    def tables(self) -> tuple[str, ...]:
        """Every table of the store: the catalog's, then the commit-log shards past shard 0."""
        return (*schemas.SCHEMAS, *self.commit_logs[1:])

    def uri(self, name: str) -> str:
        """Location of one table of the store."""
        return f"{self.root}/{name}"

    @property
    def is_local(self) -> bool:
        return not _is_uri(self.root)

    def _ensure_table(self, name: str) -> None:
        schema = schemas.schema_of(name)
        kind = schemas.kind_of(name)
        shard = schemas.shard_of_table(name)
        uri = self.uri(name)
        snap: Snapshot | None
        try:
            snap = open_snapshot(uri, self.storage_options, name=name)
        except TableMissingError:
            snap = None
        except StoreError as exc:
            snap = self._load_repaired(name, exc)
        else:
            snap = self._repair_cut_last(name, snap)
        if snap is None:
            configuration = creation_properties(kind, self.config)
            custom = None
            if shard is not None:  # a shard's physical offsets start at its base
                custom = {HWM_KEY: f'{{"p":{shard_base(shard)},"t":0,"q":{{}}}}'}
            try:
                snap = create_table(
                    uri,
                    schema,
                    name=name,
                    storage_options=self.storage_options,
                    configuration=configuration,
                    custom_metadata=custom,
                )
            except StoreError as exc:
                # Another process created it between our look and our create, or the location
                # refuses writes (then there is still no table).
                try:
                    snap = open_snapshot(uri, self.storage_options, name=name)
                except StoreError:
                    raise exc from None
        existing = set(snap.arrow_schema().names)
        missing = [f.name for f in schema if f.name not in existing]
        if (
            missing
            and all(schema.field(n).nullable for n in missing)
            and schema.names[-len(missing) :] == missing
        ):
            # A store created before these (nullable, trailing) columns were introduced: evolve it.
            # Failing here means another process is evolving it too; look again.
            with contextlib.suppress(StoreError):
                snap.add_columns([schema.field(n) for n in missing])
            snap.refresh()
            existing = set(snap.arrow_schema().names)
            missing = [f.name for f in schema if f.name not in existing]
        if missing:
            raise StoreError(f"table {uri} is not a {name} table: columns {missing} are missing", table=name)
        configured = snap.configuration()
        wanted = {k: v for k, v in table_properties(kind).items() if k not in configured}
        if wanted:  # a store created before the property was introduced
            # Failing here means another process is changing the table; a later open tries again.
            with contextlib.suppress(StoreError):
                snap.set_properties(wanted)

    def _load_repaired(self, name: str, error: StoreError) -> Snapshot | None:
        """A table delta-rs cannot load: repair a torn last commit (see :mod:`engine.store.delta.repair`)
        and load it again; None when the repair left no commit (the table is created anew)."""
        uri = self.uri(name)
        if not repair_log(uri).moved:
            raise error
        try:
            return open_snapshot(uri, self.storage_options, name=name)
        except TableMissingError:
            return None

    def _repair_cut_last(self, name: str, snap: Snapshot) -> Snapshot | None:
        """A table delta-rs loads, but whose last commit file was cut at a line break (it parses,
        with fewer actions than its commitInfo records), or with a checksum file past it (loaded at
        exactly its newest version, delta-rs does not trip over that one): repaired as torn ones."""
        if not self.is_local:
            return snap
        log = Path(self.uri(name)) / "_delta_log"
        path = log / f"{snap.version():020d}.json"
        try:
            whole = commit_parses(path.read_bytes()) and not (log / f"{snap.version() + 1:020d}.crc").exists()
        except OSError:
            return snap  # a checkpoint without its commit files, or a vanished file: delta-rs's call
        if whole or not repair_log(self.uri(name)).moved:
            return snap
        try:
            return open_snapshot(self.uri(name), self.storage_options, name=name)
        except TableMissingError:
            return None

    # ----------------------------------------------------------------- snapshots
    def snapshot(self, name: str, version: int | None = None) -> Snapshot:
        """A new snapshot of one table (at ``version`` for time travel), owned by the caller.

        A writer that decides what to commit from what it read keeps its own snapshot, so nothing
        else moves it between the read and the commit.

        Raises:
            StoreError: an unknown table, or the table cannot be loaded.
        """
        if name not in self.tables():
            raise StoreError(f"unknown table {name!r}; tables: {', '.join(self.tables())}", table=name)
        return open_snapshot(self.uri(name), self.storage_options, version, name=name)

    def caught_up(self, name: str, snapshot: Snapshot | None) -> Snapshot:
        """A caller's own ``snapshot`` of table ``name`` moved on to the latest version, or a new
        snapshot when it has none yet (None)."""
        return self.snapshot(name) if snapshot is None else snapshot.refresh()

    def shared(self, name: str, *, fresh: bool = True) -> Snapshot:
        """The snapshot of one table the store's users in this process share, brought up to the
        latest version when ``fresh``. Any user may move it at any time: read from it, never plan a
        commit on it (use :meth:`snapshot`)."""
        with self._lock:
            snap = self._shared.get(name)
            if snap is None:
                snap = self.snapshot(name)
                self._shared[name] = snap
            elif fresh:
                snap.refresh()
                self._renew_if_aged(name)  # direct appends do not move it: readers do
            return self._shared[name]

    def version(self, name: str) -> int:
        """Latest committed version of a table (on a local store, found by probing its commit files
        without moving the shared snapshot)."""
        return self.latest_version_hint(name, self.shared(name, fresh=False).version())

    def app_version(self, name: str, app_id: str) -> int:
        """Last version recorded by app transaction ``app_id`` on a table, as of now (-1 if none)."""
        return self.shared(name).app_version(app_id)

    def latest_version_hint(self, name: str, known: int) -> int:
        """The latest version of a table, cheaply when it is no older than ``known`` (long polling
        asks on every poll).

        On a local store it looks for the commit files after ``known`` (or after the newest
        checkpoint); on an object store it reads those after ``known`` (one request when there is
        none). When the local commit file to start from is gone, or ``known`` is -1, it refreshes
        the shared snapshot.
        """
        # On an object store the commit files after ``known`` are read (one HEAD when there is none):
        # a listing and the checkpoint hint cost two round trips, a poll at the head of the log finds
        # nothing new most of the time, and a reader of the new versions finds them read already.
        latest = probe_latest_version(self.uri(name), known, self.storage_options, remote=True)
        return self.shared(name).version() if latest is None else latest

    @property
    def store_id(self) -> str:
        """8-byte id of this store (hex), the first half of every offset message id.

        Derived from the commit log's Delta table id, so it survives moving the store.
        """
        if self._store_id is None:
            table_id = self.shared(schemas.COMMIT_LOG, fresh=False).table_id
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
        snapshot: Snapshot | None = None,
    ) -> int:
        """Append an Arrow table as one Delta commit; returns the committed version.

        With ``app_id``/``app_version`` the commit carries a Delta app transaction, so a writer can
        check :meth:`app_version` before writing and make replays no-ops.

        A writer that decided what to write from a snapshot passes that ``snapshot`` with
        ``max_retries=0``: the commit then lands exactly on the next version or fails, never on top
        of commits it did not see (the store's shared snapshot may be moved by other threads).

        Any other append of rows without an app transaction is blind: on a local store it is
        committed directly, without delta-rs (:mod:`engine.store.delta.blind_appends`), where the table
        allows it. The shared snapshot does not move then: read through :meth:`shared` or
        :meth:`version`, which bring it up to date.

        Raises:
            CommitConflictError: the commit lost its race ``max_retries`` + 1 times.
            StoreError: the write failed; nothing was committed.
        """
        schema = schemas.schema_of(name)
        data = data.select(schema.names).cast(schema)
        txns = (
            app_transactions({app_id: app_version})
            if app_id is not None and app_version is not None
            else None
        )
        plain = txns is None and snapshot is None and max_retries != 0 and data.num_rows > 0
        with self._lock:
            if plain and self.is_local and direct_append_enabled():
                direct = self._blind_appends(name, schema).append(data, custom_metadata)
                if direct is not None:
                    return direct
        snap = snapshot if snapshot is not None else self.shared(name, fresh=False)
        with self._lock:
            for attempt in range(2):
                try:
                    version = commit_next(
                        snap,
                        rows=data,
                        transactions=txns,
                        custom_metadata=custom_metadata,
                        max_retries=max_retries,
                    )
                except CommitConflictError as exc:
                    if snapshot is not None:  # a caller's own snapshot is the caller's to move on
                        raise
                    snap.refresh()
                    # The shared snapshot fell behind the log retention (delta-rs could not read the
                    # commits to retry over): once refreshed, commit as a caller who allows retries
                    # expects.
                    if attempt == 0 and max_retries != 0 and log_gone(exc.__cause__ or exc):
                        continue
                    raise
                break
            if snapshot is None:
                self._renew_if_aged(name)
            return version

    def _blind_appends(self, name: str, schema: pa.Schema) -> BlindAppends:
        """The direct writer of table ``name``'s plain appends (:mod:`engine.store.delta.blind_appends`)."""
        blind = self._blind.get(name)
        if blind is None:
            blind = BlindAppends(name, schema, lambda version: self.snapshot(name, version))
            self._blind[name] = blind
        return blind

    def append_progress(
        self,
        name: str,
        rows: pa.Table,
        *,
        app_id: str,
        covered: int,
        markers: Mapping[str, str] | None = None,
        snapshot: Snapshot | None = None,
    ) -> int:
        """Append rows a job derived from another log, recording in the same commit the last source
        version they cover (app transaction ``app_id``) and the table's ``markers``, as exactly the
        version after ``snapshot`` (default: the shared snapshot, as it stands); see :meth:`append`.

        Raises:
            CommitConflictError: another writer took that version (plan again from a new snapshot).
            StoreError: the write failed.
        """
        return self.append(
            name,
            rows,
            app_id=app_id,
            app_version=covered,
            custom_metadata=markers,
            max_retries=0,
            snapshot=snapshot,
        )

    def _renew_if_aged(self, name: str) -> None:
        """Swap the shared snapshot of ``name`` for a fresh one once it has aged (:attr:`Snapshot.aged`)."""
        if not self._shared[name].aged:
            return
        # Failing leaves the aged snapshot: it still works, and the next commit tries again.
        with contextlib.suppress(MQError):
            self._shared[name] = self.snapshot(name)

    def dataset(self, name: str, predicate: str | None = None, *, version: int | None = None) -> ds.Dataset:
        """A PyArrow dataset over a table's current (or past) snapshot.

        ``predicate`` is a delta-rs SQL predicate that prunes files by their statistics.
        """
        if version is not None:
            return self.snapshot(name, version).dataset(predicate)
        snap = self.shared(name)
        with self._lock:
            return snap.dataset(predicate)

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

    def versions_after(
        self, name: str, covered: int, schema: pa.Schema | None = None, *, max_versions: int = 1000
    ) -> Iterator[tuple[pa.Table, int]]:
        """The rows each committed version after ``covered`` added to table ``name``, up to the
        version that is latest when called, in chunks of at most ``max_versions`` versions.

        Yields ``(rows, last)``: the chunk's rows in commit order with their ``_version`` (only
        ``schema``'s columns; default all), and the chunk's last version, which a caller that
        records progress covers even when the chunk added no rows. This is how a broker job catches
        up without Spark.
        """
        # The newest commit file, not a refresh of the shared handle: delta-rs's refresh costs about
        # 10 ms whatever it finds, a job asks on every micro-batch, and the versions are read from
        # their commit files anyway (on an object store the hint refreshes). Finding nothing new,
        # refresh after all: the commit files after the handle's version may have been cleaned up.
        latest = self.latest_version_hint(name, max(covered, self.shared(name, fresh=False).version()))
        if latest <= covered:
            latest = self.version(name)
        columns = schema if schema is not None else schemas.schema_of(name)
        for first in range(covered + 1, latest + 1, max_versions):
            last = min(latest, first + max_versions - 1)
            yield read_versions(self.uri(name), first, last, columns, self.storage_options), last

    # ----------------------------------------------------------------- topics
    def topic_configs(self, *, refresh: bool = False) -> dict[str, TopicConfig]:
        """Every topic's latest configuration (the ``topics`` table, latest row per name)."""
        return self._topics.configs(refresh=refresh)

    def topic(self, name: str) -> TopicConfig:
        """One topic's configuration, re-reading the table once if it is not known yet.

        Raises:
            InvalidTopicError: ``name`` is not a string.
            TopicNotFoundError: no such topic.
        """
        return self._topics.get(name)

    def put_topic(self, config: TopicConfig) -> None:
        """Record a topic's configuration (a new row; the latest row per name wins)."""
        self._topics.put(config, now_ms())

    def put_topics(self, configs: Sequence[TopicConfig]) -> None:
        """Record many topics' configurations in one commit (nothing for none)."""
        self._topics.put_many(configs, now_ms())

    def __repr__(self) -> str:
        return f"Store({self.root!r})"
