"""How a broker job's streaming query is wired: its source, its ``foreachBatch``, its checkpoint.

Every job is a ``foreachBatch`` query started by :func:`start_query`. A job that follows a table
(dispatch, index, pull log, retry) is triggered by a stream over that table (:func:`table_trigger`:
Delta's streaming source where Delta on Spark is on, else the project's ``deltalog`` source) and
reads the versions after its own exactly-once marker on the driver (:func:`run_log_job`; dispatch
does the same through :func:`engine.broker.dispatch.dispatch_committed`). Nothing here parses
arguments or waits for a query: that is :mod:`engine.spark.jobs.runner`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.spark.jobs.counted import BatchRows, CountedQuery
from engine.spark.jobs.stats import JobStats
from engine.spark.object_store import default_checkpoint_root
from engine.store import schemas
from engine.store.delta import VERSION_COLUMN, earliest_version, local_path
from engine.store.store import Store

# Most source versions one handler call gets (bounds the memory of a catch-up).
VERSIONS_PER_HANDLER_CALL = 1000


def checkpoint_location(store: Store, job: str, override: str | None = None) -> str:
    """A job's streaming checkpoint: ``override``, else ``<checkpoint_dir>/<job>`` (``checkpoint_dir``
    of the engine config), else ``<store>/_checkpoints/<job>`` for a local store and a LOCAL directory
    for a store on object storage (:func:`engine.spark.object_store.default_checkpoint_root`:
    ``~/.cache/lakemq/checkpoints/<store id>/<job>``). ``s3a://`` checkpoints are taken when asked.

    A local default is safe: a checkpoint holds only the source's offsets; every job resumes from
    its own exactly-once marker (:func:`run_log_job`, the dispatch job's covered versions; the
    ticker-driven jobs read the tables' state at every pass), so a lost checkpoint, or one on
    another host, neither loses nor repeats work.
    """
    if override:
        return override
    if store.config.checkpoint_dir:
        parent = store.config.checkpoint_dir
    elif store.is_local:
        parent = f"{store.root}/_checkpoints"
    else:
        parent = str(default_checkpoint_root(store.store_id))
    return f"{parent.rstrip('/')}/{job}"


def query_name(store: Store, job: str) -> str:
    """The name a job's streaming query shows in the Spark UI and in progress reports."""
    return f"lakemq-{job.replace('_', '-')}-{store.store_id}"


def start_query(
    frame: Any,
    store: Store,
    job: str,
    on_batch: Callable[[Any, int], None],
    *,
    once: bool,
    checkpoint: str | None,
    trigger_ms: int,
    subdir: str | None = None,
) -> Any:
    """Start ``frame`` as the job's ``foreachBatch`` query with its checkpoint.

    Args:
        frame: the streaming DataFrame (a table's log, or a ticker).
        store: the store (names the query and the default checkpoint).
        job: the job's name (``dispatch``, ``schedule``, ...).
        on_batch: called once per micro-batch on the driver with ``(batch, batch_id)``.
        once: process what is available now (``Trigger.AvailableNow``) and wait for the query to
            finish; otherwise start it triggered every ``trigger_ms`` and return it running.
        checkpoint: the streaming checkpoint; default :func:`checkpoint_location`.
        trigger_ms: the processing-time trigger of a running query.
        subdir: a sub-directory of the checkpoint that holds this query's (see :class:`Trigger`).

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only; a running
            query reports it through ``exception()`` / ``awaitTermination()``).
    """
    location = checkpoint_location(store, job, checkpoint)
    if subdir:
        location = f"{location.rstrip('/')}/{subdir}"
        if "/" in subdir.strip("/"):  # one of several starts' (Delta's): the others are stale
            _remove_siblings(location)
    _clear_unwritten_first_batch(location)
    writer = (
        frame.writeStream.queryName(query_name(store, job))
        .foreachBatch(on_batch)
        .option("checkpointLocation", location)
    )
    if once:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return query
    return writer.trigger(processingTime=f"{trigger_ms} milliseconds").start()


def _remove_siblings(location: str) -> None:
    """Remove what else the directory holding ``location`` holds (other starts' Delta offsets, see
    :func:`delta_checkpoint_subdir`); local checkpoints only, others are left as they are (a few
    small files per start)."""
    path = local_path(location)
    if path is None:
        return
    target = Path(path)
    for entry in target.parent.glob("*"):
        if entry.name == target.name:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _clear_unwritten_first_batch(location: str) -> None:
    """Remove the temporary files a query stopped while writing its first offsets left behind.

    Spark writes ``offsets/<batch>`` through a hidden temporary file and a rename; stopped in
    between, it leaves ``offsets/.0.<uuid>.tmp`` (and its ``.crc``), and refuses to start on that
    checkpoint again ("STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY ... should be empty on batch 0").
    With no batch written, nothing was processed: the leftovers are removed. Local checkpoints only.
    """
    path = local_path(location)
    if path is None:
        return
    offsets = Path(path) / "offsets"
    if not offsets.is_dir():
        return
    entries = list(offsets.iterdir())
    if any(not entry.name.startswith(".") for entry in entries):
        return  # a batch was written: Spark resumes from it
    for entry in entries:
        if ".tmp" in entry.name and entry.is_file():
            entry.unlink(missing_ok=True)


def ticker(spark: Any, interval_ms: int) -> Any:
    """A streaming DataFrame of one row per micro-batch: the clock of a job no table's log feeds.

    Its rows are never read; a job driven by it does its work on the driver once per micro-batch
    (``rate-micro-batch`` makes one at every trigger, the first one at once).
    """
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", "1")
        .option("numPartitions", "1")
        .option("advanceMillisPerBatch", str(interval_ms))
        .load()
    )


