"""What every broker job shares: its command line, opening the store, starting Spark, its query, stopping.

Each job is a plain module runnable as ``python jobs/<job>.py`` or ``spark-submit jobs/<job>.py``::

    --store PATH        the store (default: MQ_STORE, else ./mqdata)
    --once              process what is committed now, then exit (Trigger.AvailableNow)
    --checkpoint PATH   the streaming checkpoint (default: under the store)

A job module keeps only what is its own: the handler of a micro-batch (:func:`run_log_job` for jobs fed
by a table's log, :func:`start_query` for ticker-driven ones), its options and its summary line;
:func:`job_main` is the rest of its ``main``. A bad argument or an unusable store is one line on
stderr and exit code 2, a failed run one line and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import InvalidArgumentError, MQError
from engine.store.delta_log import VERSION_COLUMN
from engine.store.store import Store

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class JobArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (exit 2), without the usage block."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def argument_parser(job: str, description: str) -> JobArgumentParser:
    """A parser with the options every job takes; a job adds its own to it."""
    parser = JobArgumentParser(prog=f"jobs/{job}.py", description=description)
    parser.add_argument(
        "--store",
        default=os.environ.get("MQ_STORE") or "./mqdata",
        help="store directory or URI (default: $MQ_STORE or ./mqdata)",
    )
    parser.add_argument("--once", action="store_true", help="process every committed version, then exit")
    parser.add_argument(
        "--checkpoint", default=None, help="streaming checkpoint location (default: under the store)"
    )
    return parser


@dataclass(frozen=True)
class JobContext:
    """An opened store and the SparkSession a job runs in."""

    store: Store
    spark: Any
    owns_spark: bool = False
    began: float = field(default_factory=time.monotonic)  # before Spark started, for summaries

    def elapsed_s(self) -> float:
        """Seconds since the job began (its Spark start included)."""
        return time.monotonic() - self.began

    def close(self) -> None:
        """Stop Spark if this job started it (a job run inside a notebook leaves its session alone)."""
        if self.owns_spark:
            self.spark.stop()


def open_store(path: str) -> Store:
    """Open an existing store directory or URI for a job.

    Raises:
        MQError: the path is not a directory, or the store cannot be opened.
    """
    if "://" not in path or path.startswith("file://"):
        local = Path(path.removeprefix("file://"))
        if local.exists() and not local.is_dir():
            raise MQError(f"--store {path} is a file; a store is a directory or an object-store URI")
    return Store.open(path)


def start(args: argparse.Namespace, app_name: str, began: float | None = None) -> JobContext:
    """Open the store named by ``--store`` and the job's SparkSession."""
    from pyspark import SparkContext

    from engine.spark import session

    store = open_store(str(args.store))
    running = SparkContext._active_spark_context is not None
    return JobContext(
        store,
        session(app_name=app_name),
        owns_spark=not running,
        began=time.monotonic() if began is None else began,
    )


def checkpoint_location(store: Store, job: str, override: str | None = None) -> str:
    """A job's streaming checkpoint: ``override``, else ``<checkpoint_dir or store>/_checkpoints/<job>``.

    ``checkpoint_dir`` from the engine config replaces the ``<store>/_checkpoints`` parent.
    """
    if override:
        return override
    parent = store.config.checkpoint_dir or f"{store.root}/_checkpoints"
    return f"{parent.rstrip('/')}/{job}"


class StopSignal:
    """Turns SIGTERM / SIGINT into an event a job's loop checks (handlers only in the main thread).

    The handler only sets a flag: stopping the query from inside a signal handler could interrupt a
    py4j call half-way.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def first_line(error: BaseException, limit: int | None = 500) -> str:
    """The first line of an error's message (its type when it has none), at most ``limit`` characters."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:limit]


def fail(prog: str, error: BaseException, code: int = EXIT_USAGE) -> int:
    """Report an error as one line on stderr and return the exit code to use."""
    print(f"{prog}: error: {first_line(error, limit=None)}", file=sys.stderr)
    return code


# ----------------------------------------------------------------------------- the query
class BatchNotReadError(RuntimeError):
    """A micro-batch could not be read (the query was stopped, or the read failed)."""


def read_batch(batch: Any, batch_id: int) -> pa.Table:
    """A micro-batch's rows as Arrow.

    Raises:
        BatchNotReadError: the rows could not be read, typically because the query is being stopped
            mid-batch. Its message is one short line: Spark matches failure messages of Python
            callbacks with a regex that overflows the stack on long ones.
    """
    try:
        return batch.toArrow()
    except Exception as exc:
        raise BatchNotReadError(f"micro-batch {batch_id} was not read: {first_line(exc)}") from None


