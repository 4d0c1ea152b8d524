"""Operational SQL views: consumer offsets, lag, dead letters, pull and action logs, topics.

Added to :data:`engine.spark.views.VIEWS` when ``engine.spark`` is imported, so
:func:`engine.spark.register_views` creates them with the others. Like those, every query reads the
tables as they are when it runs.

* ``consumer_offsets``: the latest committed offset per (group, topic, queue_id, consumer_id)
  (consumer_id is empty for clustering groups), with ``ts`` (timestamp of the commit).
* ``lag``: per (group, consumer_id, topic, queue_id) of every topic the group committed offsets for:
  max_offset, committed_offset (NULL if never committed), lag and oldest_unconsumed_age_ms (now
  minus the store time of the first unconsumed message, NULL when nothing is behind): the rows of
  :func:`engine.client.admin_offsets.lag_rows` (``mq lag``), read through a one-task data source.
* ``dlq``: dispatched messages of the ``%DLQ%<group>`` topics, with their ``group``.
* ``pull_log``, ``action_log``: the tables.
* ``topics``: the latest configuration per topic (deleted topics left out).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from engine.client.admin_offsets import lag_rows
from engine.protocol import DLQ_PREFIX
from engine.spark.mq_options import StoreRef
from engine.spark.views import VIEWS, ViewBuilder, messages_frame, table_frame
from engine.store import schemas
from engine.store.store import Store


def consumer_offsets_frame(spark: Any, store: Store) -> Any:
    """Latest row of ``consumer_offset`` per (group, topic, queue_id, consumer_id)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rows = table_frame(spark, store, schemas.CONSUMER_OFFSET)
    newest = Window.partitionBy("group", "topic", "queue_id", "consumer_id").orderBy(F.col("ts_ms").desc())
    return (
        rows.withColumn("_rank", F.row_number().over(newest))
        .where(F.col("_rank") == 1)
        .select(
            "group",
            "topic",
            "queue_id",
            "consumer_id",
            "offset",
            "ts_ms",
            F.timestamp_millis(F.col("ts_ms")).alias("ts"),
        )
    )


def topics_frame(spark: Any, store: Store) -> Any:
    """Latest configuration per topic; a topic whose latest row is a deletion marker is left out."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rows = table_frame(spark, store, schemas.TOPICS)
    newest = Window.partitionBy("name").orderBy(F.col("created_ts_ms").desc())
    return (
        rows.withColumn("_rank", F.row_number().over(newest))
        .where((F.col("_rank") == 1) & (F.col("queues") > 0))
        .select("name", "queues", "perm", "type", "created_ts_ms")
    )


LAG_SCHEMA = (
    "`group` string, consumer_id string, topic string, queue_id int, max_offset long, "
    "committed_offset long, lag long, oldest_unconsumed_age_ms long"
)


class _LagPartition(InputPartition):
    def __init__(self) -> None:
        super().__init__(None)


class _LagReader(DataSourceReader):
    def __init__(self, ref: StoreRef) -> None:
        self.ref = ref

    def partitions(self) -> Sequence[InputPartition]:
        return [_LagPartition()]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        # Computed when the partition is read: every query of the view sees the store as it is then.
        for row in lag_rows(self.ref.open()):
            yield (
                row.group,
                row.consumer_id,
                row.topic,
                row.queue_id,
                row.max_offset,
                row.committed_offset,
                row.lag,
                row.oldest_unconsumed_age_ms,
            )


class LagDataSource(DataSource):
    """``mqlag``: :func:`~engine.client.admin_offsets.lag_rows` of a store (option ``store``)."""

    @classmethod
    def name(cls) -> str:
        return "mqlag"

    def schema(self) -> str:
        return LAG_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        options = {str(k).lower(): str(v) for k, v in self.options.items()}
        storage = json.loads(options["storageoptions"]) if options.get("storageoptions") else None
        return _LagReader(StoreRef.of(options["store"], storage))


def lag_frame(spark: Any, store: Store) -> Any:
    """Lag per (group, consumer_id, topic, queue_id); see the module doc.

    The numbers are :func:`~engine.client.admin_offsets.lag_rows`' (what ``mq lag`` prints),
    computed in one Spark task from the consume queue's marks: a few milliseconds, where the same
    in SQL takes several scans and shuffles of the tables.
    """
    spark.dataSource.register(LagDataSource)
    reader = spark.read.format(LagDataSource.name()).schema(LAG_SCHEMA).option("store", store.root)
    if store.storage_options:
        reader = reader.option("storageOptions", json.dumps(store.storage_options))
    return reader.load()


def dlq_frame(spark: Any, store: Store) -> Any:
    """Dispatched messages of every ``%DLQ%<group>`` topic, with the ``group`` first."""
    from pyspark.sql import functions as F

    messages = messages_frame(spark, store)
    prefix = len(DLQ_PREFIX)
    return messages.where(F.col("topic").startswith(DLQ_PREFIX)).select(
        F.expr(f"substring(topic, {prefix + 1})").alias("group"), *messages.columns
    )


def _table(name: str) -> ViewBuilder:
    def build(spark: Any, store: Store) -> Any:
        return table_frame(spark, store, name)

    build.__doc__ = f"The ``{name}`` table."
    return build


OPS_VIEWS: dict[str, ViewBuilder] = {
    "consumer_offsets": consumer_offsets_frame,
    "lag": lag_frame,
    "dlq": dlq_frame,
    schemas.PULL_LOG: _table(schemas.PULL_LOG),
    schemas.ACTION_LOG: _table(schemas.ACTION_LOG),
    schemas.TOPICS: topics_frame,
}

# Joined into the views every register_views() call creates.
VIEWS.update(OPS_VIEWS)
