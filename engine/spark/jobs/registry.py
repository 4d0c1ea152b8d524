"""Every broker job, declared once: its name, options, run and summary.

The jobs are listed (:data:`JOBS`, :data:`JOB_ORDER`) in the order of their first step in the broker's
pass plan (:data:`engine.broker.plan.PLAN`): the order a running broker app starts them. The plan,
not this module, orders the broker's passes; a job here is one of its steps.

``jobs/<job>.py`` (the spark-submit entry points), ``jobs/broker.py`` (every job in one Spark app),
``jobs/demo.py`` and ``mq dispatch`` all take their jobs from :data:`JOBS`; a job added here is
runnable from each of them. A job's logic lives in its own module next to this one
(``engine/spark/jobs/<job>.py``, with ``run_<job>`` and ``summary``); what every job's program
shares is :mod:`engine.spark.jobs.runner`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from engine.broker.maintenance import DEFAULT_INTERVAL_S, DEFAULT_MIN_FILES
from engine.broker.plan import plan_jobs
from engine.errors import InvalidArgumentError
from engine.protocol.transactions import DEFAULT_CHECK_INTERVAL_MS, DEFAULT_MAX_CHECKS, DEFAULT_TIMEOUT_MS
from engine.spark.jobs import dispatch, index, maintenance, pull_log, retry, schedule, transaction_check
from engine.spark.jobs.runner import (
    EXIT_FAILED,
    EXIT_OK,
    JobArgumentParser,
    JobContext,
    Option,
    job_main,
    not_negative,
    positive,
    run_or_serve,
    trigger_ms_option,
)
from engine.spark.jobs.stats import JobStats
from engine.store import schemas
from engine.store.store import Store


@dataclass(frozen=True)
class Job:
    """One broker job.

    Attributes:
        name: ``dispatch``, ``index``, ...: the program ``jobs/<name>.py``, the query name, the
            default checkpoint ``<store>/_checkpoints/<name>`` and the status file.
        description: the ``--help`` text.
        run: ``run(spark, store, *, once=True, checkpoint=None, stats=None, **keywords)``, the
            contract every ``run_<job>`` keeps. ``spark`` is a SparkSession with the project's data
            sources (:func:`engine.spark.session`). With ``once`` it processes what is committed now
            (``Trigger.AvailableNow``), waits for the query to finish and returns it (maintenance:
            the pass's report); otherwise it starts the query on its trigger and returns it
            running. ``checkpoint`` is the streaming checkpoint (default
            ``<store>/_checkpoints/<name>``); ``stats`` is updated once per micro-batch on the
            driver. A failed micro-batch raises ``pyspark.errors.StreamingQueryException`` when
            ``once``; a running query reports it through ``exception()`` / ``awaitTermination()``.
        summary: ``summary(store, stats, elapsed_s)``: the line a run of the program ends with
            (None: nothing to add).
        stats: makes the counters ``run`` updates.
        options: the job's own command-line options; each value goes to ``run`` as a keyword.
        keywords: turns parsed arguments into ``run``'s keywords when they are not the options'
            values one for one.
        source_table: the table whose log feeds the job (its end-to-end delay is measured on it).
        once_needs_spark: whether ``--once`` starts Spark (maintenance's pass does not need it).
        pass_before_serving: before starting the running query, run once (maintenance: a pass
            now rather than after the first interval).
        plan_keywords: what the broker's ``--once`` plan adds to ``run``'s keywords.
    """

    name: str
    description: str
    run: Callable[..., Any]
    summary: Callable[[Store, Any, float], str | None]
    stats: Callable[[], JobStats]
    options: tuple[Option, ...] = ()
    keywords: Callable[[argparse.Namespace], dict[str, Any]] | None = None
    source_table: str | None = None
    once_needs_spark: bool = True
    pass_before_serving: bool = False
    plan_keywords: Mapping[str, Any] = field(default_factory=dict)

    def add_options(self, parser: JobArgumentParser) -> None:
        for option in self.options:
            option.add_to(parser)

    def check(self, args: argparse.Namespace) -> None:
        """Raise on a bad option value, before anything starts."""
        for option in self.options:
            if option.check is not None:
                option.check(option.flag, getattr(args, option.dest))

    def arguments(self, args: argparse.Namespace) -> dict[str, Any]:
        """``run``'s keywords from parsed arguments."""
        if self.keywords is not None:
            return self.keywords(args)
        return {option.keyword or option.dest: getattr(args, option.dest) for option in self.options}

    def _serve(self, ctx: JobContext, args: argparse.Namespace) -> int:
        stats = self.stats()
        keywords = self.arguments(args)

        def start(once: bool) -> Any:
            if not once and self.pass_before_serving:
                self.run(ctx.spark, ctx.store, once=True, checkpoint=args.checkpoint, stats=stats, **keywords)
            return self.run(
                ctx.spark, ctx.store, once=once, checkpoint=args.checkpoint, stats=stats, **keywords
            )

        run_or_serve(args.once, start)
        line = self.summary(ctx.store, stats, ctx.elapsed_s())
        if line is not None:
            print(line)
        return EXIT_FAILED if args.once and stats.errors else EXIT_OK

    def main(self, argv: Sequence[str] | None = None) -> int:
        """Run the job as a program; returns the exit code (0 ok, 1 it failed, 2 bad input).

        ``--once`` processes what is committed and exits; otherwise the query runs until SIGTERM /
        SIGINT. The run's summary line goes to stdout; errors are one line on stderr.
        """
        return job_main(
            self.name,
            self.description,
            argv,
            self._serve,
            options=self.add_options,
            check=self.check,
            needs_spark=lambda args: self.once_needs_spark or not args.once,
        )


def _maintenance_keywords(args: argparse.Namespace) -> dict[str, Any]:
    options = maintenance.PassOptions(
        force=bool(args.force),
        file_reserved_hours=args.file_reserved_hours,
        vacuum_retention_hours=args.vacuum_hours,
        min_files=args.min_files,
        target_file_size=args.target_file_size,
    )
    return {"options": options, "interval_s": args.interval}


# Every job the broker knows; :data:`JOBS` lists them in the plan's order.
_DECLARED: tuple[Job, ...] = (
    Job(
        "dispatch",
        "Dispatch commit-log messages into the consume queue.",
        dispatch.run_dispatch,
        dispatch.summary,
        dispatch.DispatchStats,
        source_table=schemas.COMMIT_LOG,
    ),
    Job(
        "index",
        "Index messages by key and uniq key for query_by_key / query_by_uniq_key.",
        index.run_index,
        index.INDEX_JOB.summary,
        index.IndexStats,
        options=(trigger_ms_option(index.INDEX_JOB.trigger_ms),),
        source_table=schemas.COMMIT_LOG,
    ),
    Job(
        "schedule",
        "Deliver due delayed and timer messages to their real topics.",
        schedule.run_schedule,
        schedule.summary,
        schedule.ScheduleStats,
        options=(trigger_ms_option(schedule.DEFAULT_TRIGGER_MS, "tick interval of a running job"),),
        plan_keywords={"dispatch": False},  # the plan dispatches before and after it
    ),
    Job(
        "retry",
        "Route NACKed messages to retry topics and dead-letter queues.",
        retry.RETRY_JOB.run,
        retry.RETRY_JOB.summary,
        retry.RetryStats,
        options=(
            Option(
                "--max-reconsume-times",
                "reconsume limit for every group (default: the engine config's, 16)",
                type=int,
                check=not_negative,
            ),
            trigger_ms_option(retry.RETRY_JOB.trigger_ms),
        ),
        source_table=schemas.ACTION_LOG,
    ),
    Job(
        "pull_log",
        "Build each consumer's pull log from the action log.",
        pull_log.PULL_LOG_JOB.run,
        pull_log.PULL_LOG_JOB.summary,
        pull_log.PullLogStats,
        source_table=schemas.ACTION_LOG,
    ),
    Job(
        "transaction_check",
        "Check back undecided transactional messages; roll back the abandoned.",
        transaction_check.run_transaction_check,
        transaction_check.summary,
        transaction_check.CheckStats,
        options=(
            # run_transaction_check checks it (InvalidArgumentError, exit 2) with the other settings.
            trigger_ms_option(transaction_check.TRIGGER_MS, "time between passes", checked=False),
            Option("--timeout-ms", "age before a first check", type=int, default=DEFAULT_TIMEOUT_MS),
            Option("--max-checks", "checks before rollback", type=int, default=DEFAULT_MAX_CHECKS),
            Option("--check-interval-ms", "time between checks", type=int, default=DEFAULT_CHECK_INTERVAL_MS),
        ),
    ),
    Job(
        "maintenance",
        "Compact, checkpoint, expire and vacuum the tables of a store.",
        maintenance.run_maintenance,
        maintenance.summary,
        maintenance.MaintenanceStats,
        options=(
            Option("--force", "delete old messages even if unconsumed"),
            Option(
                "--interval",
                "seconds between passes",
                type=float,
                default=DEFAULT_INTERVAL_S,
                check=positive,
            ),
            Option("--file-reserved-hours", "message retention (72)", type=float),
            Option("--vacuum-hours", "keep removed files this long (24)", type=float),
            Option("--min-files", "small files worth a rewrite", type=int, default=DEFAULT_MIN_FILES),
            Option("--target-file-size", "bytes per compacted file", type=int),
        ),
        keywords=_maintenance_keywords,
        once_needs_spark=False,
        pass_before_serving=True,
    ),
)
_BY_NAME: Mapping[str, Job] = MappingProxyType({job.name: job for job in _DECLARED})
# Every job the broker knows, in the order of the broker's pass plan (each at its first step).
JOB_ORDER: tuple[str, ...] = plan_jobs()
if set(JOB_ORDER) != set(_BY_NAME):  # a step without its Spark job, or a job the plan never runs
    raise RuntimeError(
        f"the broker plan's jobs {sorted(JOB_ORDER)} are not the registry's {sorted(_BY_NAME)}"
    )
JOBS: tuple[Job, ...] = tuple(_BY_NAME[name] for name in JOB_ORDER)


def job_named(name: str) -> Job:
    """The job called ``name``.

    Raises:
        InvalidArgumentError: no job has that name.
    """
    job = _BY_NAME.get(name)
    if job is None:
        raise InvalidArgumentError(f"unknown job {name!r}; jobs: {', '.join(JOB_ORDER)}", job=name)
    return job


def main(name: str, argv: Sequence[str] | None = None) -> int:
    """Run the job called ``name`` as a program (``jobs/<name>.py``); returns the exit code."""
    return job_named(name).main(argv)


def entry_point(name: str, module: str) -> Callable[[Sequence[str] | None], int]:
    """The ``main`` of ``jobs/<name>.py``; called as the program (``module`` is ``"__main__"``), it runs.

    Each entry point is ``main = entry_point("<job>", __name__)``: imported, it only defines ``main``;
    run by ``python`` or ``spark-submit``, the job runs with ``sys.argv`` and the process exits with
    its code.
    """
    job = job_named(name)

    def main(argv: Sequence[str] | None = None) -> int:
        return job.main(argv)

    main.__doc__ = f"Run the {name} job as a program; returns the exit code (0 ok, 1 failed, 2 bad input)."
    if module == "__main__":
        sys.exit(main())
    return main
