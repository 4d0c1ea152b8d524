"""Shared fixtures: a fresh store per test in tmp_path, one SparkSession per test run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from engine import Admin, Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """An empty store in a temporary directory."""
    return Store.open(tmp_path / "mqdata")


@pytest.fixture
def admin(store: Store) -> Admin:
    return Admin(store)


@pytest.fixture
def topic(admin: Admin) -> str:
    """A topic named ``T`` with 4 queues."""
    admin.create_topic("T", 4)
    return "T"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run (local[2], few partitions, UI off)."""
    from engine.spark import session

    spark = session(
        app_name="lakemq-tests",
        conf={
            "spark.master": "local[2]",
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
        },
    )
    yield spark
    spark.stop()
