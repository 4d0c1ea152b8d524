"""Fault suite plumbing: a results file per pytest session, turned into FAULTS.md at the end.

Every scenario calls :func:`tests.fault.history.record` once; when at least one did during this
session, ``FAULTS.md`` at the repository root is regenerated from these rows. Rows of scenarios whose
tests did not run this time are kept from the previous file and marked as such, as long as their
test still exists.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault import history, procs

REPO_ROOT = Path(__file__).resolve().parents[2]
FAULTS_MD = REPO_ROOT / "FAULTS.md"

# Set at import (collection), before any scenario runs; children inherit it but never record.
_fd, _RESULTS = tempfile.mkstemp(prefix="lakemq-fault-", suffix=".jsonl")
os.close(_fd)
os.environ[history.RESULTS_ENV] = _RESULTS


# Every test id collected this session, selected or deselected: tells stale report rows apart.
_COLLECTED: set[str] = set()


def pytest_deselected(items: list[pytest.Item]) -> None:
    _COLLECTED.update(item.nodeid for item in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    _COLLECTED.update(item.nodeid for item in session.items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    rows = history.load_results(_RESULTS)
    if rows:
        history.write_faults(FAULTS_MD, rows, REPO_ROOT, _COLLECTED)
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(  # type: ignore[union-attr]
            f"fault suite: {len(rows)} scenario(s) recorded in {FAULTS_MD}"
        )
    Path(_RESULTS).unlink(missing_ok=True)


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
