"""Spark integration: data sources, sessions, SQL views."""
