"""The dispatch job: commit_log -> consume_queue, as a Spark structured-streaming query.

The query follows the commit log through the ``deltalog`` data source, but only its offsets (commit-log
versions): a micro-batch starts as soon as new versions are committed, and its rows are never read
by Spark. Its ``foreachBatch`` reads every commit-log version after the consume queue's marker on the
driver with delta-rs and hands them to :func:`engine.store.dispatch.dispatch_rows`, which commits the
consume-queue entries together with a Delta app transaction recording the last commit-log version
covered. A replayed micro-batch (a restart after a crash, a lost or copied checkpoint, a second
dispatcher) therefore adds nothing and misses nothing: exactly once, whatever the checkpoint says.

Why the rows are not read through Spark: a Spark job per micro-batch (a Python worker reading the
versions in an executor) costs about half a second on a small machine, more than ten times the
dispatch itself, and kept the send -> pullable latency well above a second. The versions a batch
covers are a few small Parquet files, read as fast by the driver as by an executor, on a local disk
and on an object store alike, so there is one path.

Usage::

    python jobs/dispatch.py --store ./mqdata --once     # dispatch what is committed, then exit
    ./spark-submit.sh jobs/dispatch.py --store ./mqdata  # run until SIGTERM / Ctrl-C
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine.store import schemas
from engine.store.dispatch import dispatch_rows, dispatched_version
from engine.store.log import VERSION_COLUMN, read_versions
from engine.store.store import Store
from jobs._common import EXIT_OK, JobContext, job_main, log_stream, run_or_serve, serve, start_query

__all__ = [
    "DISPATCH_COLUMNS",
    "DispatchStats",
    "commit_log_versions",
    "dispatch_committed",
    "main",
    "run_dispatch",
    "serve",
    "summary",
]

JOB = "dispatch"
PROG = "jobs/dispatch.py"
# What dispatch needs from a commit-log row; bodies stay on disk.
DISPATCH_COLUMNS = (
    "topic",
    "queue_id",
    "queue_offset",
    "physical_offset",
    "size",
    "tags_code",
    "store_ts_ms",
    "sys_flag",
)
DISPATCH_SCHEMA = pa.schema([schemas.COMMIT_LOG_SCHEMA.field(c) for c in DISPATCH_COLUMNS])
# Commit-log versions read and dispatched in one consume-queue commit (bounds a catch-up's memory).
VERSIONS_PER_COMMIT = 1000


@dataclass
class DispatchStats:
    """Progress of one run of the job (updated on the driver, once per micro-batch)."""

    batches: int = 0
    rows: int = 0
    entries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, rows: int, entries: int) -> None:
        with self._lock:
            self.batches += 1
            self.rows += rows
            self.entries += entries


def commit_log_versions(spark: Any, store: Store, starting_version: int) -> Any:
    """A stream whose offsets are the commit log's versions from ``starting_version`` on.

    It is the job's trigger: a micro-batch per run of new versions. Its rows are not meant to be
    read (the job reads the versions itself); it selects only ``_version``.
    """
    columns = ("store_ts_ms",)
    schema = pa.schema([schemas.COMMIT_LOG_SCHEMA.field(c) for c in columns])
    return log_stream(spark, store, schemas.COMMIT_LOG, starting_version, columns, schema).select(
        VERSION_COLUMN
    )


def dispatch_committed(store: Store, versions_per_commit: int = VERSIONS_PER_COMMIT) -> tuple[int, int]:
    """Dispatch every commit-log version committed after the consume queue's marker, on the driver.

    Returns:
        (commit-log rows read, consume-queue entries added).

    Raises:
        StoreError: a queue-offset gap, or a read or write failure.
        CommitConflictError: lost every race against another dispatcher.
    """
    latest = store.version(schemas.COMMIT_LOG)
    first = dispatched_version(store) + 1
    rows = entries = 0
    uri = store.uri(schemas.COMMIT_LOG)
    while first <= latest:
        last = min(latest, first + versions_per_commit - 1)
        batch = read_versions(uri, first, last, DISPATCH_SCHEMA, store.storage_options)
        # dispatch_rows is idempotent per commit-log version, so a replayed batch adds nothing.
        entries += dispatch_rows(store, batch) if batch.num_rows else 0
        rows += batch.num_rows
        first = last + 1  # versions without rows leave no marker: move on anyway
    return rows, entries


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
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only; a running
            query reports it through ``exception()`` / ``awaitTermination()``).
    """
    counters = stats if stats is not None else DispatchStats()

    def on_batch(batch: Any, batch_id: int) -> None:
        # Called on the driver; ``batch`` only says that new versions exist. Returning commits the
        # batch in the checkpoint, so a failure must raise (it does: dispatch raises on any error).
        counters.add(*dispatch_committed(store))

    frame = commit_log_versions(spark, store, dispatched_version(store) + 1)
    return start_query(
        frame,
        store,
        JOB,
        on_batch,
        once=once,
        checkpoint=checkpoint,
        trigger_ms=store.config.dispatch_trigger_ms,
    )


def summary(store: Store, stats: DispatchStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"dispatch: {stats.entries} entries dispatched from {stats.rows} commit-log rows in "
        f"{stats.batches} batches ({elapsed_s:.1f}s); consume_queue version "
        f"{store.version(schemas.CONSUME_QUEUE)}, commit_log dispatched through version "
        f"{dispatched_version(store)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the dispatch job; returns the process exit code (0 ok, 1 the query failed, 2 bad input)."""
    stats = DispatchStats()

    def run(ctx: JobContext, args: Any) -> int:
        run_or_serve(
            args.once,
            lambda once: run_dispatch(
                ctx.spark, ctx.store, once=once, checkpoint=args.checkpoint, stats=stats
            ),
        )
        print(summary(ctx.store, stats, ctx.elapsed_s()))
        return EXIT_OK

    return job_main(JOB, "Dispatch commit-log messages into the consume queue.", argv, run)


if __name__ == "__main__":
    sys.exit(main())
