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

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.broker.index import INDEX_SOURCE_COLUMNS, INDEX_SOURCE_SCHEMA, build_index, unindexed_rows
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import run_log_job
from engine.store import schemas
from engine.store.index import indexed_version
from engine.store.store import Store

JOB = "index"
DEFAULT_TRIGGER_MS = 1000


@dataclass
class IndexStats(JobStats):
    """Progress of one run of the job (updated on the driver, once per micro-batch)."""

    batches: int = 0
    rows: int = 0
    entries: int = 0
    max_store_ts_ms: int | None = None  # newest message indexed by this run

    def add(self, rows: int, entries: int, max_store_ts_ms: int | None) -> None:
        with self._lock:
            self.batches += 1
            self.rows += rows
            self.entries += entries
            if max_store_ts_ms is not None:
                self.max_store_ts_ms = max(self.max_store_ts_ms or 0, max_store_ts_ms)


def run_index(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    stats: IndexStats | None = None,
    trigger_ms: int = DEFAULT_TRIGGER_MS,
) -> Any:
    """Start the index query on ``spark`` for ``store`` (commit log -> index).

    The arguments, result and errors are those of every job's ``run``
    (:class:`~engine.spark.jobs.registry.Job`); ``trigger_ms`` is the processing-time trigger of a
    running query.
    """
    counters = stats if stats is not None else IndexStats()

    def index_batch(rows: pa.Table) -> None:
        # build_index is idempotent per commit-log version, so a replayed batch adds nothing.
        entries = build_index(store, rows) if rows.num_rows else 0
        newest = pc.max(rows["store_ts_ms"]).as_py() if rows.num_rows else None
        counters.add(rows.num_rows, entries, None if newest is None else int(newest))

    return run_log_job(
        spark,
        store,
        job=JOB,
        table=schemas.COMMIT_LOG,
        columns=INDEX_SOURCE_COLUMNS,
        schema=INDEX_SOURCE_SCHEMA,
        handler=index_batch,
        marker=lambda: indexed_version(store),
        catch_up=lambda first, last: unindexed_rows(store, first, last),
        once=once,
        checkpoint=checkpoint,
        trigger_ms=trigger_ms,
    )


def summary(store: Store, stats: IndexStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"index: {stats.entries} index rows from {stats.rows} commit-log rows in {stats.batches} "
        f"batches ({elapsed_s:.1f}s); index version {store.version(schemas.INDEX)}, commit_log "
        f"indexed through version {indexed_version(store)}"
    )
