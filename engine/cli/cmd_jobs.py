"""``mq dispatch``, ``mq broker``, ``mq maintenance`` and ``mq status``: the broker's jobs, run from
the command line (the same jobs as ``jobs/*.py``, declared once in :mod:`engine.spark.jobs`)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from engine.cli import render
from engine.cli.common import EXIT_OK, Output, open_store, require_java
from engine.errors import CliError
from engine.store.status import StoreStatus, store_status


def _run_job(
    out: Output, name: str, main: Callable[[Sequence[str]], int], argv: list[str], spinner: str
) -> int:
    """Run a job's ``main``; with ``--json`` its own report lines go to stderr and stdout gets one
    document with the exit code."""
    if out.as_json:
        with contextlib.redirect_stdout(sys.stderr):
            code = main(argv)
        out.emit({"job": name, "argv": argv, "exit_code": code})
        return code
    with out.progress(spinner):
        return main(argv)


def _dispatch(args: argparse.Namespace, out: Output) -> int:
    if args.no_spark and not args.once:
        raise CliError("--no-spark dispatches once; add --once")
    store = open_store(args)
    if args.no_spark:
        from engine.broker.dispatch import dispatch_pending

        with out.progress("dispatching without Spark"):
            added = dispatch_pending(store)
        out.emit({"dispatched": added, "spark": False}, f"dispatched {added} entries (without Spark)")
        return EXIT_OK
    require_java()
    from engine.spark.jobs.registry import job_named

    argv = ["--store", store.root]
    if args.checkpoint:
        argv += ["--checkpoint", args.checkpoint]
    if args.master:
        argv += ["--master", args.master]
    if args.once:
        return _run_job(
            out,
            "dispatch",
            job_named("dispatch").main,
            [*argv, "--once"],
            "running the dispatch job once (Spark)",
        )
    out.note(f"dispatch job running on {store.root}; Ctrl-C stops it")
    return _run_job(out, "dispatch", job_named("dispatch").main, argv, "dispatch job running")


def _passthrough(args: argparse.Namespace) -> list[str]:
    store = open_store(args)
    return ["--store", store.root, *args.job_args]


def _broker(args: argparse.Namespace, out: Output) -> int:
    require_java()
    from engine.spark.jobs.broker_app import main

    argv = _passthrough(args)
    if "--once" not in argv:
        out.note("broker running every job in one Spark app; Ctrl-C or SIGTERM stops it")
    return _run_job(out, "broker", main, argv, "running the broker jobs")


def _maintenance(args: argparse.Namespace, out: Output) -> int:
    from engine.spark.jobs.registry import job_named

    argv = _passthrough(args)
    if "--once" not in argv:
        require_java()
    return _run_job(out, "maintenance", job_named("maintenance").main, argv, "maintenance pass")


def _status(args: argparse.Namespace, out: Output) -> int:
    status = store_status(open_store(args))
    shown: list[Any] = []
    if status.jobs:
        shown.append(
            render.rows_table(StoreStatus.JOB_COLUMNS, status.job_rows(), title="jobs (last progress)")
        )
    else:
        shown.append("no job has reported progress yet (run jobs/broker.py or a job under jobs/)")
    shown.append(render.rows_table(StoreStatus.TABLE_COLUMNS, status.table_rows(), title="tables"))
    out.emit({"jobs": status.jobs, "tables": status.tables}, *shown)
    return EXIT_OK


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``dispatch``, ``broker``, ``maintenance`` and ``status`` to ``commands``."""
    dispatch = commands.add_parser("dispatch", parents=[common], help="run the dispatch job")
    dispatch.add_argument("--once", action="store_true", help="dispatch what is committed, then exit")
    dispatch.add_argument(
        "--checkpoint",
        default=None,
        help="streaming checkpoint location (default: under a local store; a local directory for a "
        "store on object storage)",
    )
    dispatch.add_argument("--master", default=None, help="Spark master, e.g. spark://host:7077")
    dispatch.add_argument("--no-spark", action="store_true", help="dispatch in this process, without Spark")
    dispatch.set_defaults(func=_dispatch)

    broker = commands.add_parser(
        "broker",
        parents=[common],
        help="every broker job in one Spark app (options as jobs/broker.py: --once, --jobs, --skip, ...)",
    )
    broker.set_defaults(func=_broker, job_args=[])

    maintenance = commands.add_parser(
        "maintenance",
        parents=[common],
        help="compaction, retention, checkpoints, vacuum (options of jobs/maintenance.py; --once: no Spark)",
    )
    maintenance.set_defaults(func=_maintenance, job_args=[])

    status = commands.add_parser("status", parents=[common], help="jobs' last progress and table sizes")
    status.set_defaults(func=_status)
