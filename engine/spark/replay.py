"""Replay: the messages of a topic over a time window, as a consumer saw them, as the log stood then.

The queue ranges are planned on the driver (below); the rows are then read

* on a session with Delta on Spark (the default, :func:`engine.spark.views.native_reads`): by a
  native Delta scan of the commit log (the shards holding the topic's queues) filtered to the
  topic and those ranges (and the store-time window), which skips files by their statistics
  (:func:`engine.spark.delta_reads.message_frame`);
  the ranges are fixed when :func:`replay` is called, so executing the DataFrame again gives the
  same messages (until retention deletes some);
* elsewhere: by the ``mq`` batch source (the pull path: consume-queue entries, then commit-log rows
  by physical offset, in Python workers), split over Spark tasks per queue, planned again at each
  execution.

* Time window ``[start, end)`` (store time, epoch ms): per queue, the first offset stored at or after
  each bound, found by binary search (:mod:`engine.client.admin_offsets`); store times are
  non-decreasing within a queue, so the offsets between them are exactly the messages in the window.
* ``as_of_version``: the topic as it stood at that commit-log version. The commit log's own marks
  at that version (read from its commitInfo with Delta time travel, ``Store.snapshot(name,
  version)``) give each queue's end at the time; queue offsets are assigned in commit order, so
  the offsets below it are exactly the messages committed by then. Unlike re-reading the old
  snapshot's data files, this keeps working after compaction and vacuum of those files.
* ``group``: only what the group had consumed: offsets below its committed offset per queue (a
  queue it never committed contributes nothing). With ``as_of_version``, its offsets as they stood
  when that version was committed (``consumer_offset`` rows up to that commit's timestamp).
"""

from __future__ import annotations

import json
from typing import Any

from engine.client.admin_offsets import check_timestamp
from engine.errors import InvalidArgumentError
from engine.protocol import validate_group_name, validate_topic_name
from engine.spark.delta_reads import message_frame
from engine.spark.mq_options import SHORT_NAME, ReadOptions
from engine.spark.mq_source import MQDataSource, plan_batch
from engine.spark.views import native_reads
from engine.store.store import Store


def replay(
    spark: Any,
    store: Store,
    topic: str,
    start: int | None = None,
    end: int | None = None,
    group: str | None = None,
    as_of_version: int | None = None,
    *,
    expression: str = "*",
) -> Any:
    """The dispatched messages of ``topic`` stored in ``[start, end)``, as a DataFrame.

    Args:
        spark: a SparkSession (see :func:`engine.spark.session`).
        store: the store.
        topic: the topic replayed.
        start: first store time included (epoch ms); default: the oldest retained message.
        end: first store time excluded (epoch ms); default: everything dispatched.
        group: only the messages this consumer group had consumed (below its committed offsets).
        as_of_version: read the topic as it stood at this commit-log Delta version (stores with
            one commit-log shard; with several, each shard has its own versions: bound by ``end``).
        expression: tag expression (``*``, ``TagA || TagB``).

    Returns:
        A DataFrame with the ``mq`` source's columns (topic, queue_id, queue_offset, …, body,
        store_ts).

    Raises:
        InvalidArgumentError: a bad argument (``end`` before ``start``, a negative version, a
            version after the latest one, a version on a store with several commit-log shards, …).
        TopicNotFoundError: no such topic.
        StoreError: ``as_of_version`` covers messages the dispatch job has not indexed yet.

    Every error is raised here, before Spark runs: the replay is planned once in this process too.
    """
    validate_topic_name(topic)
    store.topic(topic)
    options = {"store": store.root, "topic": topic}
    if store.storage_options:
        options["storageOptions"] = json.dumps(store.storage_options)
    if start is not None:
        options["startTime"] = str(check_timestamp(start, "start"))
    if end is not None:
        options["endTime"] = str(check_timestamp(end, "end"))
        if start is not None and end < start:
            raise InvalidArgumentError(f"end {end} is before start {start}", start=start, end=end)
    if group is not None:
        options["consumedBy"] = validate_group_name(group)
    if as_of_version is not None:
        if isinstance(as_of_version, bool) or not isinstance(as_of_version, int) or as_of_version < 0:
            raise InvalidArgumentError(
                f"as_of_version {as_of_version!r} must be a Delta version (an int >= 0)",
                as_of_version=as_of_version,
            )
        options["asOfVersion"] = str(as_of_version)
    if expression != "*":
        options["expression"] = expression
    # Planned here: a bad argument is a typed error before Spark runs anything.
    first, last = plan_batch(store, ReadOptions.parse(options, streaming=False))
    if native_reads(spark, store):
        ranges = {q: (first[q], last[q]) for q in last}
        return message_frame(spark, store, topic, ranges, expression=expression, start_ms=start, end_ms=end)
    spark.dataSource.register(MQDataSource)  # a session not made by engine.spark.session() lacks it
    return spark.read.format(SHORT_NAME).options(**options).load()
