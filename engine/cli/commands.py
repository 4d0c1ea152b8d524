"""The ``mq`` commands: their parser, what each does, and ``main``.

::

    mq topic create NAME [--queues N]      mq send TOPIC BODY [--tags T] [--keys K ...] ...
    mq topic list                          mq pull TOPIC --queue-id N --offset N [--expression E] ...
    mq topic stats NAME                    mq sql "SELECT ..."
                                           mq dispatch [--once] [--no-spark]

Every subcommand takes ``--store PATH`` (default ``MQ_STORE``, else ``conf/engine.toml``, else
``./mqdata``). A bad argument, a missing Java or any :class:`~engine.errors.MQError` is one line
``mq: error: ...`` on stderr and exit code 2, never a traceback (``MQ_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from rich.console import Console

from engine.cli import render
from engine.client.admin import Admin
from engine.client.producer import Producer
from engine.client.pull import PullConsumer
from engine.config import load_config
from engine.errors import CliError, InvalidArgumentError, MQError
from engine.model import Message, PullStatus
from engine.store.store import Store

PROG = "mq"
EXIT_OK = 0
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
CLI_PRODUCER_GROUP = "mq-cli"
CLI_CONSUMER_GROUP = "mq-cli"
JAVA_MESSAGE = "lakemq needs Java 17: install it (e.g. apt-get install -y openjdk-17-jre-headless)"
MIN_JAVA = 17


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors are one line."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')")


# ----------------------------------------------------------------------------- helpers
def _java_major() -> int | None:
    """Major version of the Java runtime Spark would use (JAVA_HOME, else PATH), or None."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else None
    if java is None or not os.path.exists(java):
        java = shutil.which("java")
    if java is None:
        return None
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_292" is Java 8
        major = int(match.group(2))
    return major


def require_java() -> None:
    """Raises :class:`CliError` unless a Java 17+ runtime is available for Spark."""
    major = _java_major()
    if major is None or major < MIN_JAVA:
        raise CliError(JAVA_MESSAGE, java_version=major)


def _open_store(args: argparse.Namespace) -> Store:
    config = load_config(store=args.store)
    return Store.open(config=config)


def _parse_properties(items: Sequence[str] | None) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(f"--property {item!r} must look like key=value", property=item)
        props[key] = value
    return props


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


@contextmanager
def _progress(err: Console, message: str) -> Iterator[None]:
    """A spinner on stderr while something slow runs (nothing when stderr is not a terminal)."""
    if err.is_terminal:
        with err.status(message, spinner="dots"):
            yield
    else:
        yield


# ----------------------------------------------------------------------------- commands
Command = Callable[[argparse.Namespace, Console, Console], int]


def _topic_create(args: argparse.Namespace, out: Console, err: Console) -> int:
    config = Admin(_open_store(args)).create_topic(args.name, args.queues, type=args.type)
    out.print(f"topic [bold]{config.name}[/bold]: {config.queues} queue(s), type {config.type}")
    return EXIT_OK


def _topic_list(args: argparse.Namespace, out: Console, err: Console) -> int:
    out.print(render.topics_table(Admin(_open_store(args)).topics(include_system=args.all)))
    return EXIT_OK


def _topic_stats(args: argparse.Namespace, out: Console, err: Console) -> int:
    out.print(render.stats_table(args.name, Admin(_open_store(args)).topic_stats(args.name)))
    return EXIT_OK


def _send(args: argparse.Namespace, out: Console, err: Console) -> int:
    body = sys.stdin.buffer.read() if args.body == "-" else args.body.encode("utf-8")
    message = Message(
        args.topic,
        body,
        tags=args.tags,
        keys=tuple(args.keys or ()),
        properties=_parse_properties(args.property),
    )
    with Producer(_open_store(args), CLI_PRODUCER_GROUP) as producer:
        result = producer.send(
            message, queue_id=args.queue_id, sharding_key=args.sharding_key, delay_level=args.delay_level
        )
    out.print(render.send_table(result))
    return EXIT_OK


