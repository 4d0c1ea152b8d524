"""The dispatch job: commit_log -> consume_queue, as a Spark structured-streaming query.

The source is the commit log read through the ``deltalog`` data source from the first version not
yet dispatched; each micro-batch goes to :func:`engine.store.dispatch.dispatch_rows`, which commits
the consume-queue entries together with a Delta app transaction recording the last commit-log
version covered. A replayed micro-batch (a restart after a crash, a lost checkpoint, a second
dispatcher) therefore adds nothing: exactly once, whatever the checkpoint says.

Usage::

    python jobs/dispatch.py --store ./mqdata --once     # dispatch what is committed, then exit
    ./spark-submit.sh jobs/dispatch.py --store ./mqdata  # run until SIGTERM / Ctrl-C
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.spark.deltalog import SHORT_NAME, spark_schema
from engine.store import schemas
from engine.store.dispatch import dispatch_rows, dispatched_version
from engine.store.log import VERSION_COLUMN, read_versions
from engine.store.store import Store
from jobs._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    JobContext,
    StopSignal,
    argument_parser,
    checkpoint_location,
    fail,
    start,
)

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


def commit_log_stream(spark: Any, store: Store, starting_version: int) -> Any:
    """The commit log's new rows from ``starting_version`` on, as a streaming DataFrame."""
    reader = (
        spark.readStream.format(SHORT_NAME)
        .schema(spark_schema(pa.schema([schemas.COMMIT_LOG_SCHEMA.field(c) for c in DISPATCH_COLUMNS])))
        .option("path", store.uri(schemas.COMMIT_LOG))
        .option("startingVersion", str(starting_version))
        .option("columns", ",".join(DISPATCH_COLUMNS))
    )
    if store.storage_options:
        reader = reader.option("storageOptions", json.dumps(store.storage_options))
    return reader.load()


class BatchNotReadError(RuntimeError):
    """A micro-batch could not be read (the query was stopped, or the read failed)."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:500]


def with_undispatched_versions(store: Store, rows: pa.Table) -> pa.Table:
    """``rows`` preceded by the commit-log versions between the consume queue's marker and them.

    The stream's checkpoint and the consume queue's marker normally agree. When the checkpoint is
    ahead (a checkpoint copied from elsewhere, a consume queue restored from a backup), the versions
    in between would otherwise never be offered again and dispatch would stop at a queue-offset gap.
    """
    if rows.num_rows == 0:
        return rows
    first = int(pc.min(rows[VERSION_COLUMN]).as_py())
    marker = dispatched_version(store)
    if first <= marker + 1:
        return rows
    missing = read_versions(
        store.uri(schemas.COMMIT_LOG),
        marker + 1,
        first - 1,
        pa.schema([schemas.COMMIT_LOG_SCHEMA.field(c) for c in DISPATCH_COLUMNS]),
        store.storage_options,
    )
    return pa.concat_tables([missing.select(rows.column_names).cast(rows.schema), rows])


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

    def dispatch_batch(batch: Any, batch_id: int) -> None:
        # Called once per micro-batch on the driver; must be idempotent per batch: dispatch_rows is,
        # per commit-log version, so a replay of batch_id adds nothing. Must raise when it did not
        # dispatch: returning makes Spark commit the batch and never offer those versions again.
        try:
            rows = batch.toArrow()
        except Exception as exc:
            # Typically the query being stopped mid-batch. Keep the message short: Spark matches
            # failure messages of Python callbacks with a regex that overflows the stack on long ones.
            raise BatchNotReadError(f"micro-batch {batch_id} was not read: {_first_line(exc)}") from None
        rows = with_undispatched_versions(store, rows)
        entries = dispatch_rows(store, rows) if rows.num_rows else 0
        counters.add(rows.num_rows, entries)

    frame = commit_log_stream(spark, store, dispatched_version(store) + 1)
    writer = (
        frame.select(*DISPATCH_COLUMNS, VERSION_COLUMN)
        .writeStream.queryName(f"lakemq-dispatch-{store.store_id}")
        .foreachBatch(dispatch_batch)
        .option("checkpointLocation", checkpoint_location(store, JOB, checkpoint))
    )
    if once:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return query
    return writer.trigger(processingTime=f"{store.config.dispatch_trigger_ms} milliseconds").start()


def serve(query: Any, stop: threading.Event, poll_s: float = 0.5, grace_s: float = 10.0) -> None:
    """Wait until ``stop`` is set or the query ends; then stop the query cleanly.

    On ``stop`` a micro-batch in flight gets ``grace_s`` to finish before the query is stopped; one
    cut short is replayed by the next run, which dispatch makes a no-op for what it already wrote.

    Raises:
        pyspark.errors.StreamingQueryException: the query failed (not because it was stopped).
    """
    try:
        while query.isActive and not stop.is_set():
            query.awaitTermination(poll_s)
    finally:
        deadline = time.monotonic() + grace_s
        while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.05)
        if query.isActive:
            query.stop()
    if stop.is_set():
        return  # asked to stop: a batch interrupted by the stop is not a failure
    query.awaitTermination()


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
    parser = argument_parser(JOB, "Dispatch commit-log messages into the consume queue.")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (already reported on one line)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    began = time.monotonic()
    try:
        ctx: JobContext = start(args, app_name="lakemq-dispatch")
    except Exception as exc:  # bad store path, no Java, bad conf: one line, not a traceback
        return fail(PROG, exc, EXIT_USAGE)
    stats = DispatchStats()
    try:
        if args.once:
            run_dispatch(ctx.spark, ctx.store, once=True, checkpoint=args.checkpoint, stats=stats)
        else:
            with StopSignal() as stop:
                query = run_dispatch(
                    ctx.spark, ctx.store, once=False, checkpoint=args.checkpoint, stats=stats
                )
                serve(query, stop.event)
        print(summary(ctx.store, stats, time.monotonic() - began))
        return EXIT_OK
    except Exception as exc:
        return fail(PROG, exc, EXIT_FAILED)
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
