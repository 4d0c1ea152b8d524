"""The retry job: consumers' failures in action_log -> %RETRY%<group> (delayed) or %DLQ%<group>.

The query is triggered by new action-log commits (:func:`~engine.spark.jobs.streams.run_log_job`:
Delta's streaming source, or ``deltalog`` without Delta); the action-log rows of every version not
yet routed go to :meth:`engine.broker.retry.RetryRouter.route`, which re-puts
the NACKed / EXPIRED messages in one commit-log commit together with Delta app transactions
recording the last action-log version routed. A replayed micro-batch (a restart after a crash, a
lost checkpoint, a second instance) therefore re-puts nothing: exactly once, whatever the
checkpoint says. Retries wait in ``SCHEDULE_TOPIC_XXXX``; the schedule job delivers them.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from engine.broker.retry import ROUTE_COLUMNS, RetryRouter, routed_version
from engine.protocol.delays import MaxReconsume
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import LogJob
from engine.store import schemas
from engine.store.store import Store


class RetryStats(JobStats):
    """Micro-batches, action-log rows read and messages routed to retry or dead-letter topics."""

    COUNTERS = ("batches", "rows", "routed")


def retry_batches(
    store: Store, stats: JobStats, *, max_reconsume_times: MaxReconsume = None
) -> Callable[[pa.Table], None]:
    """The retry job's micro-batch: route its failures (:class:`RetryRouter`).

    Args:
        max_reconsume_times: per-group (mapping) or global (int) limit; default the config's.

    Raises:
        InvalidArgumentError: a bad ``max_reconsume_times`` (before the query starts).
    """
    router = RetryRouter(store, max_reconsume_times=max_reconsume_times)

    def route_batch(rows: pa.Table) -> None:
        # The router drops rows of versions already routed, so a replayed batch re-puts nothing.
        routed = router.route(rows) if rows.num_rows else 0
        stats.count(batches=1, rows=rows.num_rows, routed=routed)

    return route_batch


RETRY_JOB = LogJob(
    name="retry",
    table=schemas.ACTION_LOG,
    columns=ROUTE_COLUMNS,
    covered=routed_version,
    handler=retry_batches,
    stats=RetryStats,
    trigger_ms=500,
    output=schemas.COMMIT_LOG,
    line=(
        "retry: {routed} messages re-put from {rows} action-log rows in {batches} batches "
        "({elapsed_s:.1f}s); action_log routed through version {covered}"
    ),
)
run_retry = RETRY_JOB.run