def query_name(store: Store, job: str) -> str:
    """The name a job's streaming query shows in the Spark UI and in progress reports."""
    return f"lakemq-{job.replace('_', '-')}-{store.store_id}"


def start_query(
    frame: Any,
    store: Store,
    job: str,
    on_batch: Callable[[Any, int], None],
    *,
    once: bool,
    checkpoint: str | None,
    trigger_ms: int,
) -> Any:
    """Start ``frame`` as the job's ``foreachBatch`` query with its checkpoint.

    Args:
        frame: the streaming DataFrame (a table's log, or a ticker).
        store: the store (names the query and the default checkpoint).
        job: the job's name (``dispatch``, ``schedule``, ...).
        on_batch: called once per micro-batch on the driver with ``(batch, batch_id)``.
        once: process what is available now (``Trigger.AvailableNow``) and wait for the query to
            finish; otherwise start it triggered every ``trigger_ms`` and return it running.
        checkpoint: the streaming checkpoint; default :func:`checkpoint_location`.
        trigger_ms: the processing-time trigger of a running query.

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only; a running
            query reports it through ``exception()`` / ``awaitTermination()``).
    """
    writer = (
        frame.writeStream.queryName(query_name(store, job))
        .foreachBatch(on_batch)
        .option("checkpointLocation", checkpoint_location(store, job, checkpoint))
    )
    if once:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return query
    return writer.trigger(processingTime=f"{trigger_ms} milliseconds").start()


def log_stream(
    spark: Any,
    store: Store,
    table: str,
    starting_version: int,
    columns: Sequence[str],
    schema: pa.Schema | None = None,
) -> Any:
    """A table's new rows (``columns`` and ``_version``) from ``starting_version`` on, streaming.

    ``schema`` (the Arrow schema of ``columns``) spares the source inferring it from the table.
    """
    from engine.spark.deltalog import SHORT_NAME, spark_schema

    reader = spark.readStream.format(SHORT_NAME)
    if schema is not None:
        reader = reader.schema(spark_schema(schema))
    reader = (
        reader.option("path", store.uri(table))
        .option("startingVersion", str(starting_version))
        .option("columns", ",".join(columns))
    )
    if store.storage_options:
        reader = reader.option("storageOptions", json.dumps(store.storage_options))
    return reader.load()


def with_missing_versions(rows: pa.Table, marker: int, read: Callable[[int, int], pa.Table]) -> pa.Table:
    """``rows`` preceded by the versions between a job's exactly-once ``marker`` and them.

    The stream's checkpoint and the job's marker normally agree. When the checkpoint is ahead (a
    checkpoint copied from elsewhere, a target table restored from a backup), the versions in between
    would otherwise never be offered again; ``read(first, last)`` reads them from the source table.
    """
    if rows.num_rows == 0:
        return rows
    first = int(pc.min(rows[VERSION_COLUMN]).as_py())
    if first <= marker + 1:
        return rows
    missing = read(marker + 1, first - 1)
    return pa.concat_tables([missing.select(rows.column_names).cast(rows.schema), rows])


def run_log_job(
    spark: Any,
    store: Store,
    *,
    job: str,
    table: str,
    columns: Sequence[str],
    handler: Callable[[pa.Table], None],
    marker: Callable[[], int],
    once: bool,
    checkpoint: str | None,
    trigger_ms: int,
    schema: pa.Schema | None = None,
    catch_up: Callable[[int, int], pa.Table] | None = None,
) -> Any:
    """Start a job fed by ``table``'s log: every micro-batch's rows go to ``handler``.

    The stream starts at the version after ``marker()`` (the job's exactly-once marker, committed with
    what the handler writes), so a lost or fresh checkpoint resumes where the job's output stops.

    Args:
        spark: a SparkSession with the project's data sources (:func:`engine.spark.session`).
        store: the store.
        job: the job's name (query name, default checkpoint ``<store>/_checkpoints/<job>``).
        table: the source table.
        columns: the source columns the handler needs; it also gets ``_version``.
        handler: called once per micro-batch on the driver with its rows (possibly none). It must be
            idempotent per source version, so that a replayed batch writes nothing twice, and must
            raise when it did not write: returning makes Spark commit the batch and never offer its
            versions again.
        marker: the last source version the job's output covers.
        once: process every version committed now and wait for the query to finish; otherwise
            start a query triggered every ``trigger_ms`` and return it running.
        checkpoint: the streaming checkpoint (default under the store).
        trigger_ms: the trigger interval of a running query.
        schema: the Arrow schema of ``columns`` (default: inferred by the source).
        catch_up: ``read(first, last)`` of the source's rows of versions ``first..last``: when given,
            a batch that starts past ``marker() + 1`` is preceded by the versions in between
            (:func:`with_missing_versions`).

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only).
    """

    def on_batch(batch: Any, batch_id: int) -> None:
        rows = read_batch(batch, batch_id)
        if catch_up is not None:
            rows = with_missing_versions(rows, marker(), catch_up)
        handler(rows)

    frame = log_stream(spark, store, table, marker() + 1, columns, schema).select(*columns, VERSION_COLUMN)
    return start_query(frame, store, job, on_batch, once=once, checkpoint=checkpoint, trigger_ms=trigger_ms)


