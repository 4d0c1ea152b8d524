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

import pyarrow as pa
import pyarrow.compute as pc

from engine.broker.index import INDEX_SOURCE_COLUMNS, INDEX_SOURCE_SCHEMA, build_index
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import LogJob
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
run_index = INDEX_JOB.run
