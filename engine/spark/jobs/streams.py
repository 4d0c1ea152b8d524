"""How a broker job's streaming query is wired: its source, its ``foreachBatch``, its checkpoint.

Every job is a ``foreachBatch`` query started by :func:`start_query`; a job fed by a table's log
(dispatch aside, which only takes the log's offsets) starts it through :func:`run_log_job`, which
resumes the stream after the job's own exactly-once marker. Nothing here parses arguments or waits
for a query: that is :mod:`engine.spark.jobs.runner`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import BatchNotReadError
from engine.spark.jobs.runner import first_line
from engine.spark.jobs.stats import JobStats
from engine.store.delta_log import VERSION_COLUMN
from engine.store.store import Store


def checkpoint_location(store: Store, job: str, override: str | None = None) -> str:
    """A job's streaming checkpoint: ``override``, else ``<checkpoint_dir or store>/_checkpoints/<job>``.

    ``checkpoint_dir`` from the engine config replaces the ``<store>/_checkpoints`` parent.
    """
    if override:
        return override
    parent = store.config.checkpoint_dir or f"{store.root}/_checkpoints"
    return f"{parent.rstrip('/')}/{job}"


def read_batch(batch: Any, batch_id: int) -> pa.Table:
    """A micro-batch's rows as Arrow.

    Raises:
        BatchNotReadError: the rows could not be read, typically because the query is being stopped
            mid-batch. Its message is one short line: Spark matches failure messages of Python
            callbacks with a regex that overflows the stack on long ones.
    """
    try:
        return batch.toArrow()
    except Exception as exc:
        raise BatchNotReadError(f"micro-batch {batch_id} was not read: {first_line(exc)}") from None


def query_name(store: Store, job: str) -> str:
    """The name a job's streaming query shows in the Spark UI and in progress reports."""
    return f"lakemq-{job.replace('_', '-')}-{store.store_id}"


def start_query(
    frame: Any,
    store: Store,
    job: str,
    on_batch: Callable[[Any, int], None],
    *,
    once: bool,
    checkpoint: str | None,
    trigger_ms: int,
) -> Any:
    """Start ``frame`` as the job's ``foreachBatch`` query with its checkpoint.

    Args:
        frame: the streaming DataFrame (a table's log, or a ticker).
        store: the store (names the query and the default checkpoint).
        job: the job's name (``dispatch``, ``schedule``, ...).
        on_batch: called once per micro-batch on the driver with ``(batch, batch_id)``.
        once: process what is available now (``Trigger.AvailableNow``) and wait for the query to
            finish; otherwise start it triggered every ``trigger_ms`` and return it running.
        checkpoint: the streaming checkpoint; default :func:`checkpoint_location`.
        trigger_ms: the processing-time trigger of a running query.

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only; a running
            query reports it through ``exception()`` / ``awaitTermination()``).
    """
    writer = (
        frame.writeStream.queryName(query_name(store, job))
        .foreachBatch(on_batch)
        .option("checkpointLocation", checkpoint_location(store, job, checkpoint))
    )
    if once:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return query
    return writer.trigger(processingTime=f"{trigger_ms} milliseconds").start()


def ticker(spark: Any, interval_ms: int) -> Any:
    """A streaming DataFrame of one row per micro-batch: the clock of a job no table's log feeds.

    Its rows are never read; a job driven by it does its work on the driver once per micro-batch
    (``rate-micro-batch`` makes one at every trigger, the first one at once).
    """
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", "1")
        .option("numPartitions", "1")
        .option("advanceMillisPerBatch", str(interval_ms))
        .load()
    )


def log_stream(
    spark: Any,
    store: Store,
    table: str,
    starting_version: int,
    columns: Sequence[str],
    schema: pa.Schema | None = None,
) -> Any:
    """A table's new rows (``columns`` and ``_version``) from ``starting_version`` on, streaming.

    ``schema`` (the Arrow schema of ``columns``) spares the source inferring it from the table.
    """
    from engine.spark.deltalog import SHORT_NAME, spark_schema

    reader = spark.readStream.format(SHORT_NAME)
    if schema is not None:
        reader = reader.schema(spark_schema(schema))
    reader = (
        reader.option("path", store.uri(table))
        .option("startingVersion", str(starting_version))
        .option("columns", ",".join(columns))
    )
    if store.storage_options:
        reader = reader.option("storageOptions", json.dumps(store.storage_options))
    return reader.load()


def with_missing_versions(rows: pa.Table, marker: int, read: Callable[[int, int], pa.Table]) -> pa.Table:
    """``rows`` preceded by the versions between a job's exactly-once ``marker`` and them.

    The stream's checkpoint and the job's marker normally agree. When the checkpoint is ahead (a
    checkpoint copied from elsewhere, a target table restored from a backup), the versions in between
    would otherwise never be offered again; ``read(first, last)`` reads them from the source table.
    """
    if rows.num_rows == 0:
        return rows
    first = int(pc.min(rows[VERSION_COLUMN]).as_py())
    if first <= marker + 1:
        return rows
    missing = read(marker + 1, first - 1)
    return pa.concat_tables([missing.select(rows.column_names).cast(rows.schema), rows])