def log_stream(
    spark: Any,
    store: Store,
    table: str,
    starting_version: int,
    columns: Sequence[str],
    schema: pa.Schema | None = None,
) -> Any:
    """A table's new rows (``columns`` and ``_version``) from ``starting_version`` on, streaming,
    through the project's ``deltalog`` source (no Delta jars needed).

    ``schema`` (the Arrow schema of ``columns``) spares the source inferring it from the table.
    """
    from engine.spark.deltalog import SHORT_NAME, spark_schema

    reader = spark.readStream.format(SHORT_NAME)
    if schema is not None:
        reader = reader.schema(spark_schema(schema))
    reader = (
        reader.option("path", store.uri(table))
        .option("startingVersion", str(starting_version))
        .option("columns", ",".join(columns))
    )
    if store.storage_options:
        reader = reader.option("storageOptions", json.dumps(store.storage_options))
    return reader.load()


def delta_start(store: Store, table: str, starting_version: int) -> int:
    """Where a job's Delta stream over ``table`` starts: ``starting_version`` (the version after the
    job's marker), kept within the versions the log still holds.

    A start past the latest version (a job whose marker is the table's head) starts at the head: the
    jobs read what is after their marker themselves, so one extra trigger costs nothing. A start
    before the oldest commit the log keeps (log retention removed it: a job stopped for longer than
    ``log_retention``) starts at that oldest commit, since Delta's source cannot read changes from a
    version whose commit is gone (``DELTA_VERSION_NOT_FOUND``).
    """
    latest = store.version(table)
    if starting_version >= latest:
        return max(0, latest)
    return max(starting_version, earliest_version(store.uri(table), store.storage_options))


def delta_stream(spark: Any, store: Store, table: str, start: int) -> Any:
    """A table's new commits from version ``start`` on (see :func:`delta_start`), through Delta's
    own streaming source.

    Maintenance never stops it: compaction commits (``dataChange = false``) carry no new data and
    Delta skips them; retention's deletes are commits that remove data, which a Delta stream fails
    on unless it skips them (``skipChangeCommits``: the rows removed were read before).
    """
    return (
        spark.readStream.format("delta")
        .option("startingVersion", str(start))
        .option("skipChangeCommits", "true")
        .load(store.uri(table))
    )


def delta_checkpoint_subdir(starts: Sequence[int]) -> str:
    """The checkpoint sub-directory of Delta streams started at ``starts`` (one per table).

    Each start has its own, because a Delta stream restarted from a checkpoint resumes at the
    version the checkpoint names, whatever ``startingVersion`` says, and fails when log retention
    has removed that version's commit since (a job stopped for longer than ``log_retention``). The
    job's marker, not the checkpoint, is the truth of its progress, so a query started afresh from
    the version after the marker loses nothing; :func:`start_query` removes the other starts'.
    """
    key = "-".join(str(v) for v in starts)
    if len(starts) > 1:  # one number per shard: keep the directory name short
        key = "h" + hashlib.sha1(key.encode()).hexdigest()[:16]
    return f"{DELTA_SOURCE}/from-{key}"


@dataclass(frozen=True)
class Trigger:
    """A job's trigger: a stream over the table it follows, and where its checkpoint goes.

    Attributes:
        frame: the streaming DataFrame; its rows are never read (the job reads the versions after
            its marker on the driver).
        source: ``delta`` (Delta's streaming source) or ``deltalog`` (the project's, the fallback).
        checkpoint_subdir: the sub-directory of the job's checkpoint this source keeps its offsets
            in (``None``: the job's checkpoint itself). Each source kind has its own, so that a
            checkpoint written by one never reaches the other: their offsets differ in form, and the
            job's marker, not the checkpoint, is the truth of its progress. Delta's has one per
            start (:func:`delta_checkpoint_subdir`).
        starts: the version each table's stream starts at (Delta's source; empty otherwise).
    """

    frame: Any
    source: str
    checkpoint_subdir: str | None
    starts: tuple[int, ...] = ()


