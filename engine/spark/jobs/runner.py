"""What every broker job shares as a program: its command line, opening the store, Spark, stopping.

Each job runs as ``python jobs/<job>.py`` or ``./spark-submit.sh jobs/<job>.py``::

    --store PATH        the store (default: MQ_STORE, else ./mqdata)
    --once              process what is committed now, then exit (Trigger.AvailableNow)
    --checkpoint PATH   the streaming checkpoint (default: under a local store; a local directory,
                        ~/.cache/lakemq/checkpoints/<store id>/<job>, for a store on object storage)
    --master URL        Spark's master (over conf/spark-defaults.conf's; run under spark-submit,
                        give spark-submit's --master instead)
    --storage-option K=V  delta-rs storage options (exported as MQ_STORAGE_<K>)

On a store on S3 the job's Spark reads the tables through S3A (``fs.s3a.*`` from the storage
options, unless ``spark.hadoop.fs.s3a.*`` gives Spark an identity of its own) and every write goes
through the engine in Python with the storage options (:mod:`engine.spark.object_store`).

plus the options its registry entry declares (:mod:`engine.spark.jobs.registry`). :func:`job_main`
is every job's ``main``: a bad argument or an unusable store is one line on stderr and exit code 2,
a failed run one line and exit code 1, never a traceback. How a job's query is wired is
:mod:`engine.spark.jobs.streams`.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from engine.config import STORAGE_OPTION_HELP, export_storage_options
from engine.errors import InvalidArgumentError, MQError
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
        "--checkpoint",
        default=None,
        help="streaming checkpoint location (default: under a local store; for a store on object "
        "storage a local directory, ~/.cache/lakemq/checkpoints/<store id>/<job>)",
    )
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master, e.g. spark://host:7077 (default: conf/spark-defaults.conf's; under "
        "spark-submit give its --master instead)",
    )
    parser.add_argument(
        "--storage-option", action="append", default=None, metavar="KEY=VALUE", help=STORAGE_OPTION_HELP
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

    export_storage_options(getattr(args, "storage_option", None))
    store = open_store(str(args.store))
    running = SparkContext._active_spark_context is not None
    master = getattr(args, "master", None)
    return JobContext(
        store,
        session(app_name=app_name, conf={"spark.master": master} if master else None, store=store),
        owns_spark=not running,
        began=time.monotonic() if began is None else began,
    )


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


_RAISED = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt): \S")


_MAX_CAUSES = 32  # a cause chain longer than this is a loop


def java_root_cause(error: BaseException) -> tuple[str, str] | None:
    """The Java exception at the bottom of ``error``'s cause chain, as (class name, message), when
    ``error`` came from the JVM: a py4j ``Py4JJavaError`` (its ``java_exception``) or a PySpark
    ``CapturedException`` made from one (its origin). None otherwise, or when the JVM can no longer
    be asked.

    Why the root: py4j's own message names only the call that failed ("An error occurred while
    calling o103.start."), and Spark's wrappers often only their stage; the root cause says what
    was wrong (a checkpoint path that is a file, a missing table).
    """
    throwable = getattr(error, "java_exception", None)
    if throwable is None:
        # PySpark keeps the Java exception it converted in a private attribute; there is no public one.
        throwable = getattr(error, "_origin", None)
    if throwable is None:
        return None
    try:
        for _ in range(_MAX_CAUSES):
            cause = throwable.getCause()
            if cause is None or cause.equals(throwable):
                break
            throwable = cause
        message = throwable.getMessage()
        return str(throwable.getClass().getName()), "" if message is None else str(message)
    except Exception:  # the gateway is gone (the JVM died): the Python side's message is all there is
        return None


def first_line(error: BaseException, limit: int | None = 500) -> str:
    """The line that says what went wrong (its type when the message is empty), at most ``limit``
    characters.

    For an error from the JVM that is its root cause's class and message's first line
    (``java.io.IOException: ...``; :func:`java_root_cause`). Otherwise the message's first line,
    except where it wraps a Python traceback (a ``foreachBatch`` function that raised reaches the
    driver as "An exception was raised by the Python Proxy. Return Message: Traceback ..."): then
    the traceback's last ``SomeError: why`` line.
    """
    root = java_root_cause(error)
    if root is not None:
        name, message = root
        if "Traceback (most recent call last)" in message:
            return first_line(RuntimeError(message), limit)  # a Python function failed under the JVM
        line = (message.strip().splitlines() or [""])[0].strip()
        return (f"{name}: {line}" if line else name)[:limit]
    text = str(error).strip()
    if not text:
        return type(error).__name__[:limit]
    lines = text.splitlines()
    start = text.find("Traceback (most recent call last)")
    if start >= 0:
        traceback: list[str] = []
        for line in text[start:].splitlines()[1:]:
            if line.startswith("\tat ") or line.startswith("JVM stacktrace"):
                break  # the Java side follows the Python traceback
            traceback.append(line.strip())
        raised = [line for line in traceback if _RAISED.match(line)]
        if raised:
            return raised[-1][:limit]
    return lines[0][:limit]


def fail(prog: str, error: BaseException, code: int = EXIT_USAGE) -> int:
    """Report an error as one line on stderr and return the exit code to use."""
    print(f"{prog}: error: {first_line(error, limit=None)}", file=sys.stderr)
    return code


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


@dataclass(frozen=True)
class Option:
    """One option of a job's command line, declared as argparse takes it.

    Its value goes to the job's ``run`` as the keyword ``keyword`` (default argparse's ``dest``:
    ``--trigger-ms`` -> ``trigger_ms``), after ``check(flag, value)`` accepted it before anything
    started.
    """

    flag: str
    help: str
    type: Callable[[str], Any] | None = None  # None: a flag (store_true)
    default: Any = None
    check: Callable[[str, Any], None] | None = None
    keyword: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.type is None:
            parser.add_argument(self.flag, action="store_true", help=self.help)
        else:
            parser.add_argument(self.flag, type=self.type, default=self.default, help=self.help)


def trigger_ms_option(
    default: int, what: str = "trigger interval of a running job", *, checked: bool = True
) -> Option:
    """A job's ``--trigger-ms`` (milliseconds; checked > 0 before the job starts unless not ``checked``)."""
    return Option(
        "--trigger-ms",
        f"{what} in milliseconds (default {default})",
        type=int,
        default=default,
        check=positive if checked else None,
    )


def positive(option: str, value: float) -> None:
    """Raise :class:`InvalidArgumentError` unless ``value`` > 0 (an :class:`Option` check)."""
    if not value > 0:
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        raise InvalidArgumentError(f"{option} must be > 0, got {shown}")


def not_negative(option: str, value: int | None) -> None:
    """Raise :class:`InvalidArgumentError` when ``value`` is given and < 0 (an :class:`Option` check)."""
    if value is not None and value < 0:
        raise InvalidArgumentError(f"{option} must be >= 0, got {value}")
