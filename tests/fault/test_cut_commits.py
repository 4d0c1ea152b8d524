"""A commit file cut exactly at a line break: it still parses, so it used to pass as whole.

A power loss before the page cache reached the disk can leave a commit file holding only its first
lines. Every line parses, and delta-rs reads what is left as a commit with fewer actions: a
commit-log version without its data file would be read as "no messages", and the dispatch job
would skip the messages of an acknowledged send. The engine knows how many actions each commit
holds (delta-rs's ``operationMetrics`` count the files a write adds, the engine's ``mq.counts``
the app transactions and ready actions) and its readers of a version raise
:class:`CommitTruncatedError` when lines are missing. Opening the store treats a cut last commit as
a torn one (quarantined, its version free again) and a cut earlier one as damage naming the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import CommitTruncatedError, Store, StoreCorruptedError
from engine.broker.dispatch import dispatch_pending
from engine.store import schemas
from engine.store.delta.log import read_version
from engine.store.delta.repair import QUARANTINE_DIR, repair_log
from tests.fault.test_log_damage import Scenario, scenario

pytestmark = pytest.mark.fault
__all__ = ["scenario"]


def cut_at_line_break(path: Path, keep: int = 1) -> bytes:
    """Keep only the first ``keep`` lines of a commit file (with their line breaks); returns what
    it held."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    assert len(lines) > keep + 1 or (len(lines) > keep and lines[-1]), "nothing to cut"
    path.write_bytes(b"\n".join(lines[:keep]) + b"\n")
    return data


def test_a_commit_cut_at_a_line_break_stops_its_readers_with_a_typed_error(scenario: Scenario) -> None:
    s = scenario.named("commit_log entry cut at a line break (parses): readers stop with a typed error")
    s.send_and_dispatch(2)
    s.send_each(4)
    cut_version = s.store.version(schemas.COMMIT_LOG) - 2
    path = s.commit_file(schemas.COMMIT_LOG, cut_version)
    whole = cut_at_line_break(path)  # the commitInfo survives, the data file's add is gone
    with pytest.raises(CommitTruncatedError) as caught:
        read_version(s.store.uri(schemas.COMMIT_LOG), cut_version)
    assert caught.value.path.endswith(path.name)  # type: ignore[attr-defined]
    assert "add: 0 of 1" in str(caught.value)
    with pytest.raises(CommitTruncatedError):
        dispatch_pending(s.store)  # the running dispatcher: it would otherwise skip the messages
    s.reopen()  # a new process: an earlier commit is not looked at when opening ...
    with pytest.raises(CommitTruncatedError):
        dispatch_pending(s.store)  # ... but no reader of it goes on as if its messages did not exist
    with pytest.raises(StoreCorruptedError, match=path.name):  # nor is it repaired as a torn last one
        repair_log(s.store.uri(schemas.COMMIT_LOG))

    path.write_bytes(whole)  # the operator restores the file from a backup and restarts
    s.reopen()
    assert dispatch_pending(s.store) == 4
    s.consume_all()
    s.check_and_record(dispatched=True, consumed=True, typed_error=type(caught.value).__name__)


def test_a_last_commit_cut_at_a_line_break_is_quarantined_at_open_and_its_version_reused(
    scenario: Scenario,
) -> None:
    s = scenario.named("last commit_log entry cut at a line break (unacknowledged), quarantined at open")
    s.send_and_dispatch(4)
    unacknowledged = s.send(1, acknowledge=False)
    last = s.store.version(schemas.COMMIT_LOG)
    path = s.commit_file(schemas.COMMIT_LOG, last)
    cut_at_line_break(path)

    s.reopen()
    assert s.store.version(schemas.COMMIT_LOG) == last - 1
    following = s.send(1)
    assert following.queue_offset == unacknowledged.queue_offset  # no gap where the cut one was
    s.send_and_dispatch(2)
    s.consume_all()
    quarantined = list((s.log_dir(schemas.COMMIT_LOG) / QUARANTINE_DIR).iterdir())
    s.check_and_record(dispatched=True, consumed=True, quarantined=len(quarantined))
    assert [p.name.split(".json")[0] for p in quarantined] == [path.stem]


def test_a_commit_missing_its_app_transaction_line_is_caught_by_the_engines_count(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "mqdata")
    version = store.append(
        schemas.CONSUMER_OFFSET,
        store.read(schemas.CONSUMER_OFFSET),  # no rows: a commit of its app transaction only
        app_id="mq.test",
        app_version=3,
    )
    path = Path(store.uri(schemas.CONSUMER_OFFSET)) / "_delta_log" / f"{version:020d}.json"
    lines = [line for line in path.read_bytes().split(b"\n") if line]
    assert any(b'"txn"' in line for line in lines)
    path.write_bytes(b"\n".join(line for line in lines if b'"txn"' not in line) + b"\n")
    with pytest.raises(CommitTruncatedError, match="txn: 0 of 1"):
        read_version(store.uri(schemas.CONSUMER_OFFSET), version)