def run_log_job(
    spark: Any,
    store: Store,
    *,
    job: str,
    table: str,
    columns: Sequence[str],
    handler: Callable[[pa.Table], None],
    marker: Callable[[], int],
    once: bool,
    checkpoint: str | None,
    trigger_ms: int,
    schema: pa.Schema | None = None,
    catch_up: Callable[[int, int], pa.Table] | None = None,
) -> Any:
    """Start a job fed by ``table``'s log: every micro-batch's rows go to ``handler``.

    The stream starts at the version after ``marker()`` (the job's exactly-once marker, committed with
    what the handler writes), so a lost or fresh checkpoint resumes where the job's output stops.

    Args:
        spark: a SparkSession with the project's data sources (:func:`engine.spark.session`).
        store: the store.
        job: the job's name (query name, default checkpoint ``<store>/_checkpoints/<job>``).
        table: the source table.
        columns: the source columns the handler needs; it also gets ``_version``.
        handler: called once per micro-batch on the driver with its rows (possibly none). It must be
            idempotent per source version, so that a replayed batch writes nothing twice, and must
            raise when it did not write: returning makes Spark commit the batch and never offer its
            versions again.
        marker: the last source version the job's output covers.
        once: process every version committed now and wait for the query to finish; otherwise
            start a query triggered every ``trigger_ms`` and return it running.
        checkpoint: the streaming checkpoint (default under the store).
        trigger_ms: the trigger interval of a running query.
        schema: the Arrow schema of ``columns`` (default: inferred by the source).
        catch_up: ``read(first, last)`` of the source's rows of versions ``first..last``: when given,
            a batch that starts past ``marker() + 1`` is preceded by the versions in between
            (:func:`with_missing_versions`).

    Returns:
        The started ``StreamingQuery`` (terminated already when ``once``).

    Raises:
        pyspark.errors.StreamingQueryException: a micro-batch failed (``once`` only).
    """

    def on_batch(batch: Any, batch_id: int) -> None:
        rows = read_batch(batch, batch_id)
        if catch_up is not None:
            rows = with_missing_versions(rows, marker(), catch_up)
        handler(rows)

    frame = log_stream(spark, store, table, marker() + 1, columns, schema).select(*columns, VERSION_COLUMN)
    return start_query(frame, store, job, on_batch, once=once, checkpoint=checkpoint, trigger_ms=trigger_ms)


@dataclass(frozen=True)
class LogJob:
    """A job fed by one table's log (index, pull log, retry), declared once: :meth:`run` is its
    ``run_<job>`` and :meth:`summary` its summary (the contract of
    :class:`~engine.spark.jobs.registry.Job`).

    Attributes:
        name: the job's name.
        table: the source table.
        columns: the source columns the batch handler needs (it also gets ``_version``).
        covered: the last source version the job's output covers (its exactly-once marker).
        handler: ``handler(store, stats, **options)`` makes the per-micro-batch function (see
            :func:`run_log_job`); it validates ``options`` first, raising before anything starts.
        stats: makes the run's counters.
        trigger_ms: the default trigger interval of a running query.
        output: the table the job writes (its version ends the summary line).
        line: the summary line, formatted with the counters, ``elapsed_s``, ``version`` (of
            ``output``) and ``covered``.
        schema: the source columns' schema, when not the table's own.
        catch_up: ``catch_up(store, first, last)``: rows of source versions ``first..last`` the
            stream's first batch starts after (see :func:`run_log_job`).
    """

    name: str
    table: str
    columns: Sequence[str]
    covered: Callable[[Store], int]
    handler: Callable[..., Callable[[pa.Table], None]]
    stats: Callable[[], JobStats]
    trigger_ms: int
    output: str
    line: str
    schema: pa.Schema | None = None
    catch_up: Callable[[Store, int, int], pa.Table] | None = None

    def run(
        self,
        spark: Any,
        store: Store,
        *,
        once: bool = True,
        checkpoint: str | None = None,
        stats: JobStats | None = None,
        trigger_ms: int | None = None,
        **options: Any,
    ) -> Any:
        """Start the job's query on ``spark`` for ``store``; ``trigger_ms`` (default the job's) is
        the trigger interval of a running query, ``options`` go to the batch handler."""
        handle = self.handler(store, stats if stats is not None else self.stats(), **options)
        catch_up = self.catch_up
        return run_log_job(
            spark,
            store,
            job=self.name,
            table=self.table,
            columns=self.columns,
            handler=handle,
            marker=lambda: self.covered(store),
            once=once,
            checkpoint=checkpoint,
            trigger_ms=self.trigger_ms if trigger_ms is None else trigger_ms,
            schema=self.schema,
            catch_up=None if catch_up is None else (lambda first, last: catch_up(store, first, last)),
        )

    def summary(self, store: Store, stats: JobStats, elapsed_s: float) -> str:
        """The one line a run ends with."""
        return self.line.format(
            **stats.counters(),
            elapsed_s=elapsed_s,
            version=store.version(self.output),
            covered=self.covered(store),
        )
