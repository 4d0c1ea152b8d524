"""The broker app: every broker job as its own streaming query in ONE Spark application.

The jobs are those of :data:`engine.spark.jobs.registry.JOBS`. Each keeps its own checkpoint
(``<--checkpoint>/<job>``, else :func:`engine.spark.jobs.streams.checkpoint_location`: under a local
store, in a local directory for a store on object storage) and its own exactly-once
marker, so a job run here and the same job run alone (``jobs/<job>.py``) continue each other.

- ``--once``: runs the jobs one after another in the order of the broker's pass plan
  (:data:`engine.broker.plan.PLAN`, the one ``mq serve``'s in-process loop follows too): dispatch,
  index, schedule, retry, then dispatch and index again so that re-put messages (delays now due,
  retries) are pullable and indexed, then pull_log, transaction_check and maintenance; then exits.
- otherwise: starts every query and runs until SIGTERM / SIGINT, then stops every query (a batch in
  flight gets a grace period) and exits 0. A query that fails is restarted from its checkpoint
  after a backoff; a job that fails more than ``--max-restarts`` times in 10 minutes stops the
  others and exits 1.

Progress is logged (rows/s, batch duration, end-to-end delay) and written to
``<store>/_status/<job>.json`` (:mod:`engine.spark.progress`, :mod:`engine.store.status`); ``mq status``
shows it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.broker.plan import PLAN
from engine.errors import InvalidArgumentError
from engine.spark.jobs.registry import JOB_ORDER, Job, job_named
from engine.spark.jobs.runner import (
    EXIT_FAILED,
    EXIT_OK,
    JobArgumentParser,
    JobContext,
    StopSignal,
    first_line,
    job_main,
    stop_query,
)
from engine.spark.jobs.supervision import DEFAULT_MAX_RESTARTS, RestartPolicy, is_listing_race
from engine.spark.progress import ProgressMonitor, query_status
from engine.store.status import FAILED, FINISHED, RUNNING, STOPPED, JobStatus, write_status
from engine.store.store import Store, now_ms

JOB = "broker"
# One pass of --once: the registered job of each step of the broker's plan, in its order.
ONCE_PLAN: tuple[str, ...] = tuple(step.job for step in PLAN)
GRACE_S = 10.0

LOGGER = logging.getLogger("lakemq.broker")


@dataclass
class BrokerRun:
    """What a broker run did."""

    ran: list[str] = field(default_factory=list)  # jobs run (--once: each step, in order)
    failed: dict[str, str] = field(default_factory=dict)
    restarted: dict[str, int] = field(default_factory=dict)  # job -> restarts of its failed query
    statuses: dict[str, JobStatus] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self, elapsed_s: float) -> str:
        """The one line a run ends with."""
        jobs = list(dict.fromkeys(self.ran))
        text = f"broker: ran {', '.join(jobs) or 'nothing'} ({elapsed_s:.1f}s)"
        if self.restarted:
            text += "; restarted " + ", ".join(f"{k} {v}x" for k, v in self.restarted.items())
        if self.failed:
            text += "; FAILED " + ", ".join(f"{k} ({v})" for k, v in self.failed.items())
        return text


def _first_line(error: BaseException) -> str:
    return first_line(error, limit=300)


def _checkpoint(parent: str | None, job: str) -> str | None:
    return None if parent is None else f"{parent.rstrip('/')}/{job}"


def selected_jobs(jobs: Sequence[str] | None = None, skip: Iterable[str] = ()) -> dict[str, Job]:
    """The registry's jobs named by ``jobs`` (default all) less ``skip``, by name, in run order.

    Raises:
        InvalidArgumentError: a name that is no job's.
    """
    unknown = [j for j in [*(jobs or ()), *skip] if j not in JOB_ORDER]
    if unknown:
        raise InvalidArgumentError(f"unknown jobs {unknown}; jobs: {', '.join(JOB_ORDER)}")
    wanted, left_out = set(jobs or JOB_ORDER), set(skip)
    return {name: job_named(name) for name in JOB_ORDER if name in wanted and name not in left_out}


def _broker_status(store: Store, run: BrokerRun, state: str) -> None:
    jobs = ", ".join(dict.fromkeys(run.ran)) or "none"
    detail = f"jobs: {jobs}"
    if run.failed:
        detail += f"; failed: {', '.join(run.failed)}"
    write_status(store, JobStatus(JOB, state, now_ms(), detail=detail))


def run_once(
    spark: Any,
    store: Store,
    *,
    jobs: Sequence[str] | None = None,
    skip: Iterable[str] = (),
    checkpoint: str | None = None,
    log: Callable[[str], None] | None = None,
) -> BrokerRun:
    """One pass of every available job in :data:`ONCE_PLAN` order, each to completion.

    A failing job is recorded and the pass goes on (later jobs do not need its output to be safe:
    every job is exactly once on its own markers).
    """
    emit = log or LOGGER.info
    found = selected_jobs(jobs, skip)
    run = BrokerRun()
    totals: dict[str, tuple[int, int]] = {}
    for name in ONCE_PLAN:
        job = found.get(name)
        if job is None:
            continue
        began = time.monotonic()
        try:
            result = job.run(
                spark, store, once=True, checkpoint=_checkpoint(checkpoint, name), **job.plan_keywords
            )
        except Exception as exc:
            run.failed[name] = _first_line(exc)
            status = JobStatus(name, FAILED, now_ms(), detail=run.failed[name])
        else:
            if hasattr(result, "lastProgress"):
                status = query_status(
                    name, result, state=FINISHED, store=store, source_table=job.source_table
                )
                rows, batches = totals.get(name, (0, 0))
                totals[name] = (rows + status.total_input_rows, batches + status.batches)
                status = replace(status, total_input_rows=totals[name][0], batches=totals[name][1])
            else:  # a job whose --once is a plain pass (maintenance): its report is the detail
                report = getattr(result, "summary", None)
                detail = report() if callable(report) else (str(result) if result is not None else None)
                if detail is not None:
                    detail = detail.removeprefix(f"{name}: ")  # the status line names the job already
                status = JobStatus(name, FINISHED, now_ms(), detail=detail)
        run.ran.append(name)
        run.statuses[name] = status
        write_status(store, status)
        emit(f"{status.line()} ({time.monotonic() - began:.1f}s)")
    _broker_status(store, run, FAILED if run.failed else FINISHED)
    return run


def _stop_all(queries: dict[str, Any], grace_s: float) -> None:
    """Let batches in flight finish (up to ``grace_s``), then stop every query."""
    deadline = time.monotonic() + grace_s
    for query in queries.values():
        try:
            stop_query(query, deadline)
        except Exception as exc:  # stopping the others matters more
            LOGGER.warning("stopping %s: %s", query.name, exc)


def _schedule_restart(policy: RestartPolicy, due: dict[str, float], name: str, why: str) -> bool:
    """Record a failure of job ``name``; schedule its restart in ``due`` (job -> monotonic time) and
    return True, or return False when the policy gives up on it."""
    wait_s = policy.failed(name, time.monotonic(), why)
    if wait_s is None:
        return False
    if is_listing_race(why):
        count, allowed, kind = policy.listing_races(name), policy.max_listing_races, "listing race"
    else:
        count, allowed, kind = policy.restarts(name), policy.max_restarts, "failure"
    LOGGER.warning(
        "%s: failed (%s); restarting from its checkpoint in %.0f s (%s %d of %d allowed within %.0f s)",
        *(name, why, wait_s, kind, count, allowed, policy.window_s),
    )
    due[name] = time.monotonic() + wait_s
    return True


def run_forever(
    spark: Any,
    store: Store,
    stop: threading.Event,
    *,
    jobs: Sequence[str] | None = None,
    skip: Iterable[str] = (),
    checkpoint: str | None = None,
    monitor_interval_s: float = 1.0,
    heartbeat_s: float = 30.0,
    grace_s: float = GRACE_S,
    log: Callable[[str], None] | None = None,
    started: Callable[[dict[str, Any]], None] | None = None,
    restarts: RestartPolicy | None = None,
) -> BrokerRun:
    """Start every available job's query and serve until ``stop`` is set or a job fails for good.

    A query that fails is restarted from its checkpoint after a backoff (its sink is idempotent per
    batch, so it resumes exactly where it stopped); a job that fails more often than ``restarts``
    allows stops the broker (see :mod:`engine.spark.jobs.supervision`).

    Args:
        spark: the SparkSession every query runs in.
        store: the store.
        stop: set it to stop every query (the signal handlers of :func:`main` do).
        jobs: run only these jobs (default all of :data:`JOB_ORDER`).
        skip: leave these jobs out.
        checkpoint: parent of the jobs' checkpoints (default: each job's, under the store).
        monitor_interval_s, heartbeat_s: see :class:`ProgressMonitor`.
        grace_s: time a batch in flight gets to finish when stopping.
        log: where progress lines go (default the ``lakemq.broker`` logger).
        started: called with job -> query once every query runs (tests, embedding apps).
        restarts: when to restart a failed query (default :class:`RestartPolicy`'s defaults;
            ``RestartPolicy(max_restarts=0)`` stops at the first failure).

    Returns:
        The run; ``failed`` names a job that failed for good (the others were stopped);
        ``restarted`` counts the restarts of each job.
    """
    found = selected_jobs(jobs, skip)
    run = BrokerRun()
    policy = restarts if restarts is not None else RestartPolicy()
    due: dict[str, float] = {}  # job -> monotonic time of its restart
    monitor = ProgressMonitor(store, interval_s=monitor_interval_s, heartbeat_s=heartbeat_s, log=log)
    queries: dict[str, Any] = {}
    try:
        for name, job in found.items():
            try:
                query = job.run(spark, store, once=False, checkpoint=_checkpoint(checkpoint, name))
            except Exception as exc:
                run.failed[name] = f"did not start: {_first_line(exc)}"
                raise
            queries[name] = query
            monitor.watch(name, query, job.source_table)
            run.ran.append(name)
        _broker_status(store, run, RUNNING)
        monitor.start()
        if started is not None:
            started(dict(queries))
        while not stop.is_set():
            for name in [n for n, q in queries.items() if n not in due and not q.isActive]:
                error = queries[name].exception()
                why = _first_line(error) if error is not None else "query ended on its own"
                if not _schedule_restart(policy, due, name, why):
                    run.failed[name] = why
                    break
            for name in [n for n, at in due.items() if at <= time.monotonic() and not run.failed]:
                # (a job given up on in the loop above ends the run: none is restarted then)
                job = found[name]
                try:
                    query = job.run(spark, store, once=False, checkpoint=_checkpoint(checkpoint, name))
                except Exception as exc:  # counts as one more failure of the job
                    why = f"did not restart: {_first_line(exc)}"
                    if not _schedule_restart(policy, due, name, why):
                        run.failed[name] = why
                        break
                    continue
                del due[name]
                queries[name] = query
                monitor.watch(name, query, job.source_table)
                run.restarted[name] = run.restarted.get(name, 0) + 1
            if run.failed:
                break
            stop.wait(0.5)
    except Exception as exc:  # a query that would not start: stop the ones that did
        if not run.failed:
            run.failed[JOB] = _first_line(exc)
    finally:
        _stop_all(queries, grace_s)
        monitor.stop()
        for name in queries:
            state = FAILED if name in run.failed else STOPPED
            run.statuses[name] = monitor.finish(name, state, run.failed.get(name))
        _broker_status(store, run, FAILED if run.failed else STOPPED)
    return run


def _arguments(parser: JobArgumentParser) -> None:
    parser.add_argument(
        "--jobs", default=None, help=f"comma-separated jobs to run (default all: {','.join(JOB_ORDER)})"
    )
    parser.add_argument("--skip", default="", help="comma-separated jobs to leave out")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        help="restarts of a failed job's query within 10 minutes before the broker stops (0: stop at once)",
    )
    parser.add_argument(
        "--heartbeat", type=float, default=30.0, help="seconds between progress lines of idle jobs"
    )


def _names(text: str | None) -> list[str] | None:
    return [j.strip() for j in text.split(",") if j.strip()] if text else None


def _check(args: Any) -> None:
    # Unknown names are bad input, reported before Spark starts.
    selected_jobs(_names(args.jobs), _names(args.skip) or [])
    RestartPolicy(max_restarts=args.max_restarts)
    if not LOGGER.handlers:  # progress lines on stderr; other loggers (py4j) keep their levels
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        LOGGER.addHandler(handler)
        LOGGER.propagate = False
    LOGGER.setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the broker app; returns the exit code (0 ok / stopped on a signal, 1 a job failed, 2 bad input)."""

    def run(ctx: JobContext, args: Any) -> int:
        jobs, skip = _names(args.jobs), _names(args.skip) or []
        if args.once:
            result = run_once(ctx.spark, ctx.store, jobs=jobs, skip=skip, checkpoint=args.checkpoint)
        else:
            with StopSignal() as stop:
                result = run_forever(
                    ctx.spark,
                    ctx.store,
                    stop.event,
                    jobs=jobs,
                    skip=skip,
                    checkpoint=args.checkpoint,
                    heartbeat_s=args.heartbeat,
                    restarts=RestartPolicy(max_restarts=args.max_restarts),
                )
        print(result.summary(ctx.elapsed_s()), flush=True)
        return EXIT_OK if result.ok else EXIT_FAILED

    return job_main(
        JOB,
        "Run every broker job (dispatch, index, schedule, ...) in one Spark app.",
        argv,
        run,
        options=_arguments,
        check=_check,
    )
