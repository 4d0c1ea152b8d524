"""The pull-log job: action_log PULL rows -> pull_log, as a Spark structured-streaming query.

The source is the action log read through the ``deltalog`` data source from the first version not yet
covered; each micro-batch goes to :func:`engine.broker.pull_log.build_pull_log_rows`, which commits
the pull-log rows together with a Delta app transaction recording the last action-log version
covered (app id ``mq.pull_log``). A replayed micro-batch (a restart, a lost checkpoint, a second
builder) therefore adds nothing: exactly once, whatever the checkpoint says.

Usage::

    python jobs/pull_log.py --store ./mqdata --once     # build from what is committed, then exit
    ./spark-submit.sh jobs/pull_log.py --store ./mqdata  # run until SIGTERM / Ctrl-C
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.broker.pull_log import PULL_LOG_SOURCE_COLUMNS, build_pull_log_rows, pulled_version
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

JOB = "pull_log"
PROG = "jobs/pull_log.py"
TRIGGER_MS = 1000


@dataclass
class PullLogStats:
    """Progress of one run of the job (updated on the driver, once per micro-batch)."""

    batches: int = 0
    actions: int = 0
    pulls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, actions: int, pulls: int) -> None:
        with self._lock:
            self.batches += 1
            self.actions += actions
            self.pulls += pulls


def action_log_stream(spark: Any, store: Store, starting_version: int) -> Any:
    """The action log's new rows from ``starting_version`` on, as a streaming DataFrame."""
    reader = (
        spark.readStream.format(SHORT_NAME)
        .option("path", store.uri(schemas.ACTION_LOG))
        .option("startingVersion", str(starting_version))
        .option("columns", ",".join(PULL_LOG_SOURCE_COLUMNS))
    )
    if store.storage_options:
        reader = reader.option("storageOptions", json.dumps(store.storage_options))
    return reader.load()


def run_pull_log(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    stats: PullLogStats | None = None,
    trigger_ms: int = TRIGGER_MS,
) -> Any:
    """Start the pull-log query on ``spark`` for ``store``.

    Args:
        spark: a SparkSession with the project's data sources (:func:`engine.spark.session`).
        store: the store.
        once: process every version committed now and wait for the query to finish
            (``Trigger.AvailableNow``); otherwise start a query triggered every ``trigger_ms`` and
            return it running.
        checkpoint: the streaming checkpoint; default ``<store>/_checkpoints/pull_log``.
        stats: counters to update after each micro-batch.
        trigger_ms: the processing-time trigger of a running query.

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only).
    """
    counters = stats if stats is not None else PullLogStats()

    def build_batch(batch: Any, batch_id: int) -> None:
        # Called once per micro-batch on the driver; idempotent per action-log version, so a replay of
        # batch_id adds nothing.
        rows = batch.toArrow()
        pulls = build_pull_log_rows(store, rows) if rows.num_rows else 0
        counters.add(rows.num_rows, pulls)

    frame = action_log_stream(spark, store, pulled_version(store) + 1)
    writer = (
        frame.select(*PULL_LOG_SOURCE_COLUMNS, VERSION_COLUMN)
        .writeStream.queryName(f"lakemq-pull-log-{store.store_id}")
        .foreachBatch(build_batch)
        .option("checkpointLocation", checkpoint_location(store, JOB, checkpoint))
    )
    if once:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return query
    return writer.trigger(processingTime=f"{trigger_ms} milliseconds").start()


def serve(query: Any, stop: threading.Event, poll_s: float = 0.5) -> None:
    """Wait until ``stop`` is set or the query ends; then stop the query cleanly.

    Raises:
        pyspark.errors.StreamingQueryException: the query failed.
    """
    try:
        while query.isActive and not stop.is_set():
            query.awaitTermination(poll_s)
    finally:
        if query.isActive:
            query.stop()
    query.awaitTermination()


def summary(store: Store, stats: PullLogStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"pull_log: {stats.pulls} pull-log rows from {stats.actions} action-log rows in "
        f"{stats.batches} batches ({elapsed_s:.1f}s); pull_log version {store.version(schemas.PULL_LOG)}, "
        f"action_log covered through version {pulled_version(store)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pull-log job; returns the exit code (0 ok, 1 the query failed, 2 bad input)."""
    parser = argument_parser(JOB, "Build each consumer's pull log from the action log.")
    args = parser.parse_args(argv)
    began = time.monotonic()
    try:
        ctx: JobContext = start(args, app_name="lakemq-pull-log")
    except Exception as exc:  # bad store path, no Java, bad conf: one line, not a traceback
        return fail(PROG, exc, EXIT_USAGE)
    stats = PullLogStats()
    try:
        if args.once:
            run_pull_log(ctx.spark, ctx.store, once=True, checkpoint=args.checkpoint, stats=stats)
        else:
            with StopSignal() as stop:
                query = run_pull_log(
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
