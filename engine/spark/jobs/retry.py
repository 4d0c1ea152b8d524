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

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from engine.broker.retry import ROUTE_COLUMNS, RetryRouter, routed_version
from engine.protocol.delays import MaxReconsume
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import run_log_job
from engine.store import schemas
from engine.store.store import Store

JOB = "retry"
DEFAULT_TRIGGER_MS = 500


@dataclass
class RetryStats(JobStats):
    """Progress of one run of the job (updated on the driver, once per micro-batch)."""

    batches: int = 0
    rows: int = 0
    routed: int = 0

    def add(self, rows: int, routed: int) -> None:
        self.count(batches=1, rows=rows, routed=routed)


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
    """Start the retry query on ``spark`` for ``store`` (action-log failures -> retry topics, DLQs).

    The arguments, result and errors are those of every job's ``run``
    (:class:`~engine.spark.jobs.registry.Job`), and:

    Args:
        trigger_ms: the trigger interval of a running query.
        max_reconsume_times: per-group (mapping) or global (int) limit; default the config's.

    Raises:
        InvalidArgumentError: a bad ``max_reconsume_times``.
    """
    counters = stats if stats is not None else RetryStats()
    router = RetryRouter(store, max_reconsume_times=max_reconsume_times)

    def route_batch(rows: pa.Table) -> None:
        # The router drops rows of versions already routed, so a replayed batch re-puts nothing.
        routed = router.route(rows) if rows.num_rows else 0
        counters.add(rows.num_rows, routed)

    return run_log_job(
        spark,
        store,
        job=JOB,
        table=schemas.ACTION_LOG,
        columns=ROUTE_COLUMNS,
        handler=route_batch,
        marker=lambda: routed_version(store),
        once=once,
        checkpoint=checkpoint,
        trigger_ms=trigger_ms,
    )


def summary(store: Store, stats: RetryStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"retry: {stats.routed} messages re-put from {stats.rows} action-log rows in {stats.batches} "
        f"batches ({elapsed_s:.1f}s); action_log routed through version {routed_version(store)}"
    )
