"""The dispatch job: commit_log -> consume_queue, as a Spark structured-streaming query.

The query follows the commit log through the ``deltalog`` data source, but only its offsets (commit-log
versions): a micro-batch starts as soon as new versions are committed, and its rows are never read
by Spark (in a store of several commit-log shards, a ticker instead: see
:func:`commit_logs_versions`). Its ``foreachBatch`` calls
:func:`engine.broker.dispatch.dispatch_committed` on the driver,
which reads every commit-log version after the consume queue's marker with delta-rs and commits the
consume-queue entries together with a Delta app transaction recording the last commit-log version
covered. A replayed micro-batch (a restart after a crash, a lost or copied checkpoint, a second
dispatcher) therefore adds nothing and misses nothing: exactly once, whatever the checkpoint says.

Why the rows are not read through Spark: a Spark job per micro-batch (a Python worker reading the
versions in an executor) costs about half a second on a small machine, more than ten times the
dispatch itself, and kept the send -> pullable latency well above a second. The versions a batch
covers are a few small Parquet files, read as fast by the driver as by an executor, on a local disk
and on an object store alike, so there is one path.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

import pyarrow as pa

from engine.broker.dispatch import dispatch_committed
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import log_stream, start_query, ticker
from engine.spark.progress import progress_dict
from engine.store import schemas
from engine.store.consume_queue import dispatched_version
from engine.store.delta_log import VERSION_COLUMN
from engine.store.store import Store

__all__ = [
    "BatchRows",
    "DispatchQuery",
    "DispatchStats",
    "commit_log_versions",
    "commit_logs_versions",
    "run_dispatch",
    "summary",
]

JOB = "dispatch"
# Batches whose row counts a DispatchQuery remembers (Spark keeps the last 100 progresses).
REMEMBERED_BATCHES = 1000


class DispatchStats(JobStats):
    """Micro-batches, commit-log rows read and consume-queue entries written by one run."""

    COUNTERS = ("batches", "rows", "entries")


class BatchRows:
    """The commit-log rows each micro-batch read, and when it began (``time.monotonic()``)."""

    def __init__(self, remembered: int = REMEMBERED_BATCHES) -> None:
        self._batches: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self._remembered = remembered
        self._lock = threading.Lock()

    def record(self, batch_id: int, rows: int, started: float) -> None:
        with self._lock:
            self._batches[batch_id] = (rows, started)
            while len(self._batches) > self._remembered:
                self._batches.popitem(last=False)

    def get(self, batch_id: int) -> tuple[int, float] | None:
        with self._lock:
            return self._batches.get(batch_id)


class DispatchQuery:
    """The dispatch job's ``StreamingQuery``, whose progress counts the rows each batch dispatched.

    Spark counts a micro-batch's input rows only when a Spark job reads them; this job reads the
    commit-log versions on the driver, so Spark reports 0 rows for every batch. ``lastProgress`` and
    ``recentProgress`` (as dicts) carry instead the commit-log rows each batch read, and the rates
    derived from them, so progress lines, ``_status/dispatch.json`` and their end-to-end delay stay
    meaningful. Everything else is the query's own.
    """

    def __init__(self, query: Any, batches: BatchRows) -> None:
        self._query = query
        self._batches = batches

    def __getattr__(self, name: str) -> Any:
        return getattr(self._query, name)

    def __repr__(self) -> str:
        return f"DispatchQuery({self._query!r})"

    def _counted(self, progress: Any) -> dict[str, Any] | None:
        p = progress_dict(progress)
        if p is None or p.get("batchId") is None:
            return p
        batch_id = int(p["batchId"])
        seen, previous = self._batches.get(batch_id), self._batches.get(batch_id - 1)
        if seen is None:
            return p
        rows, started = seen
        trigger_ms = (p.get("durationMs") or {}).get("triggerExecution")
        interval_s = started - previous[1] if previous is not None else None
        p["numInputRows"] = rows
        p["processedRowsPerSecond"] = rows * 1000.0 / trigger_ms if trigger_ms else 0.0
        p["inputRowsPerSecond"] = rows / interval_s if interval_s else 0.0
        for source in p.get("sources") or ():
            source.update(
                numInputRows=rows,
                processedRowsPerSecond=p["processedRowsPerSecond"],
                inputRowsPerSecond=p["inputRowsPerSecond"],
            )
        return p

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self._counted(self._query.lastProgress)

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        return [p for p in (self._counted(x) for x in self._query.recentProgress) if p is not None]


def commit_log_versions(
    spark: Any, store: Store, starting_version: int, table: str = schemas.COMMIT_LOG
) -> Any:
    """A stream whose offsets are the versions of commit log ``table`` (default shard 0's) from
    ``starting_version`` on.

    It is the job's trigger: a micro-batch per run of new versions. Its rows are not meant to be
    read (the job reads the versions itself); it selects only ``_version``.
    """
    columns = ("store_ts_ms",)
    schema = pa.schema([schemas.COMMIT_LOG_SCHEMA.field(c) for c in columns])
    return log_stream(spark, store, table, starting_version, columns, schema).select(VERSION_COLUMN)


def commit_logs_versions(spark: Any, store: Store, starting_version: int, trigger_ms: int) -> Any:
    """The trigger of a job that follows every commit-log shard: in a store of one shard, the
    :func:`commit_log_versions` stream from ``starting_version``; with several, a ticker of one
    micro-batch every ``trigger_ms`` (:func:`~engine.spark.jobs.streams.ticker`) whose batches
    read every shard's versions after the job's markers themselves, so each follows whichever
    shard moved. (A union of one version stream per shard in one query did not start here: Spark's
    Python worker for the second Python data source never connected back.)"""
    if store.commit_log_shards == 1:
        return commit_log_versions(spark, store, starting_version)
    return ticker(spark, trigger_ms)


def run_dispatch(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    stats: DispatchStats | None = None,
) -> Any:
    """Start the dispatch query on ``spark`` for ``store``.

    Args:
        spark: a SparkSession with the project's data sources (:func:`engine.spark.session`).
        store: the store to dispatch.
        once: process every version committed now and wait for the query to finish
            (``Trigger.AvailableNow``); otherwise start a query triggered every
            ``store.config.dispatch_trigger_ms`` and return it running.
        checkpoint: the streaming checkpoint; default ``<store>/_checkpoints/dispatch``.
        stats: counters to update after each micro-batch.

    Returns:
        The started query as a :class:`DispatchQuery` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only; a running
            query reports it through ``exception()`` / ``awaitTermination()``).
    """
    counters = stats if stats is not None else DispatchStats()
    batches = BatchRows()

    def on_batch(batch: Any, batch_id: int) -> None:
        # Called on the driver; ``batch`` only says that new versions exist. Returning commits the
        # batch in the checkpoint, so a failure must raise (it does: dispatch raises on any error).
        started = time.monotonic()
        rows, entries = dispatch_committed(store)
        counters.count(batches=1, rows=rows, entries=entries)
        batches.record(batch_id, rows, started)

    frame = commit_logs_versions(
        spark, store, dispatched_version(store) + 1, store.config.dispatch_trigger_ms
    )
    query = start_query(
        frame,
        store,
        JOB,
        on_batch,
        once=once,
        checkpoint=checkpoint,
        trigger_ms=store.config.dispatch_trigger_ms,
    )
    return DispatchQuery(query, batches)


def summary(store: Store, stats: DispatchStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"dispatch: {stats.entries} entries dispatched from {stats.rows} commit-log rows in "
        f"{stats.batches} batches ({elapsed_s:.1f}s); consume_queue version "
        f"{store.version(schemas.CONSUME_QUEUE)}, commit_log dispatched through version "
        f"{dispatched_version(store)}"
    )
