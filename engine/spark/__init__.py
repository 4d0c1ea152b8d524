"""Spark integration: the session (with Delta on Spark), the project's data sources, SQL views, replay,
time travel and history, and catalog tables over a store."""

from engine.spark import operational_views as _operational_views  # noqa: F401  (adds its views)
from engine.spark.datasources import register_data_sources
from engine.spark.delta_reads import history, register_tables, table_as_of
from engine.spark.replay import replay
from engine.spark.session import delta_enabled, session
from engine.spark.views import register_views

__all__ = [
    "delta_enabled",
    "history",
    "register_data_sources",
    "register_tables",
    "register_views",
    "replay",
    "session",
    "table_as_of",
]