DELTA_SOURCE = "delta"
DELTALOG_SOURCE = "deltalog"
TICKER_SOURCE = "ticker"  # no table's stream: a micro-batch every trigger interval


def table_trigger(
    spark: Any, store: Store, table: str, starting_version: int, *, latency_critical: bool = False
) -> Trigger:
    """The stream that triggers a job following ``table``: Delta's streaming source where Delta on
    Spark reads the store (:func:`engine.spark.views.native_reads`) and the job is not
    ``latency_critical``, else ``deltalog``.

    Why Delta where it can: ``deltalog`` is a Python data source, so every trigger asks a Python
    worker for the latest offset, and on a loaded machine such workers fail to connect back (the
    query fails and is restarted, seconds lost); Delta's source plans in the JVM.

    Why not for a ``latency_critical`` job (dispatch: send -> pullable): Delta's source finds each
    trigger's new commits by updating its snapshot of the log (its ``latestOffset``: about 0.5 s a
    micro-batch here), against 10-25 ms for ``deltalog``'s look at the next commit file. Measured on
    a quiet 2-core machine (2026-11-24, 20 sends/s): a micro-batch took 0.75-1.0 s through Delta's
    source and 0.24-0.39 s through ``deltalog``; the flow benchmark's send -> pullable went from
    p50 579 ms / p99 1.17 s (``deltalog``) to p50 2.94 s / p99 8.7 s (Delta).
    """
    from engine.spark.views import native_reads

    if native_reads(spark, store) and not latency_critical:
        start = delta_start(store, table, starting_version)
        frame = delta_stream(spark, store, table, start)
        return Trigger(
            frame.select(frame.columns[0]), DELTA_SOURCE, delta_checkpoint_subdir([start]), (start,)
        )
    first = schemas.schema_of(table).field(0)  # never read: the smallest schema the source accepts
    frame = log_stream(spark, store, table, starting_version, (first.name,), pa.schema([first]))
    return Trigger(frame.select(VERSION_COLUMN), DELTALOG_SOURCE, None)


def union_triggers(triggers: Sequence[Trigger]) -> Trigger:
    """One trigger of several tables' streams of the same source kind: a micro-batch starts when
    any of them moves (the commit-log shards)."""
    frame = triggers[0].frame
    for other in triggers[1:]:
        frame = frame.union(other.frame)
    first = triggers[0]
    if first.source != DELTA_SOURCE:
        return Trigger(frame, first.source, first.checkpoint_subdir)
    starts = tuple(v for t in triggers for v in t.starts)
    return Trigger(frame, DELTA_SOURCE, delta_checkpoint_subdir(starts), starts)


def source_columns(table: str, columns: Sequence[str], schema: pa.Schema | None = None) -> pa.Schema:
    """The Arrow schema of ``columns`` of ``table``: ``schema`` when given, else the table's own."""
    if schema is not None:
        return schema
    full = schemas.schema_of(table)
    return pa.schema([full.field(c) for c in columns])


