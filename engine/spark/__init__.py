"""Spark integration: the session, the project's data sources, SQL views over a store."""

from engine.spark import operational_views as _operational_views  # noqa: F401  (adds its views)
from engine.spark.datasources import register_data_sources
from engine.spark.replay import replay
from engine.spark.session import session
from engine.spark.views import register_views

__all__ = ["register_data_sources", "register_views", "replay", "session"]
