"""Reads of a store through Delta on Spark: replay as a native scan, time travel, history, a catalog.

Everything here only reads. The tables are written by the engine alone (delta-rs, with the
sequencer's marks in each commit): on a local file system delta-spark's log store gives writers no
mutual exclusion against other processes, and a Spark-side OPTIMIZE, DELETE or protocol upgrade
would drop the engine's commit markers. The catalog tables that :func:`register_tables` creates
point at the store's locations; do not write to them from Spark.

Data skipping: the commit log keeps file statistics on its identity columns (topic, queue_id,
queue_offset, physical_offset, ids, tags) and on both times (``delta.dataSkippingStatsColumns``,
set by the store), the consume queue and index on all of theirs, so Spark reads only the files a
filter on topic, queue offsets or store time can match.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from engine.errors import InvalidArgumentError, StoreError
from engine.model import UNDISPATCHED_FLAGS
from engine.protocol import parse_tag_expression
from engine.protocol.shards import shard_of_queue
from engine.spark.views import MESSAGE_COLUMNS, commit_log_frame, message_column, native_reads
from engine.store import schemas
from engine.store.store import Store

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def require_native(spark: Any, store: Store) -> None:
    """Raise unless ``store`` is read natively on ``spark`` (Delta on; a local store, or one on S3
    with S3A on the session).

    Raises:
        StoreError: Delta on Spark is off on this session, or it cannot read the store's scheme.
    """
    if not native_reads(spark, store):
        raise StoreError(
            "this read needs Delta on Spark (a session from engine.spark.session(store=...) with the "
            "Delta jars) and a store Spark can read: a local one, or s3:// / s3a:// with the S3A jars",
            store=store.root,
        )


def message_frame(
    spark: Any,
    store: Store,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    *,
    expression: str = "*",
    start_ms: int | None = None,
    end_ms: int | None = None,
) -> Any:
    """The messages of ``topic`` at queue offsets ``[start, end)`` of each queue in ``ranges``, as a
    native Delta scan of the commit log, in the ``mq`` source's columns.

    Offsets are assigned once, at commit, and a topic's rows carry them, so the commit-log rows of
    ``topic`` in those ranges are exactly the messages a pull of them returns (callers pass ranges
    within what is dispatched, as :func:`engine.spark.mq_source.plan_batch` plans them). The topic,
    the offset ranges and the optional store-time bounds are pushed down as filters, so the scan
    skips every file whose statistics rule it out.

    Args:
        spark: a session with Delta on Spark.
        store: a local store.
        topic: the topic read.
        ranges: queue id -> (first offset, end offset); empty ranges are left out.
        expression: tag expression (``*``, ``TagA || TagB``).
        start_ms: first store time included (epoch ms): only narrows the files read (the ranges
            already hold exactly the window's messages).
        end_ms: first store time excluded (epoch ms), likewise.

    Raises:
        StoreError: Delta on Spark is off, or the store is not local.
        InvalidArgumentError: a bad tag expression.
    """
    from pyspark.sql import functions as F

    require_native(spark, store)
    tag_filter = parse_tag_expression(expression)
    # Only the shards holding the topic's queues asked for are scanned (a queue lives in one shard).
    shards = {shard_of_queue(topic, q, store.commit_log_shards) for q in ranges} or {0}
    log = commit_log_frame(spark, store, shards)
    wanted = [
        (F.col("queue_id") == q) & (F.col("queue_offset") >= lo) & (F.col("queue_offset") < hi)
        for q, (lo, hi) in sorted(ranges.items())
        if hi > lo
    ]
    condition = F.lit(False)
    if wanted:
        condition = wanted[0]
        for more in wanted[1:]:
            condition = condition | more
        lows = [lo for lo, hi in ranges.values() if hi > lo]
        highs = [hi for lo, hi in ranges.values() if hi > lo]
        condition = condition & F.col("queue_offset").between(min(lows), max(highs) - 1)
    rows = log.where((F.col("topic") == topic) & condition)
    rows = rows.where(~F.col("sys_flag").isin(*sorted(UNDISPATCHED_FLAGS)))
    if start_ms is not None:
        rows = rows.where(F.col("store_ts_ms") >= start_ms)
    if end_ms is not None:
        rows = rows.where(F.col("store_ts_ms") < end_ms)
    if not tag_filter.matches_all:
        rows = rows.where(F.col("tags").isin(*sorted(tag_filter.tags)))
    return as_message_rows(rows)


def as_message_rows(log: Any) -> Any:
    """Commit-log rows in the ``mq`` source's columns (store and born times as timestamps)."""
    from pyspark.sql import functions as F

    times = {"born_ts_ms": "born_ts", "store_ts_ms": "store_ts"}
    return log.select(
        *(
            F.timestamp_millis(F.col(c)).alias(times[c]) if c in times else message_column(c)
            for c in MESSAGE_COLUMNS
        )
    )


def table_as_of(
    spark: Any, store: Store, name: str, *, version: int | None = None, timestamp: str | None = None
) -> Any:
    """One table as it stood at a Delta ``version`` or ``timestamp`` (Delta time travel).

    Versions whose commit files log retention has cleaned up, and data files vacuum has deleted,
    cannot be read (Delta raises); a checkpoint keeps the versions after it readable.

    Args:
        spark: a session with Delta on Spark.
        store: a local store.
        name: a table of the store (:meth:`Store.tables`; each commit-log shard has its own
            versions, so time travel names one: ``commit_log``, ``commit_log_1``, …).
        version: a table version (``VERSION AS OF``).
        timestamp: a timestamp Spark can cast (``TIMESTAMP AS OF``), e.g. ``2026-11-24 07:00:00``.

    Raises:
        InvalidArgumentError: an unknown table, or not exactly one of ``version`` / ``timestamp``.
        StoreError: Delta on Spark is off, or the store is not local.
    """
    _check_table(store, name)
    if (version is None) == (timestamp is None):
        raise InvalidArgumentError("give exactly one of version and timestamp", version=version)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise InvalidArgumentError(f"version {version!r} must be an int >= 0", version=version)
    require_native(spark, store)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    else:
        reader = reader.option("timestampAsOf", timestamp)
    return reader.load(store.uri(name))


def history(spark: Any, store: Store, name: str) -> Any:
    """``DESCRIBE HISTORY`` of one table: one row per retained version, newest first.

    Raises:
        InvalidArgumentError: an unknown table.
        StoreError: Delta on Spark is off, or the store is not local.
    """
    _check_table(store, name)
    require_native(spark, store)
    return spark.sql(f"DESCRIBE HISTORY delta.`{_quoted(store.uri(name))}`")


def register_tables(
    spark: Any, store: Store, database: str = "lakemq", names: Iterable[str] | None = None
) -> list[str]:
    """Register the store's tables in a catalog database, so notebooks see them as tables
    (``CREATE TABLE <database>.<table> USING delta LOCATION '<store>/<table>'``).

    The entries only point at the store's locations: they read what the engine writes, and must not
    be written to from Spark (see the module doc). A table already registered is left as it is.

    Commit-log shards. In a store with one shard ``commit_log`` is a Delta table, as before. In a
    store with N > 1 shards each shard's Delta table is registered as ``<database>.commit_log_<k>``
    (``commit_log_0`` for shard 0, whose directory is ``commit_log``; ``commit_log_1`` … as their
    directories), and ``<database>.commit_log`` is a view, the ``UNION ALL`` of them, so that SQL
    over ``commit_log`` sees every message. Asking for ``commit_log`` registers all of it; asking for
    ``commit_log_<k>`` (k >= 1) registers that shard's table alone.

    Args:
        spark: a session with Delta on Spark.
        store: a local store.
        database: the database created (if missing) and registered in.
        names: which tables (default: all of them, every shard included).

    Returns:
        The qualified names registered (``lakemq.commit_log``, …; with shards the shard tables
        before the ``commit_log`` view).

    Raises:
        InvalidArgumentError: an unknown table or a database name that is not an identifier.
        StoreError: Delta on Spark is off, or the store is not local.
    """
    if not _IDENTIFIER.match(database):
        raise InvalidArgumentError(f"database {database!r} must be an identifier", database=database)
    wanted = list(store.tables()) if names is None else list(names)
    for name in wanted:
        _check_table(store, name)
    require_native(spark, store)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    sharded = store.commit_log_shards > 1
    registered: list[str] = []

    def register(entry: str, table: str) -> None:
        qualified = f"{database}.{entry}"
        if qualified in registered:
            return
        location = _quoted(_absolute(store.uri(table)))
        spark.sql(f"CREATE TABLE IF NOT EXISTS `{database}`.`{entry}` USING delta LOCATION '{location}'")
        registered.append(qualified)

    for name in wanted:
        shard = schemas.shard_of_table(name)
        if not sharded or shard is None or shard > 0:
            register(name, name)
        else:  # the whole commit log: every shard's table, then the view over them
            parts = [f"commit_log_{k}" for k in range(store.commit_log_shards)]
            for k, part in enumerate(parts):
                register(part, schemas.commit_log_table(k))
            union = " UNION ALL ".join(f"SELECT * FROM `{database}`.`{p}`" for p in parts)
            spark.sql(f"CREATE VIEW IF NOT EXISTS `{database}`.`{name}` AS {union}")
            registered.append(f"{database}.{name}")
    return registered


def _check_table(store: Store, name: str) -> None:
    if name not in store.tables():
        raise InvalidArgumentError(f"unknown table {name!r}; tables: {', '.join(store.tables())}", table=name)


def _quoted(text: str) -> str:
    if "'" in text or "`" in text:
        raise InvalidArgumentError(f"location {text!r} holds a quote", location=text)
    return text


def _absolute(uri: str) -> str:
    from pathlib import Path

    if "://" in uri:
        return uri
    return str(Path(uri).resolve())
