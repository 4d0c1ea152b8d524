"""The index job: commit_log -> index, as a Spark structured-streaming query.

The query is triggered by new commit-log commits (:func:`~engine.spark.jobs.streams.run_log_job`:
Delta's streaming source, or ``deltalog`` without Delta); the commit-log rows of every version not
yet indexed go to :func:`engine.broker.index.build_index`, which commits the
index rows (one per message key and one per uniq key) together with a Delta app transaction
recording the last commit-log version covered (app id ``mq.index``). A replayed micro-batch (a
restart after a crash, a lost checkpoint, a second indexer) therefore adds nothing: exactly once,
whatever the checkpoint says. ``Admin.query_by_key`` / ``query_by_uniq_key`` read what it builds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.broker.index import INDEX_SOURCE_COLUMNS, INDEX_SOURCE_SCHEMA, build_index, index_pending
from engine.spark.jobs.dispatch import commit_log_trigger
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import LogJob, start_query
from engine.store import schemas
from engine.store.index import indexed_version
from engine.store.store import Store


class IndexStats(JobStats):
    """Micro-batches, commit-log rows read, index rows written and the newest store time indexed."""

    COUNTERS = ("batches", "rows", "entries", "max_store_ts_ms")


def index_batches(store: Store, stats: JobStats) -> Callable[[pa.Table], None]:
    """The index job's micro-batch: index its commit-log rows (:func:`build_index`)."""

    def index_batch(rows: pa.Table) -> None:
        # build_index is idempotent per commit-log version, so a replayed batch adds nothing.
        entries = build_index(store, rows) if rows.num_rows else 0
        stats.count(batches=1, rows=rows.num_rows, entries=entries)
        if rows.num_rows:
            stats.peak("max_store_ts_ms", int(pc.max(rows["store_ts_ms"]).as_py()))

    return index_batch


INDEX_JOB = LogJob(
    name="index",
    table=schemas.COMMIT_LOG,
    columns=INDEX_SOURCE_COLUMNS,
    covered=indexed_version,
    handler=index_batches,
    stats=IndexStats,
    trigger_ms=1000,
    output=schemas.INDEX,
    line=(
        "index: {entries} index rows from {rows} commit-log rows in {batches} batches ({elapsed_s:.1f}s); "
        "index version {version}, commit_log indexed through version {covered}"
    ),
    schema=INDEX_SOURCE_SCHEMA,
)


def run_index(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    stats: JobStats | None = None,
    trigger_ms: int | None = None,
) -> Any:
    """Start the index query on ``spark`` for ``store`` (see :meth:`LogJob.run`).

    A store of one commit-log shard streams its rows into :func:`build_index`
    (:data:`INDEX_JOB`). A store of several follows every shard as the dispatch job does
    (:func:`~engine.spark.jobs.dispatch.commit_log_trigger`): a micro-batch starts when any shard
    moves, and indexes every shard's versions after its marker on the driver (:func:`index_pending`).
    """
    if store.commit_log_shards == 1:
        return INDEX_JOB.run(
            spark, store, once=once, checkpoint=checkpoint, stats=stats, trigger_ms=trigger_ms
        )
    counters = stats if stats is not None else IndexStats()

    def on_batch(batch: Any, batch_id: int) -> None:
        counters.count(batches=1, entries=index_pending(store))

    every_ms = INDEX_JOB.trigger_ms if trigger_ms is None else trigger_ms
    trigger = commit_log_trigger(spark, store, lambda shard: indexed_version(store, shard) + 1, every_ms)
    return start_query(
        trigger.frame,
        store,
        INDEX_JOB.name,
        on_batch,
        once=once,
        checkpoint=checkpoint,
        trigger_ms=every_ms,
        subdir=trigger.checkpoint_subdir,
    )