def run_log_job(
    spark: Any,
    store: Store,
    *,
    job: str,
    table: str,
    columns: Sequence[str],
    handler: Callable[[pa.Table], None],
    marker: Callable[[], int],
    once: bool,
    checkpoint: str | None,
    trigger_ms: int,
    schema: pa.Schema | None = None,
    max_versions: int = VERSIONS_PER_HANDLER_CALL,
) -> Any:
    """Start a job fed by ``table``'s log: the rows of every version after the job's marker go to
    ``handler``, on the driver, whenever ``table`` has new commits.

    The query's stream (:func:`table_trigger`) only says *when*: each micro-batch reads the versions
    after ``max(marker(), what this run already handed over)`` with the engine
    (:meth:`~engine.store.store.Store.versions_after`) and passes them to ``handler`` in chunks of
    at most ``max_versions`` versions. A lost, fresh or foreign checkpoint therefore resumes exactly
    where the job's output stops, whichever source wrote it.

    Why the driver reads the rows rather than Spark: Delta's streaming source gives no row's commit
    version (only Change Data Feed would, which the store's tables do not turn on), and every
    handler is idempotent per version, so it needs them. Reading them through the ``deltalog``
    source instead costs a Spark job and a Python worker per micro-batch, about half a second on a
    2-core machine, more than ten times the driver's read of a batch's few small Parquet files and
    the dispatch itself (the dispatch job's measurement, :mod:`engine.spark.jobs.dispatch`); and on a
    loaded machine (load average 25-32 on 2 cores, 2026-11-24) those Python workers failed to
    connect back in 2 of the 4 ``deltalog`` runs of ``tests/test_job_triggers.py``, none of the
    Delta-triggered runs did.

    Args:
        spark: a SparkSession (:func:`engine.spark.session`).
        store: the store.
        job: the job's name (query name, default checkpoint :func:`checkpoint_location`).
        table: the source table.
        columns: the source columns the handler needs; it also gets ``_version``.
        handler: called on the driver with rows of whole versions, in commit order. It must be
            idempotent per source version, so that rows handed over again write nothing twice, and
            must raise when it did not write: returning makes Spark commit the batch.
        marker: the last source version the job's output covers.
        once: process every version committed now and wait for the query to finish; otherwise
            start a query triggered every ``trigger_ms`` and return it running.
        checkpoint: the streaming checkpoint (default :func:`checkpoint_location`).
        trigger_ms: the trigger interval of a running query.
        schema: the Arrow schema of ``columns`` (default: the table's own).
        max_versions: most versions per ``handler`` call (bounds a catch-up's memory).

    Returns:
        The started query as a :class:`~engine.spark.jobs.counted.CountedQuery` (its progress
        counts the rows each batch read; terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only).
    """
    wanted = source_columns(table, columns, schema)
    handed: list[int] = [-1]  # the last version handed to a handler that returned, in this run
    batches = BatchRows()

    def on_batch(batch: Any, batch_id: int) -> None:
        # ``batch`` only says that new versions exist; its rows are never read.
        started, read = time.monotonic(), 0
        covered = max(marker(), handed[0])
        for rows, last in store.versions_after(table, covered, wanted, max_versions=max_versions):
            handler(rows.select([*columns, VERSION_COLUMN]))
            handed[0] = last
            read += rows.num_rows
        batches.record(batch_id, read, started)

    trigger = table_trigger(spark, store, table, marker() + 1)
    query = start_query(
        trigger.frame,
        store,
        job,
        on_batch,
        once=once,
        checkpoint=checkpoint,
        trigger_ms=trigger_ms,
        subdir=trigger.checkpoint_subdir,
    )
    return CountedQuery(query, batches)


@dataclass(frozen=True)
class LogJob:
    """A job fed by one table's log (index, pull log, retry), declared once: :meth:`run` is its
    ``run_<job>`` and :meth:`summary` its summary (the contract of
    :class:`~engine.spark.jobs.registry.Job`).

    Attributes:
        name: the job's name.
        table: the source table.
        columns: the source columns the batch handler needs (it also gets ``_version``).
        covered: the last source version the job's output covers (its exactly-once marker).
        handler: ``handler(store, stats, **options)`` makes the per-micro-batch function (see
            :func:`run_log_job`); it validates ``options`` first, raising before anything starts.
        stats: makes the run's counters.
        trigger_ms: the default trigger interval of a running query.
        output: the table the job writes (its version ends the summary line).
        line: the summary line, formatted with the counters, ``elapsed_s``, ``version`` (of
            ``output``) and ``covered``.
        schema: the source columns' schema, when not the table's own.
    """

    name: str
    table: str
    columns: Sequence[str]
    covered: Callable[[Store], int]
    handler: Callable[..., Callable[[pa.Table], None]]
    stats: Callable[[], JobStats]
    trigger_ms: int
    output: str
    line: str
    schema: pa.Schema | None = None

    def run(
        self,
        spark: Any,
        store: Store,
        *,
        once: bool = True,
        checkpoint: str | None = None,
        stats: JobStats | None = None,
        trigger_ms: int | None = None,
        **options: Any,
    ) -> Any:
        """Start the job's query on ``spark`` for ``store``; ``trigger_ms`` (default the job's) is
        the trigger interval of a running query, ``options`` go to the batch handler."""
        handle = self.handler(store, stats if stats is not None else self.stats(), **options)
        return run_log_job(
            spark,
            store,
            job=self.name,
            table=self.table,
            columns=self.columns,
            handler=handle,
            marker=lambda: self.covered(store),
            once=once,
            checkpoint=checkpoint,
            trigger_ms=self.trigger_ms if trigger_ms is None else trigger_ms,
            schema=self.schema,
        )

    def summary(self, store: Store, stats: JobStats, elapsed_s: float) -> str:
        """The one line a run ends with."""
        return self.line.format(
            **stats.counters(),
            elapsed_s=elapsed_s,
            version=store.version(self.output),
            covered=self.covered(store),
        )
