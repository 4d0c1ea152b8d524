"""SQL over a store: temporary views on the current snapshots of its tables.

Each view is a builder ``(spark, store) -> DataFrame`` in :data:`VIEWS`; adding a view is adding an
entry. Views follow the tables: every query reads the snapshots current when it runs.

A store with several commit-log shards (``commit_log_shards``) keeps one commit-log table per shard;
the ``commit_log`` view is their union (:func:`commit_log_frame`), so SQL over ``commit_log`` and
``messages`` sees every message whichever shard holds it.

On a session with Delta on Spark (:func:`engine.spark.session.delta_enabled`, the default) a table
is a native Delta scan (``spark.read.format("delta")``): filters are pushed into the Parquet reader
and files are skipped by their min/max statistics, and Delta refreshes the snapshot at every query.
The choice goes by the store's scheme (:func:`native_reads`): a local store, and a store on S3
(``s3://``, ``s3a://``) once the session has S3A (:func:`engine.spark.object_store.prepare_session`
sets its ``fs.s3a.*`` from the store's storage options). Elsewhere (Delta off, no S3A jars, another
scheme) the project's own ``deltalog`` source reads them with the store's delta-rs storage options
(its ``live`` option re-plans the snapshot at every execution).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from engine.errors import InvalidArgumentError
from engine.spark.deltalog import SHORT_NAME, spark_schema
from engine.spark.object_store import prepare_session
from engine.spark.session import delta_enabled
from engine.store import schemas
from engine.store.delta import VERSION_COLUMN
from engine.store.store import Store

ViewBuilder = Callable[[Any, Store], Any]

# The columns a reader of messages sees (the ``messages`` view, the ``mq`` source, replays).
# ``msg_id`` is the unique id the producer got (the commit log's ``uniq_key``: the same on every copy
# of a message, as RocketMQ's consumer-side ``getMsgId()``); ``offset_msg_id`` is the copy's store id
# (the commit log's ``msg_id``). :func:`message_column` maps them.
MESSAGE_COLUMNS = (
    "topic",
    "queue_id",
    "queue_offset",
    "physical_offset",
    "msg_id",
    "offset_msg_id",
    "tags",
    "keys",
    "properties",
    "body",
    "born_ts_ms",
    "store_ts_ms",
    "reconsume_times",
)


_FROM_COMMIT_LOG = {"msg_id": "uniq_key", "offset_msg_id": "msg_id"}


def message_column(name: str) -> Any:
    """The Spark column that gives :data:`MESSAGE_COLUMNS`' ``name`` from commit-log rows."""
    from pyspark.sql import functions as F

    source = _FROM_COMMIT_LOG.get(name)
    return F.col(name) if source is None else F.col(source).alias(name)


def native_reads(spark: Any, store: Store) -> bool:
    """Whether ``store``'s tables are read with ``format("delta")`` on ``spark``, rather than through
    ``deltalog``: on a session with Delta on Spark, for a local store, and for one on S3 when the
    session has S3A (whose ``fs.s3a.*`` settings this sets from the store's storage options on first
    use, see :func:`engine.spark.object_store.prepare_session`). Chosen by the root's scheme, not by
    whether storage options were given."""
    return delta_enabled(spark) and prepare_session(spark, store.root, store.storage_options)


def table_frame(spark: Any, store: Store, name: str) -> Any:
    """One table of ``store`` as a DataFrame that reads the snapshot current at each execution, so a
    view over it follows the table: a native Delta scan where :func:`native_reads`, else through
    ``deltalog``."""
    if native_reads(spark, store):
        return spark.read.format("delta").load(store.uri(name))
    return deltalog_frame(spark, store, name)


def deltalog_frame(spark: Any, store: Store, name: str) -> Any:
    """One table of ``store`` read through the project's ``deltalog`` source (no Delta jars needed),
    following the table like :func:`table_frame`."""
    reader = (
        spark.read.format(SHORT_NAME)
        .schema(spark_schema(schemas.schema_of(name)))  # known: spares Spark a Python worker to ask
        .option("path", store.uri(name))
        .option("live", "true")
    )
    if store.storage_options:
        reader = reader.option("storageOptions", json.dumps(store.storage_options))
    return reader.load().drop(VERSION_COLUMN)


def commit_log_frame(spark: Any, store: Store, shards: Iterable[int] | None = None) -> Any:
    """The commit log of ``store`` as one DataFrame: every shard's table (or those of ``shards``),
    unioned (``UNION ALL``; physical offsets never repeat across shards). With one shard it is the
    ``commit_log`` table itself. This is what the ``commit_log`` view reads.
    """
    wanted = range(store.commit_log_shards) if shards is None else sorted(set(shards))
    frames = [table_frame(spark, store, schemas.commit_log_table(k)) for k in wanted]
    if not frames:
        raise InvalidArgumentError("commit_log_frame needs at least one shard", shards=shards)
    frame = frames[0]
    for more in frames[1:]:
        frame = frame.unionByName(more)
    return frame


def _table_view(name: str) -> ViewBuilder:
    def build(spark: Any, store: Store) -> Any:
        return table_frame(spark, store, name)

    build.__doc__ = f"The ``{name}`` table."
    return build


def messages_frame(spark: Any, store: Store) -> Any:
    """One row per dispatched message with its body: the commit log within what the consume queue
    holds of each queue.

    Transaction halves are absent, as they are from pulls; so is what is not dispatched yet (a
    pull reads that from the commit log's tail, :mod:`engine.store.queue_entries`; the view reads
    the consume-queue table as Delta has it).

    A queue's consume-queue entries are dense (offsets are given one by one at commit and dispatched
    in order; retention only removes a queue's oldest ones), so the dispatched messages of a queue
    are exactly its commit-log rows between the queue's first and last entry. The view joins the
    commit log to those bounds (a few rows per topic, broadcast) instead of to every entry: the
    1M-row join shuffled every body. A filter on topic reaches both scans (the bounds group by
    topic), so both skip files by their statistics.
    """
    from pyspark.sql import functions as F

    keys = ["topic", "queue_id"]
    bounds = (
        table_frame(spark, store, schemas.CONSUME_QUEUE)
        .groupBy(*keys)
        .agg(F.min("queue_offset").alias("_first"), F.max("queue_offset").alias("_last"))
    )
    log = commit_log_frame(spark, store)
    joined = log.join(F.broadcast(bounds), on=keys, how="inner").where(
        F.col("queue_offset").between(F.col("_first"), F.col("_last"))
    )
    return joined.select(
        *(message_column(c) for c in MESSAGE_COLUMNS),
        F.timestamp_millis(F.col("store_ts_ms")).alias("store_ts"),
    )


VIEWS: dict[str, ViewBuilder] = {
    schemas.COMMIT_LOG: commit_log_frame,
    schemas.CONSUME_QUEUE: _table_view(schemas.CONSUME_QUEUE),
    "messages": messages_frame,
}


def register_views(spark: Any, store: Store, names: Iterable[str] | None = None) -> list[str]:
    """Create (or replace) temporary views over ``store``; returns the names registered.

    Args:
        spark: a SparkSession (see :func:`engine.spark.session`).
        store: the store the views read.
        names: which views of :data:`VIEWS` (default: all of them).

    Raises:
        InvalidArgumentError: an unknown view name.
    """
    wanted = list(VIEWS) if names is None else list(names)
    unknown = [n for n in wanted if n not in VIEWS]
    if unknown:
        raise InvalidArgumentError(f"unknown views {unknown}; views: {', '.join(VIEWS)}")
    for name in wanted:
        VIEWS[name](spark, store).createOrReplaceTempView(name)
    return wanted
