"""The transaction check job: old undecided half messages -> check requests, or a rollback.

A Spark structured-streaming query driven by a ticker (the ``rate-micro-batch`` source: one row per
micro-batch, one micro-batch per trigger); each micro-batch runs one pass of
:func:`engine.broker.transactions.check_transactions`. A pass is safe to repeat and to run from
several places (a request is re-sent only after the check interval; decisions are exclusive), so
the at-least-once ``foreachBatch`` needs no further idempotency marker.
"""

from __future__ import annotations

from typing import Any

from engine.broker.transactions import check_transactions
from engine.errors import InvalidArgumentError
from engine.protocol.transactions import (
    DEFAULT_CHECK_INTERVAL_MS,
    DEFAULT_MAX_CHECKS,
    DEFAULT_TIMEOUT_MS,
    validate_check_settings,
)
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import start_query, ticker
from engine.store.commit_log import CommitLogs
from engine.store.store import Store

JOB = "transaction_check"
TRIGGER_MS = 5000


class CheckStats(JobStats):
    """Passes of one run and the halves they checked or rolled back."""

    COUNTERS = ("passes", "acted")


def run_transaction_check(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    stats: CheckStats | None = None,
    trigger_ms: int = TRIGGER_MS,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    max_checks: int = DEFAULT_MAX_CHECKS,
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS,
    now_ms: int | None = None,
) -> Any:
    """Start the transaction-check query on ``spark`` for ``store``: a ticker, one pass per tick.

    The arguments, result and errors are those of every job's ``run``
    (:class:`~engine.spark.jobs.registry.Job`); with ``once`` the job runs one pass. Also:

    Args:
        trigger_ms: time between passes of a running query.
        timeout_ms, max_checks, check_interval_ms: as :func:`check_transactions` (RocketMQ's 6 s,
            15 checks, 30 s by default).
        now_ms: a fixed clock for every pass (tests); default the time of each pass.

    Raises:
        InvalidArgumentError: a bad trigger or check setting.
    """
    if isinstance(trigger_ms, bool) or not isinstance(trigger_ms, int) or trigger_ms < 1:
        raise InvalidArgumentError(f"trigger_ms {trigger_ms!r} must be an int >= 1", trigger_ms=trigger_ms)
    validate_check_settings(timeout_ms, max_checks, check_interval_ms)  # here, not in a micro-batch
    counters = stats if stats is not None else CheckStats()
    writer = CommitLogs(store)  # rollbacks go to the shard of each half's real queue

    def check_batch(batch: Any, batch_id: int) -> None:
        # Called once per micro-batch on the driver; the ticker's rows only pace the passes.
        acted = check_transactions(
            store,
            now_ms=now_ms,
            timeout_ms=timeout_ms,
            max_checks=max_checks,
            check_interval_ms=check_interval_ms,
            writer=writer,
        )
        counters.count(passes=1, acted=acted)

    return start_query(
        ticker(spark, trigger_ms),
        store,
        JOB,
        check_batch,
        once=once,
        checkpoint=checkpoint,
        trigger_ms=trigger_ms,
    )


def summary(store: Store, stats: CheckStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"transaction_check: {stats.acted} halves checked or rolled back in {stats.passes} passes "
        f"({elapsed_s:.1f}s)"
    )
