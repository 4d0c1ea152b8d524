"""Fault suite plumbing: one results file per test run, turned into FAULTS.md at the end.

Every scenario calls :func:`tests.fault.history.record` once; when at least one did during this run,
``FAULTS.md`` at the repository root is regenerated from these rows. Rows of scenarios whose tests did
not run this time are kept from the previous file and marked as such, as long as their test still
exists.

A pytest plugin of the root conftest, so that it also runs in the controller of a run spread over
pytest-xdist workers: the controller (or the only process of a plain run) makes the results file and
the file of collected test ids before any worker starts, and writes FAULTS.md once every worker is
done; workers (which inherit both paths through the environment) append to them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.fault import history

REPO_ROOT = Path(__file__).resolve().parents[2]
FAULTS_MD = REPO_ROOT / "FAULTS.md"
# Every test id collected this run, selected or deselected (one a line): tells stale report rows apart.
COLLECTED_ENV = "MQ_FAULT_COLLECTED"


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_worker(config):
        return
    for env, suffix in ((history.RESULTS_ENV, ".jsonl"), (COLLECTED_ENV, ".ids")):
        fd, path = tempfile.mkstemp(prefix="lakemq-fault-", suffix=suffix)
        os.close(fd)
        os.environ[env] = path  # children and xdist workers inherit it; they never write FAULTS.md


def _note_collected(ids: list[str]) -> None:
    path = os.environ.get(COLLECTED_ENV)
    if path and ids:
        with open(path, "a", encoding="utf-8") as out:
            out.write("".join(f"{i}\n" for i in ids))


def pytest_deselected(items: list[pytest.Item]) -> None:
    _note_collected([item.nodeid for item in items])


def pytest_collection_finish(session: pytest.Session) -> None:
    _note_collected([item.nodeid for item in session.items])


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _is_worker(session.config):
        return
    results, collected = os.environ.get(history.RESULTS_ENV), os.environ.get(COLLECTED_ENV)
    if not results or not collected:
        return
    rows = history.load_results(results)
    if rows:
        ids = set(Path(collected).read_text(encoding="utf-8").split())
        history.write_faults(FAULTS_MD, rows, REPO_ROOT, ids)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"fault suite: {len(rows)} scenario(s) recorded in {FAULTS_MD}")
    for path in (results, collected):
        Path(path).unlink(missing_ok=True)
