"""The retry job: consumers' failures in action_log -> %RETRY%<group> (delayed) or %DLQ%<group>.

The source is ``action_log`` read through the ``deltalog`` data source from the first version not
yet routed; each micro-batch goes to :meth:`engine.broker.retry.RetryRouter.route`, which re-puts
the NACKed / EXPIRED messages in one commit-log commit together with Delta app transactions
recording the last action-log version routed. A replayed micro-batch (a restart after a crash, a
lost checkpoint, a second instance) therefore re-puts nothing: exactly once, whatever the
checkpoint says. Retries wait in ``SCHEDULE_TOPIC_XXXX``; the schedule job delivers them.

Usage::

    python jobs/retry.py --store ./mqdata --once     # route what is committed, then exit
    ./spark-submit.sh jobs/retry.py --store ./mqdata  # run until SIGTERM / Ctrl-C
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.broker.retry import ROUTE_COLUMNS, MaxReconsume, RetryRouter, routed_version
from engine.spark.deltalog import SHORT_NAME
from engine.store import schemas
from engine.store.log import VERSION_COLUMN
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
from jobs.dispatch import serve

JOB = "retry"
PROG = "jobs/retry.py"
DEFAULT_TRIGGER_MS = 500


@dataclass
class RetryStats:
    """Progress of one run of the job (updated on the driver, once per micro-batch)."""

    batches: int = 0
    rows: int = 0
    routed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, rows: int, routed: int) -> None:
        with self._lock:
            self.batches += 1
            self.rows += rows
            self.routed += routed


def action_log_stream(spark: Any, store: Store, starting_version: int) -> Any:
    """The action log's new rows from ``starting_version`` on, as a streaming DataFrame."""
    reader = (
        spark.readStream.format(SHORT_NAME)
        .option("path", store.uri(schemas.ACTION_LOG))
        .option("startingVersion", str(starting_version))
        .option("columns", ",".join(ROUTE_COLUMNS))
    )
    if store.storage_options:
        reader = reader.option("storageOptions", json.dumps(store.storage_options))
    return reader.load()


def run_retry(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    stats: RetryStats | None = None,
    trigger_ms: int = DEFAULT_TRIGGER_MS,
    max_reconsume_times: MaxReconsume = None,
) -> Any:
    """Start the retry query on ``spark`` for ``store``.

    Args:
        spark: a SparkSession with the project's data sources (:func:`engine.spark.session`).
        store: the store whose failures to route.
        once: route every action-log version committed now and wait for the query to finish
            (``Trigger.AvailableNow``); otherwise start a query triggered every ``trigger_ms``
            and return it running.
        checkpoint: the streaming checkpoint; default ``<store>/_checkpoints/retry``.
        stats: counters to update after each micro-batch.
        trigger_ms: the trigger interval of a running query.
        max_reconsume_times: per-group (mapping) or global (int) limit; default the config's.

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        InvalidArgumentError: a bad ``max_reconsume_times``.
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only).
    """
    counters = stats if stats is not None else RetryStats()
    router = RetryRouter(store, max_reconsume_times=max_reconsume_times)

    def route_batch(batch: Any, batch_id: int) -> None:
        # Called once per micro-batch on the driver; idempotent per action-log version (the router
        # drops rows of versions already routed), so a replay of batch_id re-puts nothing.
        rows = batch.toArrow()
        routed = router.route(rows) if rows.num_rows else 0
        counters.add(rows.num_rows, routed)

    frame = action_log_stream(spark, store, routed_version(store) + 1)
    writer = (
        frame.select(*ROUTE_COLUMNS, VERSION_COLUMN)
        .writeStream.queryName(f"lakemq-retry-{store.store_id}")
        .foreachBatch(route_batch)
        .option("checkpointLocation", checkpoint_location(store, JOB, checkpoint))
    )
    if once:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return query
    return writer.trigger(processingTime=f"{trigger_ms} milliseconds").start()


def summary(store: Store, stats: RetryStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"retry: {stats.routed} messages re-put from {stats.rows} action-log rows in {stats.batches} "
        f"batches ({elapsed_s:.1f}s); action_log routed through version {routed_version(store)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the retry job; returns the process exit code (0 ok, 1 the query failed, 2 bad input)."""
    parser = argument_parser(JOB, "Route NACKed messages to retry topics and dead-letter queues.")
    parser.add_argument(
        "--max-reconsume-times",
        type=int,
        default=None,
        help="reconsume limit for every group (default: the engine config's, 16)",
    )
    parser.add_argument(
        "--trigger-ms",
        type=int,
        default=DEFAULT_TRIGGER_MS,
        help=f"trigger interval of a running job in milliseconds (default {DEFAULT_TRIGGER_MS})",
    )
    args = parser.parse_args(argv)
    if args.trigger_ms <= 0:
        parser.error(f"--trigger-ms must be > 0, got {args.trigger_ms}")
    if args.max_reconsume_times is not None and args.max_reconsume_times < 0:
        parser.error(f"--max-reconsume-times must be >= 0, got {args.max_reconsume_times}")
    began = time.monotonic()
    try:
        ctx: JobContext = start(args, app_name="lakemq-retry")
    except Exception as exc:  # bad store path, no Java, bad conf: one line, not a traceback
        return fail(PROG, exc, EXIT_USAGE)
    stats = RetryStats()
    options: dict[str, Any] = {
        "checkpoint": args.checkpoint,
        "stats": stats,
        "max_reconsume_times": args.max_reconsume_times,
    }
    try:
        if args.once:
            run_retry(ctx.spark, ctx.store, once=True, **options)
        else:
            with StopSignal() as stop:
                query = run_retry(ctx.spark, ctx.store, once=False, trigger_ms=args.trigger_ms, **options)
                serve(query, stop.event)
        print(summary(ctx.store, stats, time.monotonic() - began))
        return EXIT_OK
    except Exception as exc:
        return fail(PROG, exc, EXIT_FAILED)
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
