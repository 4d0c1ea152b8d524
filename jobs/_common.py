"""What every broker job shares: its command line, opening the store, starting Spark, stopping.

Each job is a plain module runnable as ``python jobs/<job>.py`` or ``spark-submit jobs/<job>.py``::

    --store PATH   the store (default: MQ_STORE, else ./mqdata)
    --once         process what is committed now, then exit (Trigger.AvailableNow)

A bad argument or an unusable store is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from engine.errors import MQError
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


def start(args: argparse.Namespace, app_name: str) -> JobContext:
    """Open the store named by ``--store`` and the job's SparkSession."""
    from pyspark import SparkContext

    from engine.spark import session

    store = open_store(str(args.store))
    running = SparkContext._active_spark_context is not None
    return JobContext(store, session(app_name=app_name), owns_spark=not running)


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


def fail(prog: str, error: BaseException, code: int = EXIT_USAGE) -> int:
    """Report an error as one line on stderr and return the exit code to use."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code
