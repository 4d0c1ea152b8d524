"""``deltalog``: a Spark data source over a Delta table and its log, with no Delta JVM jars.

Batch reads return a snapshot (the table's current files) or, with ``startingVersion`` /
``endingVersion``, the rows that those commits added. Streaming reads follow the log: an offset is
a Delta version (``{"version": N}`` = every version up to N has been read) and each micro-batch
holds the rows added by the versions after the previous offset, in commit order. Commits that only
rearrange data (``dataChange = false``, e.g. compaction) add no rows. The log tables of the store
are append-only, so removes are not replayed.

Options (case-insensitive):
    path: the table URI (required).
    storageOptions: delta-rs storage options as a JSON object (object stores).
    startingVersion: first version to read (batch and stream; default 0).
    endingVersion: last version to read (batch and stream; default: the latest).
    maxVersionsPerTrigger: most versions per micro-batch (stream; default: all available).
    versionsPerPartition: versions read by one Spark task (default 16).
    filesPerPartition: snapshot files read by one Spark task (default 32).
    columns: comma-separated table columns to read (default: all); ``_version`` is always there.
    live: ``true`` makes a snapshot read follow the table: every execution of the query (a view
        queried again, a DataFrame collected again) reads the snapshot current at that moment, in
        one partition so that it is one consistent snapshot. By default a batch read is planned
        once, on first execution, and keeps reading that snapshot's files (split over partitions).

Every row carries ``_version`` (long): the version that added it, or -1 in a snapshot read (a
snapshot does not record which commit added a file).

Usage::

    spark.readStream.format("deltalog").option("path", store.uri("commit_log")).load()
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from engine.errors import InvalidArgumentError, StoreError, TableMissingError
from engine.spark.mq_options import storage_options_option
from engine.store.delta import (
    VERSION_COLUMN,
    Snapshot,
    local_path,
    object_exists,
    open_snapshot,
    read_files,
    read_versions,
)

SHORT_NAME = "deltalog"
SNAPSHOT_VERSION = -1
_MAX_BATCH_ROWS = 65_536


@dataclass(frozen=True)
class LogOptions:
    """The source's options, parsed and validated."""

    path: str
    storage_options: dict[str, str] | None = None
    starting_version: int | None = None
    ending_version: int | None = None
    max_versions_per_trigger: int | None = None
    versions_per_partition: int = 16
    files_per_partition: int = 32
    columns: tuple[str, ...] | None = None
    live: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> LogOptions:
        """Read options as Spark passes them (strings, any key case).

        Raises:
            InvalidArgumentError: a missing path, a non-integer or negative version, bad JSON.
        """
        lowered = {str(k).lower(): v for k, v in options.items()}
        path = lowered.get("path")
        if not path:
            raise InvalidArgumentError("deltalog needs option 'path' (the Delta table's URI)")
        storage = storage_options_option(lowered, SHORT_NAME)
        raw_columns = lowered.get("columns")
        columns = tuple(c.strip() for c in raw_columns.split(",") if c.strip()) if raw_columns else None
        parsed = cls(
            path=str(path),
            storage_options=storage,
            starting_version=_int_option(lowered, "startingVersion", 0),
            ending_version=_int_option(lowered, "endingVersion", 0),
            max_versions_per_trigger=_int_option(lowered, "maxVersionsPerTrigger", 1),
            versions_per_partition=_int_option(lowered, "versionsPerPartition", 1) or 16,
            files_per_partition=_int_option(lowered, "filesPerPartition", 1) or 32,
            columns=columns or None,
            live=_bool_option(lowered, "live"),
        )
        if (
            parsed.starting_version is not None
            and parsed.ending_version is not None
            and parsed.ending_version < parsed.starting_version
        ):
            raise InvalidArgumentError(
                f"deltalog endingVersion {parsed.ending_version} is before startingVersion "
                f"{parsed.starting_version}"
            )
        return parsed

    @property
    def is_log_read(self) -> bool:
        return self.starting_version is not None or self.ending_version is not None

    def open(self) -> Snapshot:
        try:
            return open_snapshot(self.path, self.storage_options)
        except TableMissingError as exc:
            raise StoreError(f"deltalog: no Delta table at {self.path}", table=self.path, cause=exc) from exc


