"""The store's tables are plain Delta tables: where the Delta JVM jars are on Spark's classpath, every
table reads natively with ``spark.read.format("delta")`` and holds exactly what the project's own
``deltalog`` source reads (tables stay readable by any Delta reader).

The jars come from Maven (``delta-spark``'s ``io.delta:delta-spark_2.13``), which is unreachable
here, so on this machine the test skips; on Databricks or a machine with the jars it runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import Admin, Message, Producer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.spark.views import table_frame
from engine.store import schemas

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
SKIP_REASON = (
    "Delta JVM jars absent: Maven is unreachable here; install delta-spark with its jars "
    "(e.g. spark.jars.packages=io.delta:delta-spark_2.13:<version>) to run"
)


def delta_jars_loadable(spark: Any) -> bool:
    """True when the Delta Lake JVM classes are on this session's classpath."""
    jvm = getattr(spark, "_jvm", None) or getattr(getattr(spark, "sparkContext", None), "_jvm", None)
    if jvm is None:  # Spark Connect: no JVM in this process to ask
        return False
    for load in (
        lambda: jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(DELTA_EXTENSION),
        lambda: jvm.java.lang.Class.forName(DELTA_EXTENSION),
    ):
        try:
            load()
            return True
        except Exception:
            continue
    return False


def _comparable(frame: Any) -> Any:
    """Maps as JSON text: chispa sorts rows by every column, and Spark cannot sort maps."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    columns = [
        F.to_json(F.col(f.name)).alias(f.name) if isinstance(f.dataType, MapType) else F.col(f.name)
        for f in frame.schema.fields
    ]
    return frame.select(*columns)


@pytest.mark.spark
def test_every_table_reads_natively_as_delta_with_the_same_rows(spark: Any, store: Store) -> None:
    if not delta_jars_loadable(spark):
        pytest.skip(SKIP_REASON)
    from chispa import assert_df_equality

    Admin(store).create_topic("T", 2)
    with Producer(store) as p:
        p.send_batch([Message("T", f"m{i}".encode(), tags="A", keys=(f"k{i}",)) for i in range(5)])
        p.send(Message("T", b"props", properties={"a": "1"}))
    dispatch_pending(store)
    index_pending(store)
    for name in schemas.SCHEMAS:
        native = spark.read.format("delta").load(store.uri(name))
        ours = table_frame(spark, store, name)
        assert native.columns == ours.columns, name
        assert_df_equality(
            _comparable(native), _comparable(ours), ignore_row_order=True, ignore_nullable=True
        )