def _pull(args: argparse.Namespace, out: Console, err: Console) -> int:
    consumer = PullConsumer(_open_store(args), args.group)
    waiting = f"waiting up to {args.suspend_ms} ms for messages on {args.topic}:{args.queue_id}"
    with _progress(err, waiting if args.suspend_ms else "pulling"):
        result = consumer.pull(
            args.topic, args.queue_id, args.offset, args.max, args.expression, suspend_ms=args.suspend_ms
        )
    out.print(render.pull_summary(result))
    if result.messages:
        out.print(render.messages_table(result.messages))
    if args.commit and result.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
        consumer.commit_offset(args.topic, args.queue_id, result.next_begin_offset)
        out.print(f"committed offset {result.next_begin_offset} for group {args.group}")
    return EXIT_OK


def _lag(args: argparse.Namespace, out: Console, err: Console) -> int:
    import dataclasses

    from engine.client.admin_offsets import QueueLag

    rows = Admin(_open_store(args)).consumer_lag(args.group)
    if not rows:
        out.print("no committed offsets" + (f" for group {args.group}" if args.group else ""))
        return EXIT_OK
    columns = [f.name for f in dataclasses.fields(QueueLag)]
    table = [tuple(getattr(r, c) for c in columns) for r in rows]
    out.print(render.rows_table(columns, table, title=f"lag: {sum(r.lag for r in rows)} message(s) behind"))
    return EXIT_OK


def _sql(args: argparse.Namespace, out: Console, err: Console) -> int:
    require_java()
    from pyspark import SparkContext
    from pyspark.errors import PySparkException
    from pyspark.logger import PySparkLogger

    from engine.spark import register_views, session

    # PySpark logs a failed statement as a JSON record with the JVM stack; the one-line error is enough.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)
    store = _open_store(args)
    owns = SparkContext._active_spark_context is None  # a notebook's or a test's session stays up
    spark: Any = None
    try:
        with _progress(err, "starting Spark and running the query"):
            spark = session(app_name="mq-sql")
            register_views(spark, store)
            try:
                frame = spark.sql(args.query)
                rows = frame.limit(args.limit + 1).collect()
            except PySparkException as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise CliError(f"SQL failed: {first}", query=args.query, cause=exc) from exc
        shown = rows[: args.limit]
        out.print(render.rows_table(list(frame.columns), [tuple(r) for r in shown]))
        more = f"; more not shown (raise --limit {args.limit})" if len(rows) > args.limit else ""
        out.print(f"{len(shown)} row(s){more}")
    finally:
        if owns and spark is not None:
            spark.stop()
    return EXIT_OK


def _dispatch(args: argparse.Namespace, out: Console, err: Console) -> int:
    store = _open_store(args)
    if args.no_spark:
        from engine.broker.dispatch import dispatch_pending

        with _progress(err, "dispatching without Spark"):
            added = dispatch_pending(store)
        out.print(f"dispatched {added} entries (without Spark)")
        return EXIT_OK
    require_java()
    from engine.spark.jobs.registry import job_named

    dispatch = job_named("dispatch")
    argv = ["--store", store.root]
    if args.checkpoint:
        argv += ["--checkpoint", args.checkpoint]
    if args.once:
        with _progress(err, "running the dispatch job once (Spark)"):
            return dispatch.main([*argv, "--once"])
    err.print(f"dispatch job running on {store.root}; Ctrl-C stops it")
    return dispatch.main(argv)


def _status(args: argparse.Namespace, out: Console, err: Console) -> int:
    from engine.spark.progress import StoreStatus, store_status

    status = store_status(_open_store(args))
    if status.jobs:
        out.print(render.rows_table(StoreStatus.JOB_COLUMNS, status.job_rows(), title="jobs (last progress)"))
    else:
        out.print("no job has reported progress yet (run jobs/broker.py or a job under jobs/)")
    out.print(render.rows_table(StoreStatus.TABLE_COLUMNS, status.table_rows(), title="tables"))
    return EXIT_OK