def _int_option(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError as exc:
        raise InvalidArgumentError(f"deltalog option {name} must be an integer, got {raw!r}") from exc
    if value < minimum:
        raise InvalidArgumentError(f"deltalog option {name} must be >= {minimum}, got {value}")
    return value


def _bool_option(options: Mapping[str, str], name: str) -> bool:
    raw = str(options.get(name.lower(), "false")).strip().lower()
    if raw not in ("true", "false"):
        raise InvalidArgumentError(f"deltalog option {name} must be true or false, got {raw!r}")
    return raw == "true"


def table_schema(options: LogOptions, snapshot: Snapshot | None = None) -> pa.Schema:
    """The Arrow schema of the table's columns that the source reads (without ``_version``)."""
    schema = (snapshot or options.open()).arrow_schema()
    if options.columns is None:
        return schema
    unknown = [c for c in options.columns if c not in schema.names]
    if unknown:
        raise InvalidArgumentError(
            f"deltalog: columns {unknown} are not in {options.path}; columns: {', '.join(schema.names)}"
        )
    return pa.schema([schema.field(c) for c in options.columns])


def spark_schema(arrow_schema: pa.Schema) -> StructType:
    """The Spark schema of a read: the table's columns plus ``_version`` (long)."""
    with_version = arrow_schema.append(pa.field(VERSION_COLUMN, pa.int64()))
    return from_arrow_schema(with_version)


@dataclass(frozen=True)
class VersionRange(InputPartition):
    """Rows added by versions ``first..last`` (inclusive)."""

    first: int
    last: int


@dataclass(frozen=True)
class SnapshotFiles(InputPartition):
    """Some data files of a snapshot."""

    files: tuple[str, ...]


class LatestSnapshot(InputPartition):
    """Every data file of the snapshot that is current when the partition is read."""

    def __init__(self) -> None:
        super().__init__(None)


def version_ranges(first: int, last: int, per_partition: int) -> list[VersionRange]:
    """Split versions ``first..last`` into partitions of at most ``per_partition`` versions."""
    return [VersionRange(v, min(last, v + per_partition - 1)) for v in range(first, last + 1, per_partition)]


class _Reading:
    """What both readers share: where the table is, what to read, and how to shape it for Spark."""

    def __init__(self, options: LogOptions, schema: StructType, file_schema: pa.Schema) -> None:
        self.options = options
        self.schema = schema
        self.file_schema = file_schema

    def read_partition(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one partition, cast to exactly the schema Spark asked for."""
        target = to_arrow_schema(self.schema, timezone="UTC")
        wanted = [n for n in target.names if n != VERSION_COLUMN]
        missing = [n for n in wanted if n not in self.file_schema.names]
        if missing:
            raise InvalidArgumentError(f"deltalog: columns {missing} are not in {self.options.path}")
        file_schema = pa.schema([self.file_schema.field(n) for n in wanted])
        if isinstance(partition, VersionRange):
            table = read_versions(
                self.options.path, partition.first, partition.last, file_schema, self.options.storage_options
            )
        elif isinstance(partition, (SnapshotFiles, LatestSnapshot)):
            files = self.options.open().paths() if isinstance(partition, LatestSnapshot) else partition.files
            table = read_files(
                self.options.path, files, file_schema, self.options.storage_options, version=SNAPSHOT_VERSION
            )
        else:  # Spark's placeholder partition for an empty snapshot
            return
        if table.num_rows == 0:
            return
        table = table.select(target.names).cast(target)
        yield from table.to_batches(max_chunksize=_MAX_BATCH_ROWS)


class DeltaLogReader(_Reading, DataSourceReader):
    """Batch reader: a snapshot, or the rows added by a range of versions.

    Planned on the driver (``partitions``); ``read`` runs in the executors' Python workers.
    """

    def partitions(self) -> Sequence[InputPartition]:
        dt = self.options.open()
        if self.options.is_log_read:
            latest = dt.version()
            first = self.options.starting_version or 0
            last = latest if self.options.ending_version is None else min(latest, self.options.ending_version)
            return version_ranges(first, last, self.options.versions_per_partition)
        if self.options.live:
            return [LatestSnapshot()]
        files = dt.paths()
        n = self.options.files_per_partition
        return [SnapshotFiles(tuple(files[i : i + n])) for i in range(0, len(files), n)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.read_partition(partition)


class DeltaLogStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reader over the versions of a Delta table.

    ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` are called on the driver, in
    one long-lived Python worker per query; ``read`` runs in the executors.
    """

    def __init__(self, options: LogOptions, schema: StructType, file_schema: pa.Schema) -> None:
        super().__init__(options, schema, file_schema)
        self._dt: Snapshot | None = None
        self._known = -1  # the newest version seen (the handle's, or probed past it)
        self._target: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_dt"] = None  # a table handle is not picklable; executors do not need it
        return state

    def _latest(self) -> int:
        """Latest version of the table, refreshed on a cached handle (cheap: reads new commits only).

        On an object store, once the handle has been loaded, the commit files after the version
        known are looked for (a HEAD each, and one that finds none): a trigger only needs the
        version, and a refresh of the handle would list the log and read each new commit twice.
        """
        try:
            if self._dt is None:
                self._dt = self.options.open()
                self._known = self._dt.version()
            elif local_path(self.options.path) is None:
                self._known = self._probe(self._known)
            else:
                self._dt.refresh()
                self._known = self._dt.version()
        except StoreError as exc:
            raise StoreError(
                f"deltalog: cannot read the log of {self.options.path}: {exc}", cause=exc
            ) from exc
        latest = self._known
        if self.options.ending_version is not None:
            latest = min(latest, self.options.ending_version)
        return latest

    def _probe(self, known: int) -> int:
        """The newest version from ``known`` on, by a HEAD of each next commit file (an object store's
        reads are consistent: a commit file seen is a commit made)."""
        while object_exists(
            self.options.path, f"_delta_log/{known + 1:020d}.json", self.options.storage_options
        ):
            known += 1
        return known

    def initialOffset(self) -> dict[str, int]:
        return {"version": (self.options.starting_version or 0) - 1}

    def prepareForTriggerAvailableNow(self) -> None:
        # Trigger.AvailableNow: read what is committed now, and nothing committed later.
        self._target = self._latest()

    def getDefaultReadLimit(self) -> ReadLimit:
        # Spark has no "versions" limit; ReadMaxFiles carries it (one Delta version = one commit file).
        n = self.options.max_versions_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxFiles(n)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        begin = int(start["version"])
        latest = self._target if self._target is not None else self._latest()
        if isinstance(limit, ReadMaxFiles):
            latest = min(latest, begin + max(1, int(limit.max_files)))
        return {"version": max(begin, latest)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return version_ranges(
            int(start["version"]) + 1, int(end["version"]), self.options.versions_per_partition
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the source keeps no per-batch state."""


class DeltaLogDataSource(DataSource):
    """The ``deltalog`` format: a Delta table read through its log by delta-rs (see module doc)."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def _options(self) -> LogOptions:
        return LogOptions.parse(self.options)

    def schema(self) -> StructType:
        return spark_schema(table_schema(self._options()))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._options()
        return DeltaLogReader(options, schema, _full_schema(options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self._options()
        return DeltaLogStreamReader(options, schema, _full_schema(options))


def _full_schema(options: LogOptions) -> pa.Schema:
    """Every column of the table: a user-given schema may pick any of them."""
    return options.open().arrow_schema()
