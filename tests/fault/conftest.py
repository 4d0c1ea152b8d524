"""Fixtures of the fault scenarios (the FAULTS.md report is :mod:`tests.fault.report`'s)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault import procs


@pytest.fixture(autouse=True)
def _no_child_left_running() -> Iterator[None]:
    """A scenario that fails half-way must not leave its producers, dispatchers or JVMs running."""
    yield
    procs.reap()


@pytest.fixture
def history_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory for the scenario's per-process event files (``*.jsonl``)."""
    path = tmp_path / "history"
    path.mkdir()
    yield path
