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

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine.store import schemas
from engine.store.dispatch import dispatch_rows, dispatched_version
from engine.store.log import read_versions
from engine.store.store import Store
from jobs._common import (
    EXIT_OK,
    BatchNotReadError,
    JobContext,
    job_main,
    log_stream,
    run_log_job,
    run_or_serve,
    serve,
    with_missing_versions,
)

__all__ = [
    "DISPATCH_COLUMNS",
    "BatchNotReadError",
    "DispatchStats",
    "commit_log_stream",
    "main",
    "run_dispatch",
    "serve",
    "summary",
    "with_undispatched_versions",
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
    return log_stream(spark, store, schemas.COMMIT_LOG, starting_version, DISPATCH_COLUMNS, DISPATCH_SCHEMA)


def _undispatched(store: Store, first: int, last: int) -> pa.Table:
    uri = store.uri(schemas.COMMIT_LOG)
    return read_versions(uri, first, last, DISPATCH_SCHEMA, store.storage_options)


def with_undispatched_versions(store: Store, rows: pa.Table) -> pa.Table:
    """``rows`` preceded by the commit-log versions between the consume queue's marker and them.

    The stream's checkpoint and the consume queue's marker normally agree. When the checkpoint is
    ahead (a checkpoint copied from elsewhere, a consume queue restored from a backup), the versions
    in between would otherwise never be offered again and dispatch would stop at a queue-offset gap.
    """
    return with_missing_versions(
        rows, dispatched_version(store), lambda first, last: _undispatched(store, first, last)
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
        checkpoint: the streaming checkpoint; default ``<store>/_checkpoints/dispatch``.
        stats: counters to update after each micro-batch.

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only; a running
            query reports it through ``exception()`` / ``awaitTermination()``).
    """
    counters = stats if stats is not None else DispatchStats()

    def dispatch_batch(rows: pa.Table) -> None:
        # dispatch_rows is idempotent per commit-log version, so a replayed batch adds nothing.
        entries = dispatch_rows(store, rows) if rows.num_rows else 0
        counters.add(rows.num_rows, entries)

    return run_log_job(
        spark,
        store,
        job=JOB,
        table=schemas.COMMIT_LOG,
        columns=DISPATCH_COLUMNS,
        schema=DISPATCH_SCHEMA,
        handler=dispatch_batch,
        marker=lambda: dispatched_version(store),
        catch_up=lambda first, last: _undispatched(store, first, last),
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
