"""The project's Spark data sources and their registration on a session."""

from __future__ import annotations

from typing import Any

from engine.spark.deltalog import DeltaLogDataSource
from engine.spark.mq_source import MQDataSource

# Every data source the project ships, registered by their short names.
DATA_SOURCES: tuple[type[Any], ...] = (DeltaLogDataSource, MQDataSource)


def register_data_sources(spark: Any) -> list[str]:
    """Register the project's Python data sources on ``spark``; returns their short names.

    Safe to call again on the same session (a registration replaces the previous one).
    """
    for source in DATA_SOURCES:
        spark.dataSource.register(source)
    return [source.name() for source in DATA_SOURCES]
