"""The index job: commit_log -> index, as a Spark structured-streaming query.

The source is the commit log read through the ``deltalog`` data source from the first version not
yet indexed; each micro-batch goes to :func:`engine.broker.index.build_index`, which commits the
index rows (one per message key and one per uniq key) together with a Delta app transaction
recording the last commit-log version covered (app id ``mq.index``). A replayed micro-batch (a
restart after a crash, a lost checkpoint, a second indexer) therefore adds nothing: exactly once,
whatever the checkpoint says. ``Admin.query_by_key`` / ``query_by_uniq_key`` read what it builds.

Usage::

    python jobs/index.py --store ./mqdata --once     # index what is committed, then exit
    ./spark-submit.sh jobs/index.py --store ./mqdata  # run until SIGTERM / Ctrl-C
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.broker.index import (
    INDEX_SOURCE_COLUMNS,
    INDEX_SOURCE_SCHEMA,
    build_index,
    indexed_version,
    unindexed_rows,
)
from engine.spark.deltalog import SHORT_NAME, spark_schema
from engine.store import schemas
from engine.store.log import VERSION_COLUMN
from engine.store.store import Store
from jobs._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    JobContext,
    StopSignal,
    argument_parser,
    checkpoint_location,
    fail,
    start,
)
from jobs.dispatch import BatchNotReadError, serve

JOB = "index"
PROG = "jobs/index.py"
DEFAULT_TRIGGER_MS = 1000


@dataclass
class IndexStats:
    """Progress of one run of the job (updated on the driver, once per micro-batch)."""

    batches: int = 0
    rows: int = 0
    entries: int = 0
    max_store_ts_ms: int | None = None  # newest message indexed by this run
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, rows: int, entries: int, max_store_ts_ms: int | None) -> None:
        with self._lock:
            self.batches += 1
            self.rows += rows
            self.entries += entries
            if max_store_ts_ms is not None:
                self.max_store_ts_ms = max(self.max_store_ts_ms or 0, max_store_ts_ms)


def commit_log_stream(spark: Any, store: Store, starting_version: int) -> Any:
    """The commit log's new rows (the indexer's columns) from ``starting_version`` on, streaming."""
    reader = (
        spark.readStream.format(SHORT_NAME)
        .schema(spark_schema(INDEX_SOURCE_SCHEMA))
        .option("path", store.uri(schemas.COMMIT_LOG))
        .option("startingVersion", str(starting_version))
        .option("columns", ",".join(INDEX_SOURCE_COLUMNS))
    )
    if store.storage_options:
        reader = reader.option("storageOptions", json.dumps(store.storage_options))
    return reader.load()


def with_unindexed_versions(store: Store, rows: pa.Table) -> pa.Table:
    """``rows`` preceded by the commit-log versions between the index's marker and them.

    The stream's checkpoint and the index's marker normally agree; when the checkpoint is ahead (a
    checkpoint copied from elsewhere, an index restored from a backup) the versions in between
    would otherwise never be indexed.
    """
    if rows.num_rows == 0:
        return rows
    first = int(pc.min(rows[VERSION_COLUMN]).as_py())
    marker = indexed_version(store)
    if first <= marker + 1:
        return rows
    missing = unindexed_rows(store, marker + 1, first - 1)
    return pa.concat_tables([missing.select(rows.column_names).cast(rows.schema), rows])


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:500]


def run_index(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    stats: IndexStats | None = None,
    trigger_ms: int = DEFAULT_TRIGGER_MS,
) -> Any:
    """Start the index query on ``spark`` for ``store``.

    Args:
        spark: a SparkSession with the project's data sources (:func:`engine.spark.session`).
        store: the store to index.
        once: index every version committed now and wait for the query to finish
            (``Trigger.AvailableNow``); otherwise start a query triggered every ``trigger_ms`` and
            return it running.
        checkpoint: the streaming checkpoint; default ``<store>/_checkpoints/index``.
        stats: counters to update after each micro-batch.
        trigger_ms: the processing-time trigger of a running query.

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only; a running
            query reports it through ``exception()`` / ``awaitTermination()``).
    """
    counters = stats if stats is not None else IndexStats()

    def index_batch(batch: Any, batch_id: int) -> None:
        # Called once per micro-batch on the driver; must be idempotent per batch: build_index is, per
        # commit-log version, so a replay of batch_id adds nothing. Must raise when it did not index:
        # returning makes Spark commit the batch and never offer those versions again.
        try:
            rows = batch.toArrow()
        except Exception as exc:
            raise BatchNotReadError(f"micro-batch {batch_id} was not read: {_first_line(exc)}") from None
        rows = with_unindexed_versions(store, rows)
        entries = build_index(store, rows) if rows.num_rows else 0
        newest = pc.max(rows["store_ts_ms"]).as_py() if rows.num_rows else None
        counters.add(rows.num_rows, entries, None if newest is None else int(newest))

    frame = commit_log_stream(spark, store, indexed_version(store) + 1)
    writer = (
        frame.select(*INDEX_SOURCE_COLUMNS, VERSION_COLUMN)
        .writeStream.queryName(f"lakemq-index-{store.store_id}")
        .foreachBatch(index_batch)
        .option("checkpointLocation", checkpoint_location(store, JOB, checkpoint))
    )
    if once:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return query
    return writer.trigger(processingTime=f"{trigger_ms} milliseconds").start()


def summary(store: Store, stats: IndexStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"index: {stats.entries} index rows from {stats.rows} commit-log rows in {stats.batches} "
        f"batches ({elapsed_s:.1f}s); index version {store.version(schemas.INDEX)}, commit_log "
        f"indexed through version {indexed_version(store)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the index job; returns the process exit code (0 ok, 1 the query failed, 2 bad input)."""
    parser = argument_parser(JOB, "Index messages by key and uniq key for query_by_key / query_by_uniq_key.")
    parser.add_argument(
        "--trigger-ms",
        type=int,
        default=DEFAULT_TRIGGER_MS,
        help=f"trigger interval of a running job in milliseconds (default {DEFAULT_TRIGGER_MS})",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (already reported on one line)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.trigger_ms <= 0:
        return fail(PROG, ValueError(f"--trigger-ms must be > 0, got {args.trigger_ms}"), EXIT_USAGE)
    began = time.monotonic()
    try:
        ctx: JobContext = start(args, app_name="lakemq-index")
    except Exception as exc:  # bad store path, no Java, bad conf: one line, not a traceback
        return fail(PROG, exc, EXIT_USAGE)
    stats = IndexStats()
    try:
        if args.once:
            run_index(ctx.spark, ctx.store, once=True, checkpoint=args.checkpoint, stats=stats)
        else:
            with StopSignal() as stop:
                query = run_index(
                    ctx.spark,
                    ctx.store,
                    once=False,
                    checkpoint=args.checkpoint,
                    stats=stats,
                    trigger_ms=args.trigger_ms,
                )
                serve(query, stop.event)
        print(summary(ctx.store, stats, time.monotonic() - began))
        return EXIT_OK
    except Exception as exc:
        return fail(PROG, exc, EXIT_FAILED)
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
