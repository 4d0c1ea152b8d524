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
"""

from __future__ import annotations

import time
from typing import Any

from engine.broker.dispatch import dispatch_pending
from engine.broker.schedule import Scheduler
from engine.broker.schedule_state import schedule_progress
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import start_query, ticker
from engine.store.store import Store, now_ms

JOB = "schedule"
DEFAULT_TRIGGER_MS = 250
WAIT_SHARE = 0.8  # of a tick, spent waiting for what falls due before the next one


class ScheduleStats(JobStats):
    """Ticks of one run and the delayed messages they delivered."""

    COUNTERS = ("ticks", "delivered")


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
    """Start the schedule query on ``spark`` for ``store``: a ticker delivering what is due.

    The arguments, result and errors are those of every job's ``run``
    (:class:`~engine.spark.jobs.registry.Job`); with ``once`` the job dispatches, delivers
    everything due now and dispatches again. Also:

    Args:
        trigger_ms: the tick interval of a running query.
        dispatch: also dispatch the commit log around each delivery (default: only when
            ``once``; a running schedule relies on the dispatch job).
        scheduler: the :class:`Scheduler` to use (default a new one).
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
        if not once:
            delivered += _deliver_within(service, trigger_ms)
        if with_dispatch and delivered:
            dispatch_pending(store)
        counters.count(ticks=1, delivered=delivered)

    return start_query(
        ticker(spark, trigger_ms), store, JOB, tick, once=once, checkpoint=checkpoint, trigger_ms=trigger_ms
    )


def _deliver_within(service: Scheduler, trigger_ms: int) -> int:
    """Deliver what falls due before the next tick at its due time, not at the tick after it (a
    tick's wait was most of a delayed message's lateness); returns how many were delivered."""
    delivered = 0
    until = time.monotonic() + WAIT_SHARE * trigger_ms / 1000
    stale = None  # a hint that delivered nothing (another instance was first): not waited for again
    while True:
        due = service.next_due_ms()
        if due is None or due == stale:
            return delivered
        wait = max(0.0, (due - now_ms()) / 1000)
        if time.monotonic() + wait >= until:
            return delivered
        time.sleep(wait)
        got = service.deliver_due()
        delivered += got
        if not got:
            stale = due


def summary(store: Store, stats: ScheduleStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    progress = schedule_progress(store)
    busy = sum(1 for offset in progress.values() if offset >= 0)
    return (
        f"schedule: {stats.delivered} messages delivered in {stats.ticks} ticks ({elapsed_s:.1f}s); "
        f"{busy} of {len(progress)} schedule queues have delivered"
    )
