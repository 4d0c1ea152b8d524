"""The maintenance job: retention, compaction, checkpoints and vacuum of a store, periodically.

Each pass is :func:`engine.broker.maintenance.maintain` (store-level work on the driver) and prints
one summary line. Periodic mode is a structured-streaming query on Spark's ``rate`` source used as a
ticker, one micro-batch (one pass) per ``--interval``: the job is then one more query of the broker
app, with the same lifecycle, stop signal and UI as the others. ``--once`` needs no Spark at all and
starts no JVM.

Retention keeps messages some group has not consumed; ``--force`` deletes by age alone (RocketMQ's
rule). Exit codes: 0 ok, 1 a pass failed, 2 bad input (one line on stderr).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from engine.broker.maintenance import DEFAULT_INTERVAL_S, DEFAULT_MIN_FILES, MaintenanceReport, maintain
from engine.errors import InvalidArgumentError
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import start_query
from engine.store.store import Store

JOB = "maintenance"


@dataclass(frozen=True)
class PassOptions:
    """Arguments of every pass (see :func:`engine.broker.maintenance.maintain`)."""

    force: bool = False
    file_reserved_hours: float | None = None
    vacuum_retention_hours: float | None = None
    min_files: int = DEFAULT_MIN_FILES
    target_file_size: int | None = None


class MaintenanceStats(JobStats):
    """Passes of one run of the job and how many of them reported errors."""

    COUNTERS = ("passes", "failed_passes")

    @property
    def errors(self) -> int:
        return self.failed_passes


def run_pass(store: Store, options: PassOptions | None = None) -> MaintenanceReport:
    """One pass of maintenance, printed as one line."""
    report = maintain(store, **asdict(options or PassOptions()))
    print(report.summary(), flush=True)
    return report


def run_maintenance(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    options: PassOptions | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
    on_pass: Callable[[MaintenanceReport], None] | None = None,
    stats: MaintenanceStats | None = None,
) -> Any:
    """Run maintenance of ``store``: one pass now, or a ticker query on ``spark``.

    Args:
        spark: a SparkSession (unused, may be None, when ``once``).
        store: the store.
        once: run one pass and return its :class:`MaintenanceReport`; otherwise start a streaming
            query (``rate`` source, trigger every ``interval_s``) running one pass per micro-batch on
            the driver, and return it running.
        checkpoint: the ticker's streaming checkpoint; default ``<store>/_checkpoints/maintenance``.
            It holds no progress (every pass starts from the tables' state), only the ticker's.
        options: arguments of every pass.
        interval_s: seconds between passes.
        on_pass: called with each pass's report.
        stats: counters to update after each pass.

    Raises:
        InvalidArgumentError: bad options or interval (before anything runs).
    """
    opts = options or PassOptions()
    if isinstance(interval_s, bool) or not isinstance(interval_s, int | float) or not interval_s > 0:
        raise InvalidArgumentError(f"interval_s must be > 0, got {interval_s!r}", interval_s=interval_s)

    def one_pass() -> MaintenanceReport:
        report = run_pass(store, opts)
        if stats is not None:
            stats.count(passes=1, failed_passes=1 if report.errors else 0)
        if on_pass is not None:
            on_pass(report)
        return report

    if once:
        return one_pass()

    def tick(batch: Any, batch_id: int) -> None:
        # Called once per micro-batch on the driver. The ticker's rows are ignored: a pass reads the
        # tables' state, so a replayed batch id just runs one more (idempotent) pass.
        one_pass()

    ticker = spark.readStream.format("rate").option("rowsPerSecond", "1").option("numPartitions", "1").load()
    return start_query(
        ticker, store, JOB, tick, once=False, checkpoint=checkpoint, trigger_ms=int(interval_s * 1000)
    )


def summary(store: Store, stats: MaintenanceStats, elapsed_s: float) -> str | None:
    """Nothing: every pass has printed its own line (:func:`run_pass`)."""
    return None
