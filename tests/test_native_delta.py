"""The store's tables are plain Delta tables: the session opens them natively with delta-spark
(``spark.read.format("delta")``) and finds exactly what the project's own ``deltalog`` source and
delta-rs read.

The Delta jars are fetched on first use (:mod:`engine.spark.delta_jars`); on a machine that cannot
fetch them these tests skip, and in CI (``CI=true``, where Maven Central is reachable) they fail.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from engine import Admin, Message, Producer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.spark.delta_jars import DELTA_EXTENSION
from engine.spark.session import delta_enabled
from engine.spark.views import deltalog_frame, table_frame
from engine.store import schemas

pytestmark = pytest.mark.spark


def require_delta(spark: Any) -> None:
    """Skip without Delta on Spark; in CI, where the jars can always be fetched, fail instead."""
    if delta_enabled(spark):
        return
    message = "Delta on Spark is off: the Delta jars could not be fetched (see the session's stderr line)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def scanned_by(frame: Any) -> str:
    """What reads the (single) table under ``frame``: the file index of a file relation (Delta's is
    ``TahoeLogFileIndex``), else the class of the leaf (a Python data source's relation)."""
    leaf = frame._jdf.queryExecution().analyzed().collectLeaves().head()
    if leaf.getClass().getSimpleName() == "LogicalRelation":
        return str(leaf.relation().location().getClass().getSimpleName())
    return str(leaf.toString())


def comparable(frame: Any) -> Any:
    """Maps as JSON text: chispa sorts rows by every column, and Spark cannot sort maps."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    columns = [
        F.to_json(F.col(f.name)).alias(f.name) if isinstance(f.dataType, MapType) else F.col(f.name)
        for f in frame.schema.fields
    ]
    return frame.select(*columns)


def test_the_session_loads_delta_with_its_extension_and_catalog(spark: Any) -> None:
    require_delta(spark)
    assert DELTA_EXTENSION in spark.conf.get("spark.sql.extensions")
    assert spark.conf.get("spark.sql.catalog.spark_catalog").endswith("DeltaCatalog")
    jvm = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    assert loader.loadClass(DELTA_EXTENSION) is not None


def test_every_table_reads_natively_as_delta_with_the_same_rows(spark: Any, store: Store) -> None:
    require_delta(spark)
    from chispa import assert_df_equality

    Admin(store).create_topic("T", 2)
    with Producer(store) as p:
        p.send_batch([Message("T", f"m{i}".encode(), tags="A", keys=(f"k{i}",)) for i in range(5)])
        p.send(Message("T", b"props", properties={"a": "1"}))
    dispatch_pending(store)
    index_pending(store)
    for name in schemas.SCHEMAS:
        native = table_frame(spark, store, name)
        ours = deltalog_frame(spark, store, name)
        assert native.columns == ours.columns == schemas.SCHEMAS[name].names, name
        assert scanned_by(native) == "TahoeLogFileIndex", name  # Delta's own file index
        assert_df_equality(comparable(native), comparable(ours), ignore_row_order=True, ignore_nullable=True)


def test_turning_delta_reads_off_falls_back_to_deltalog(spark: Any, store: Store) -> None:
    require_delta(spark)
    Admin(store).create_topic("T", 1)
    with Producer(store) as p:
        p.send(Message("T", b"x"))
    spark.conf.set("spark.lakemq.delta", "false")
    try:
        assert not delta_enabled(spark)
        frame = table_frame(spark, store, schemas.COMMIT_LOG)
        assert "deltalog" in scanned_by(frame).lower()
        assert frame.count() == 1
    finally:
        spark.conf.set("spark.lakemq.delta", "true")
    assert delta_enabled(spark)
