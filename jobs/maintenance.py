"""The maintenance job: retention, compaction, checkpoints and vacuum of a store, periodically.

Each pass is :func:`engine.broker.maintenance.maintain` (store-level work on the driver) and prints
one summary line. Periodic mode is a structured-streaming query on Spark's ``rate`` source used as a
ticker, one micro-batch (one pass) per ``--interval``: the job is then one more query of the broker
app, with the same lifecycle, stop signal and UI as the others. ``--once`` needs no Spark at all and
starts no JVM.

Usage::

    python jobs/maintenance.py --store ./mqdata --once            # one pass, then exit
    ./spark-submit.sh jobs/maintenance.py --store ./mqdata       # a pass now, then every 5 minutes

Retention keeps messages some group has not consumed; ``--force`` deletes by age alone (RocketMQ's
rule). Exit codes: 0 ok, 1 a pass failed, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from engine.broker.maintenance import DEFAULT_MIN_FILES, MaintenanceReport, maintain
from engine.errors import InvalidArgumentError
from engine.store.store import Store
from jobs._common import (
    EXIT_FAILED,
    EXIT_OK,
    JobArgumentParser,
    JobContext,
    job_main,
    positive,
    run_or_serve,
    start_query,
)

JOB = "maintenance"
PROG = "jobs/maintenance.py"
DEFAULT_INTERVAL_S = 300.0


@dataclass(frozen=True)
class PassOptions:
    """Arguments of every pass (see :func:`engine.broker.maintenance.maintain`)."""

    force: bool = False
    file_reserved_hours: float | None = None
    vacuum_retention_hours: float | None = None
    min_files: int = DEFAULT_MIN_FILES
    target_file_size: int | None = None


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

    Raises:
        InvalidArgumentError: bad options or interval (before anything runs).
    """
    opts = options or PassOptions()
    if isinstance(interval_s, bool) or not isinstance(interval_s, int | float) or not interval_s > 0:
        raise InvalidArgumentError(f"interval_s must be > 0, got {interval_s!r}", interval_s=interval_s)
    if once:
        report = run_pass(store, opts)
        if on_pass is not None:
            on_pass(report)
        return report

    def tick(batch: Any, batch_id: int) -> None:
        # Called once per micro-batch on the driver. The ticker's rows are ignored: a pass reads the
        # tables' state, so a replayed batch id just runs one more (idempotent) pass.
        report = run_pass(store, opts)
        if on_pass is not None:
            on_pass(report)

    ticker = spark.readStream.format("rate").option("rowsPerSecond", "1").option("numPartitions", "1").load()
    return start_query(
        ticker, store, JOB, tick, once=False, checkpoint=checkpoint, trigger_ms=int(interval_s * 1000)
    )


def _options(args: Any) -> PassOptions:
    return PassOptions(
        force=bool(args.force),
        file_reserved_hours=args.file_reserved_hours,
        vacuum_retention_hours=args.vacuum_hours,
        min_files=args.min_files,
        target_file_size=args.target_file_size,
    )


def _arguments(parser: JobArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="delete old messages even if unconsumed")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between passes")
    parser.add_argument("--file-reserved-hours", type=float, default=None, help="message retention (72)")
    parser.add_argument("--vacuum-hours", type=float, default=None, help="keep removed files this long (24)")
    parser.add_argument(
        "--min-files", type=int, default=DEFAULT_MIN_FILES, help="small files worth a rewrite"
    )
    parser.add_argument("--target-file-size", type=int, default=None, help="bytes per compacted file")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the maintenance job; returns the exit code (0 ok, 1 a pass failed, 2 bad input).

    ``--once`` runs one pass without Spark; otherwise a pass now, then one per ``--interval``.
    """

    def run(ctx: JobContext, args: Any) -> int:
        options = _options(args)
        if args.once:
            report = run_maintenance(None, ctx.store, once=True, options=options)
            return EXIT_FAILED if report.errors else EXIT_OK

        def periodic(once: bool) -> Any:
            run_maintenance(None, ctx.store, once=True, options=options)  # a pass now, not in 5 minutes
            return run_maintenance(
                ctx.spark,
                ctx.store,
                once=False,
                checkpoint=args.checkpoint,
                options=options,
                interval_s=args.interval,
            )

        run_or_serve(False, periodic)
        return EXIT_OK

    return job_main(
        JOB,
        "Compact, checkpoint, expire and vacuum the tables of a store.",
        argv,
        run,
        options=_arguments,
        check=lambda args: positive("--interval", args.interval),
        needs_spark=lambda args: not args.once,
    )


if __name__ == "__main__":
    sys.exit(main())