# ----------------------------------------------------------------------------- parser
def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    parse.__name__ = "int"
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``mq`` argument parser (exposed for documentation and tests)."""
    parser = _Parser(prog=PROG, description="lakemq: a message store on Delta Lake tables.")
    parser.add_argument(
        "--store", default=None, help="store directory or URI (default: $MQ_STORE or ./mqdata)"
    )
    # Subcommands accept --store too; SUPPRESS keeps a top-level --store when they do not repeat it.
    common = _Parser(add_help=False)
    common.add_argument("--store", default=argparse.SUPPRESS, help="store directory or URI")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    topic = commands.add_parser("topic", help="create, list and inspect topics")
    topics = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION", parser_class=_Parser)
    create = topics.add_parser("create", parents=[common], help="create a topic (idempotent)")
    create.add_argument("name")
    create.add_argument("--queues", type=_int_at_least(1), default=None, help="queues (default 4)")
    create.add_argument("--type", default="NORMAL", choices=["NORMAL", "FIFO", "DELAY", "TRANSACTION"])
    create.set_defaults(func=_topic_create)
    listing = topics.add_parser("list", parents=[common], help="list topics")
    listing.add_argument("--all", action="store_true", help="include system topics (retry, DLQ, schedule)")
    listing.set_defaults(func=_topic_list)
    stats = topics.add_parser("stats", parents=[common], help="per-queue offsets of a topic")
    stats.add_argument("name")
    stats.set_defaults(func=_topic_stats)

    send = commands.add_parser("send", parents=[common], help="send one message")
    send.add_argument("topic")
    send.add_argument("body", help="message body (UTF-8); '-' reads it from stdin")
    send.add_argument("--tags", default=None, help="the message's tag")
    send.add_argument("--keys", nargs="+", action="extend", default=None, metavar="K", help="business keys")
    send.add_argument("--queue-id", type=_int_at_least(0), default=None, help="an explicit queue")
    send.add_argument("--sharding-key", default=None, help="choose the queue by hash of this key")
    send.add_argument("--property", nargs="+", action="extend", default=None, metavar="K=V")
    send.add_argument("--delay-level", type=_int_at_least(0), default=0, help="1..18 (RocketMQ delay levels)")
    send.set_defaults(func=_send)

    pull = commands.add_parser("pull", parents=[common], help="pull messages from one queue")
    pull.add_argument("topic")
    pull.add_argument("--queue-id", type=_int_at_least(0), required=True)
    pull.add_argument("--offset", type=int, required=True)
    pull.add_argument("--max", type=_int_at_least(1), default=32, help="most messages (default 32)")
    pull.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB' (default *)")
    pull.add_argument("--suspend-ms", type=_int_at_least(0), default=0, help="long polling: wait this long")
    pull.add_argument(
        "--group", default=CLI_CONSUMER_GROUP, help=f"consumer group (default {CLI_CONSUMER_GROUP})"
    )
    pull.add_argument("--commit", action="store_true", help="commit the next offset for --group")
    pull.set_defaults(func=_pull)

    lag = commands.add_parser("lag", parents=[common], help="how far consumer groups are behind, per queue")
    lag.add_argument("--group", default=None, help="only this consumer group")
    lag.set_defaults(func=_lag)

    sql = commands.add_parser("sql", parents=[common], help="run Spark SQL over the store's views")
    sql.add_argument("query", help='e.g. "SELECT topic, count(*) FROM messages GROUP BY topic"')
    sql.add_argument("--limit", type=_int_at_least(1), default=100, help="most rows shown (default 100)")
    sql.set_defaults(func=_sql)

    dispatch = commands.add_parser("dispatch", parents=[common], help="run the dispatch job")
    dispatch.add_argument("--once", action="store_true", help="dispatch what is committed, then exit")
    dispatch.add_argument("--checkpoint", default=None, help="streaming checkpoint location")
    dispatch.add_argument("--no-spark", action="store_true", help="dispatch in this process, without Spark")
    dispatch.set_defaults(func=_dispatch)

    status = commands.add_parser("status", parents=[common], help="jobs' last progress and table sizes")
    status.set_defaults(func=_status)
    return parser


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Tables piped or captured would otherwise be cut at 80 columns.
    wide = None if stream.isatty() or "COLUMNS" in os.environ else 160
    return Console(file=stream, width=wide, stderr=stderr)


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
    out, err = _console(stderr=False), _console(stderr=True)
    try:
        args = build_parser().parse_args(argv)
        if args.command == "dispatch" and args.no_spark and not args.once:
            raise CliError("--no-spark dispatches once; add --once")
        func: Command = args.func
        return func(args, out, err)
    except SystemExit as exc:  # --help, or a job that exits
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_ERROR)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (MQError, OSError) as exc:
        if os.environ.get("MQ_DEBUG"):
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
