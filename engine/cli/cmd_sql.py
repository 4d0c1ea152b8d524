"""``mq sql``: Spark SQL over the store's views, queries only.

With Delta on Spark, a ``DELETE``, ``INSERT``, ``UPDATE``, ``MERGE`` or DDL statement would write the
tables behind the engine's back (dropping its commit markers and bypassing its sequencer), so the
statement is parsed first and anything but a query is refused before Spark runs it: Spark executes
commands eagerly, inside ``spark.sql`` itself.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from engine.cli import render
from engine.cli.common import EXIT_OK, Output, int_at_least, open_store, require_java
from engine.errors import CliError, MQError

# Logical-plan node classes that are not part of a query: every command (DELETE, UPDATE, MERGE, SET,
# CREATE, DROP, CACHE, ...) and every parsed statement (INSERT, ...).
_NOT_QUERY = (
    "org.apache.spark.sql.catalyst.plans.logical.Command",
    "org.apache.spark.sql.catalyst.plans.logical.ParsedStatement",
    "org.apache.spark.sql.catalyst.plans.logical.InsertIntoStatement",
)


def check_query(spark: Any, query: str) -> None:
    """Raise :class:`CliError` unless ``query`` parses, as one statement, to a query (no command,
    no write anywhere in its plan). What does not parse so (a syntax error, several statements, a
    ``BEGIN ... END`` script) never reaches ``spark.sql``, which would run a script's statements.

    Raises:
        CliError: the statement does not parse, is a command or writes.
    """
    from pyspark.errors.exceptions.captured import convert_exception

    jvm = spark.sparkContext._jvm
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(query)
    except Exception as exc:  # PySpark converts most JVM errors; a raw Py4JJavaError is converted here
        java = getattr(exc, "java_exception", None)
        error: BaseException = convert_exception(java) if java is not None else exc
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise CliError(f"SQL failed: {first}", query=query, cause=error) from None
    kinds = []
    for name in _NOT_QUERY:
        try:
            kinds.append(jvm.java.lang.Class.forName(name))
        except Exception:  # a class a Spark version does not have
            continue
    pending = [plan]
    while pending:
        node = pending.pop()
        if any(kind.isInstance(node) for kind in kinds):
            statement = node.getClass().getSimpleName()
            raise CliError(
                f"mq sql runs queries only (SELECT, WITH, VALUES, TABLE); this is a {statement}: writes "
                "go through the engine (Producer, Admin), never through Spark SQL",
                query=query,
                statement=statement,
            )
        children = node.children()
        pending.extend(children.apply(i) for i in range(children.size()))


def _sql(args: argparse.Namespace, out: Output) -> int:
    require_java()
    from pyspark import SparkContext
    from pyspark.errors import PySparkException
    from pyspark.logger import PySparkLogger

    from engine.spark import register_views, session
    from engine.spark.jobs.runner import first_line

    # PySpark logs a failed statement as a JSON record with the JVM stack; the one-line error is enough.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)
    store = open_store(args)
    owns = SparkContext._active_spark_context is None  # a notebook's or a test's session stays up
    spark: Any = None
    try:
        with out.progress("starting Spark and running the query"):
            master = {"spark.master": args.master} if args.master else None
            try:
                spark = session(app_name="mq-sql", conf=master, store=store)
            except MQError:
                raise
            except Exception as exc:  # the JVM did not start: one line that names why
                raise CliError(f"Spark did not start: {first_line(exc, limit=None)}", cause=exc) from exc
            check_query(spark, args.query)
            register_views(spark, store)
            try:
                frame = spark.sql(args.query)
                rows = frame.limit(args.limit + 1).collect()
            except PySparkException as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise CliError(f"SQL failed: {first}", query=args.query, cause=exc) from exc
        shown = rows[: args.limit]
        more = len(rows) > args.limit
        data = {
            "columns": list(frame.columns),
            "rows": [r.asDict(recursive=True) for r in shown],
            "more": more,
        }
        note = f"{len(shown)} row(s)" + (f"; more not shown (raise --limit {args.limit})" if more else "")
        out.emit(data, render.rows_table(list(frame.columns), [tuple(r) for r in shown]), note)
    finally:
        if owns and spark is not None:
            spark.stop()
    return EXIT_OK


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``sql`` to ``commands``."""
    sql = commands.add_parser("sql", parents=[common], help="run a Spark SQL query over the store's views")
    sql.add_argument("query", help='e.g. "SELECT topic, count(*) FROM messages GROUP BY topic"')
    sql.add_argument("--limit", type=int_at_least(1), default=100, help="most rows shown (default 100)")
    sql.add_argument(
        "--master",
        default=None,
        help="Spark master, e.g. spark://host:7077 (default: conf/spark-defaults.conf's, local[2])",
    )
    sql.set_defaults(func=_sql)
