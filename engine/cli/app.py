"""The ``mq`` program: its parser (one module per command group) and ``main``.

::

    mq topic create|list|stats|update|delete     mq message view|query|trace
    mq group list|progress|reset                 mq dlq list|resend
    mq send | pull | lag | sql                   mq dispatch | broker | maintenance | status
    mq dashboard | serve

Every command takes ``--store PATH`` (default ``MQ_STORE``, else ``conf/engine.toml``, else
``./mqdata``), ``--storage-option KEY=VALUE`` (repeatable; delta-rs storage options of an
object-store root) and ``--json`` (exactly one JSON document on stdout). A bad argument, a missing Java
or any :class:`~engine.errors.MQError` is one line ``mq: error: ...`` on stderr and exit code 2,
never a traceback (``MQ_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from engine.cli import cmd_dashboard, cmd_dlq, cmd_group, cmd_jobs, cmd_message, cmd_serve, cmd_sql, cmd_topic
from engine.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, PROG, Output, Parser, console, one_line
from engine.config import STORAGE_OPTION_HELP, export_storage_options, is_secret_option
from engine.errors import MQError

Command = Callable[[argparse.Namespace, Output], int]
_GROUPS = (cmd_topic, cmd_group, cmd_message, cmd_dlq, cmd_sql, cmd_jobs, cmd_dashboard, cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    """The ``mq`` argument parser (exposed for documentation and tests)."""
    parser = Parser(prog=PROG, description="lakemq: a message store on Delta Lake tables.")
    parser.add_argument(
        "--store", default=None, help="store directory or URI (default: $MQ_STORE or ./mqdata)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser.add_argument(
        "--storage-option", action="append", default=None, metavar="KEY=VALUE", help=STORAGE_OPTION_HELP
    )
    # Subcommands accept both too; SUPPRESS keeps the top-level value when they do not repeat it.
    common = Parser(add_help=False)
    common.add_argument("--store", default=argparse.SUPPRESS, help="store directory or URI")
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document"
    )
    common.add_argument(
        "--storage-option",
        action="append",
        default=argparse.SUPPRESS,
        metavar="KEY=VALUE",
        help=STORAGE_OPTION_HELP,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for group in _GROUPS:
        group.register(commands, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``mq`` with ``argv``; returns the exit code.

    Without ``argv`` this is the ``mq`` program: it reads ``sys.argv[1:]`` and ends the process
    itself once output is flushed. Skipping interpreter finalization avoids an intermittent abort
    ("terminate called without an active exception", exit 134) when pyarrow scan threads over
    delta-rs's filesystem outlive the interpreter (delta-io/delta-rs#2184, apache/arrow#34314).
    Every table write has committed by then, so nothing is lost.
    """
    code = _run(argv)
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _run(argv: Sequence[str] | None) -> int:
    out, err = console(stderr=False), console(stderr=True)
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra and not hasattr(args, "job_args"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if hasattr(args, "job_args"):  # options handed to a job's own parser (mq broker, maintenance)
            args.job_args = extra
        for key in export_storage_options(args.storage_option):
            if is_secret_option(key):  # argv is world-readable (ps, /proc): say so, once, on stderr
                print(
                    f"{PROG}: warning: --storage-option {key} puts a secret on the command line, where "
                    f"ps shows it; set MQ_STORAGE_{key} or [storage] in engine.toml instead",
                    file=sys.stderr,
                )
        func: Command = args.func
        return func(args, Output(out, err, as_json=bool(args.json)))
    except SystemExit as exc:  # --help, or a job that exits
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_ERROR)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (MQError, OSError) as exc:
        if os.environ.get("MQ_DEBUG"):
            raise
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
