"""The dispatch job: commit_log -> consume_queue, as a Spark structured-streaming query.

The query follows the commit log (:func:`~engine.spark.jobs.streams.table_trigger`: the project's
``deltalog`` source, whose trigger is three times faster than Delta's streaming source; on a store of
several commit-log shards a union of Delta's streams, or a ticker without Delta), but only as a
trigger: a micro-batch starts as soon as new versions are committed, and its rows are never read by
Spark. Its ``foreachBatch`` calls :func:`engine.broker.dispatch.dispatch_committed` on the driver, which reads
every commit-log version after the consume queue's marker with delta-rs and commits the
consume-queue entries together with a Delta app transaction recording the last commit-log version
covered. A replayed micro-batch (a restart after a crash, a lost or copied checkpoint, a second
dispatcher) therefore adds nothing and misses nothing: exactly once, whatever the checkpoint says.

Why the rows are not read through Spark: a Spark job per micro-batch (a Python worker reading the
versions in an executor) costs about half a second on a small machine, more than ten times the
dispatch itself, and kept the send -> pullable latency well above a second. The versions a batch
covers are a few small Parquet files, read as fast by the driver as by an executor, on a local disk
and on an object store alike, so there is one path. Delta's source could not give them anyway: it
carries no row's commit version, which the exactly-once marker is made of.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine.broker.dispatch import dispatch_committed
from engine.spark.jobs.counted import BatchRows, CountedQuery
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import (
    TICKER_SOURCE,
    Trigger,
    start_query,
    table_trigger,
    ticker,
    union_triggers,
)
from engine.spark.views import native_reads
from engine.store import schemas
from engine.store.consume_queue import dispatched_version
from engine.store.store import Store

__all__ = [
    "DispatchStats",
    "commit_log_trigger",
    "run_dispatch",
    "summary",
]

JOB = "dispatch"


class DispatchStats(JobStats):
    """Micro-batches, commit-log rows read and consume-queue entries written by one run."""

    COUNTERS = ("batches", "rows", "entries")


def commit_log_trigger(
    spark: Any,
    store: Store,
    starting: Callable[[int], int],
    trigger_ms: int,
    *,
    latency_critical: bool = False,
) -> Trigger:
    """The trigger of a job that follows the commit log: a stream of its commits, shard ``k``'s from
    version ``starting(k)`` on, a micro-batch per run of new versions
    (:func:`~engine.spark.jobs.streams.table_trigger`); the job reads every shard's new versions
    itself. A store of several shards unions one Delta stream per shard, so a micro-batch starts
    when any shard moves. Without Delta it ticks every ``trigger_ms`` instead: a union of ``deltalog``
    streams in one query never started here (the second Python data source's worker never
    connected back). A ``latency_critical`` job on one shard takes ``deltalog`` even with Delta on
    (:func:`~engine.spark.jobs.streams.table_trigger` says why).
    """
    shards = range(store.commit_log_shards)
    if len(shards) > 1 and not native_reads(spark, store):
        return Trigger(ticker(spark, trigger_ms), TICKER_SOURCE, TICKER_SOURCE)
    critical = latency_critical and len(shards) == 1
    return union_triggers(
        [
            table_trigger(spark, store, schemas.commit_log_table(k), starting(k), latency_critical=critical)
            for k in shards
        ]
    )


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
        checkpoint: the streaming checkpoint; default
            :func:`~engine.spark.jobs.streams.checkpoint_location` (the Delta source keeps its
            offsets in its ``delta`` sub-directory).
        stats: counters to update after each micro-batch.

    Returns:
        The started query as a :class:`~engine.spark.jobs.counted.CountedQuery` (terminated
        already when ``once``).

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

    trigger = commit_log_trigger(
        spark,
        store,
        lambda shard: dispatched_version(store, shard) + 1,
        store.config.dispatch_trigger_ms,
        latency_critical=True,  # send -> pullable waits on it
    )
    query = start_query(
        trigger.frame,
        store,
        JOB,
        on_batch,
        once=once,
        checkpoint=checkpoint,
        trigger_ms=store.config.dispatch_trigger_ms,
        subdir=trigger.checkpoint_subdir,
    )
    return CountedQuery(query, batches)


def summary(store: Store, stats: DispatchStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"dispatch: {stats.entries} entries dispatched from {stats.rows} commit-log rows in "
        f"{stats.batches} batches ({elapsed_s:.1f}s); consume_queue version "
        f"{store.version(schemas.CONSUME_QUEUE)}, commit_log dispatched through version "
        f"{dispatched_version(store)}"
    )
