"""The schedule job: due delayed and timer messages -> their real topic, as a Spark streaming query.

Due times pass without new data arriving, so the query is driven by Spark's built-in
``rate-micro-batch`` source as a ticker: one row per micro-batch, a micro-batch every
``trigger_ms`` (250 ms by default). Each micro-batch calls :meth:`Scheduler.deliver_due` on the
driver, which re-puts every message due by then in one commit-log commit carrying the schedule's
progress as Delta app transactions (:mod:`engine.broker.schedule`). The ticker's checkpoint holds
no progress: a replayed micro-batch, a restart or a second instance delivers nothing twice.

The schedule reads the consume queue, so the dispatch job must run alongside (it indexes the
schedule topic's entries, then the re-put messages). With ``--once`` the job dispatches what is
committed, delivers everything due now, dispatches the deliveries and exits.

Usage::

    python jobs/schedule.py --store ./mqdata --once     # deliver what is due now, then exit
    ./spark-submit.sh jobs/schedule.py --store ./mqdata  # run until SIGTERM / Ctrl-C
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.broker.dispatch import dispatch_pending
from engine.broker.schedule import Scheduler
from engine.broker.schedule_state import schedule_progress
from engine.store.store import Store
from jobs._common import (
    EXIT_OK,
    JobArgumentParser,
    JobContext,
    add_trigger_ms,
    job_main,
    positive,
    run_or_serve,
    start_query,
)

JOB = "schedule"
PROG = "jobs/schedule.py"
DEFAULT_TRIGGER_MS = 250


@dataclass
class ScheduleStats:
    """Progress of one run of the job (updated on the driver, once per micro-batch)."""

    ticks: int = 0
    delivered: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, delivered: int) -> None:
        with self._lock:
            self.ticks += 1
            self.delivered += delivered


def ticker(spark: Any, interval_ms: int) -> Any:
    """A streaming DataFrame of one row per micro-batch: the job's clock."""
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", "1")
        .option("numPartitions", "1")
        .option("advanceMillisPerBatch", str(interval_ms))
        .load()
    )


def run_schedule(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    stats: ScheduleStats | None = None,
    trigger_ms: int = DEFAULT_TRIGGER_MS,
    dispatch: bool | None = None,
    scheduler: Scheduler | None = None,
) -> Any:
    """Start the schedule query on ``spark`` for ``store``.

    Args:
        spark: a SparkSession (:func:`engine.spark.session`).
        store: the store whose schedule topic to deliver.
        once: dispatch, deliver everything due now, dispatch again, and wait for the query to
            finish (``Trigger.AvailableNow``); otherwise start a query ticking every
            ``trigger_ms`` and return it running.
        checkpoint: the streaming checkpoint; default ``<store>/_checkpoints/schedule``.
        stats: counters to update after each micro-batch.
        trigger_ms: the tick interval of a running query.
        dispatch: also dispatch the commit log around each delivery (default: only when
            ``once``; a running schedule relies on the dispatch job).
        scheduler: the :class:`Scheduler` to use (default a new one).

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only; a running
            query reports it through ``exception()`` / ``awaitTermination()``).
    """
    counters = stats if stats is not None else ScheduleStats()
    service = scheduler if scheduler is not None else Scheduler(store)
    with_dispatch = once if dispatch is None else dispatch

    def tick(batch: Any, batch_id: int) -> None:
        # Called once per micro-batch on the driver. Idempotent whatever batch_id says: deliveries
        # are exactly once through the commit log's app transactions; the rows are only a clock.
        if with_dispatch:
            dispatch_pending(store)
        delivered = service.deliver_due()
        if with_dispatch and delivered:
            dispatch_pending(store)
        counters.add(delivered)

    return start_query(
        ticker(spark, trigger_ms), store, JOB, tick, once=once, checkpoint=checkpoint, trigger_ms=trigger_ms
    )


def summary(store: Store, stats: ScheduleStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    progress = schedule_progress(store)
    busy = sum(1 for offset in progress.values() if offset >= 0)
    return (
        f"schedule: {stats.delivered} messages delivered in {stats.ticks} ticks ({elapsed_s:.1f}s); "
        f"{busy} of {len(progress)} schedule queues have delivered"
    )


def _options(parser: JobArgumentParser) -> None:
    add_trigger_ms(parser, DEFAULT_TRIGGER_MS, "tick interval of a running job")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the schedule job; returns the process exit code (0 ok, 1 the query failed, 2 bad input)."""
    stats = ScheduleStats()

    def run(ctx: JobContext, args: Any) -> int:
        run_or_serve(
            args.once,
            lambda once: run_schedule(
                ctx.spark,
                ctx.store,
                once=once,
                checkpoint=args.checkpoint,
                stats=stats,
                trigger_ms=args.trigger_ms,
            ),
        )
        print(summary(ctx.store, stats, ctx.elapsed_s()))
        return EXIT_OK

    return job_main(
        JOB,
        "Deliver due delayed and timer messages to their real topics.",
        argv,
        run,
        options=_options,
        check=lambda args: positive("--trigger-ms", args.trigger_ms),
    )


if __name__ == "__main__":
    sys.exit(main())