def stop_query(query: Any, deadline: float) -> None:
    """Let a micro-batch in flight finish (until ``time.monotonic()`` reaches ``deadline``), then stop."""
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    if query.isActive:
        query.stop()


def serve(query: Any, stop: threading.Event, poll_s: float = 0.5, grace_s: float = 10.0) -> None:
    """Wait until ``stop`` is set or the query ends; then stop the query cleanly.

    On ``stop`` a micro-batch in flight gets ``grace_s`` to finish before the query is stopped; one
    cut short is replayed by the next run, which every job makes a no-op for what it already wrote.

    Raises:
        pyspark.errors.StreamingQueryException: the query failed (not because it was stopped).
    """
    try:
        while query.isActive and not stop.is_set():
            query.awaitTermination(poll_s)
    finally:
        stop_query(query, time.monotonic() + grace_s)
    if stop.is_set():
        return  # asked to stop: a batch interrupted by the stop is not a failure
    query.awaitTermination()


def run_or_serve(once: bool, run: Callable[[bool], Any]) -> Any:
    """``run(True)`` when ``once``; otherwise ``run(False)`` served until SIGTERM / SIGINT."""
    if once:
        return run(True)
    with StopSignal() as stop:
        query = run(False)
        serve(query, stop.event)
        return query


# ----------------------------------------------------------------------------- main
def job_main(
    job: str,
    description: str,
    argv: Sequence[str] | None,
    run: Callable[[JobContext, argparse.Namespace], int],
    *,
    options: Callable[[JobArgumentParser], None] | None = None,
    check: Callable[[argparse.Namespace], None] | None = None,
    needs_spark: Callable[[argparse.Namespace], bool] | None = None,
) -> int:
    """A job's ``main``: parse, check, open the store and Spark, ``run``, report, close.

    Args:
        job: the job's name (``jobs/<job>.py`` is the program name of its messages).
        description: the ``--help`` text.
        argv: the arguments (default ``sys.argv[1:]``).
        run: the job's work; returns the exit code.
        options: adds the job's own options to the parser.
        check: validates the parsed arguments before anything starts; raises on bad input.
        needs_spark: whether these arguments need a SparkSession (default yes); without one the
            context's ``spark`` is None.

    Returns:
        The exit code: ``run``'s; 2 for a bad argument, an unusable store, a Spark that does not
        start or an :class:`InvalidArgumentError`; 1 for any other failure. Errors are one line on
        stderr.
    """
    prog = f"jobs/{job}.py"
    parser = argument_parser(job, description)
    if options is not None:
        options(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (already reported on one line)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if check is not None:
            check(args)
    except Exception as exc:
        return fail(prog, exc, EXIT_USAGE)
    began = time.monotonic()
    try:
        if needs_spark is None or needs_spark(args):
            ctx = start(args, app_name=f"lakemq-{job.replace('_', '-')}", began=began)
        else:
            ctx = JobContext(open_store(str(args.store)), None, began=began)
    except Exception as exc:  # bad store path, no Java, bad conf: one line, not a traceback
        return fail(prog, exc, EXIT_USAGE)
    try:
        return run(ctx, args)
    except InvalidArgumentError as exc:
        return fail(prog, exc, EXIT_USAGE)
    except Exception as exc:
        return fail(prog, exc, EXIT_FAILED)
    finally:
        ctx.close()


def add_trigger_ms(
    parser: JobArgumentParser, default: int, what: str = "trigger interval of a running job"
) -> None:
    """Add a job's ``--trigger-ms`` option (milliseconds; the job checks it with :func:`positive`)."""
    help_text = f"{what} in milliseconds (default {default})"
    parser.add_argument("--trigger-ms", type=int, default=default, help=help_text)


def positive(option: str, value: float) -> None:
    """Raise :class:`InvalidArgumentError` unless ``value`` > 0 (a check of :func:`job_main`)."""
    if not value > 0:
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        raise InvalidArgumentError(f"{option} must be > 0, got {shown}")
