"""Each table's Delta log is kept ``log_retention_minutes`` behind its newest checkpoint, no longer."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from engine import Admin, Message, Producer, Store
from engine.broker.maintenance import checkpoint
from engine.config import load_config
from engine.errors import ConfigError
from engine.store import schemas
from engine.store.maintenance import apply_log_retention
from engine.store.table_properties import LOG_RETENTION_KEY
from tests.helpers import versions


def _log_jsons(store: Store, table: str) -> list[str]:
    return sorted(p.name for p in (Path(store.uri(table)) / "_delta_log").glob("*.json"))


def test_every_new_table_gets_the_configured_log_retention(tmp_path: Path):
    store = Store.open(str(tmp_path / "s"), config=load_config(log_retention_minutes=90))
    for table in schemas.SCHEMAS:
        assert store.snapshot(table).configuration()[LOG_RETENTION_KEY] == "interval 90 minutes", table


def test_the_default_retention_is_seven_days(store: Store):
    assert store.config.log_retention_minutes == 7 * 24 * 60
    assert store.snapshot(schemas.COMMIT_LOG).configuration()[LOG_RETENTION_KEY] == "interval 10080 minutes"


def test_maintenance_applies_a_changed_setting_once_and_opening_never_does(store: Store):
    shorter = Store.open(store.root, config=store.config.replace(log_retention_minutes=5))
    before = versions(store)
    assert versions(shorter) == before  # opening with another setting writes nothing
    assert apply_log_retention(shorter, schemas.COMMIT_LOG) is True
    assert store.version(schemas.COMMIT_LOG) == before[schemas.COMMIT_LOG] + 1
    assert store.snapshot(schemas.COMMIT_LOG).configuration()[LOG_RETENTION_KEY] == "interval 5 minutes"
    assert apply_log_retention(shorter, schemas.COMMIT_LOG) is False  # already so: no commit
    checkpoint(shorter)
    after = versions(store)
    assert all(after[t] == before[t] + 1 for t in schemas.SCHEMAS), (before, after)
    checkpoint(shorter)
    assert versions(store) == after


def test_log_files_older_than_the_retention_go_at_the_next_checkpoint(tmp_path: Path):
    store = Store.open(str(tmp_path / "s"), config=load_config(log_retention_minutes=10))
    Admin(store).create_topic("T", 1)
    with Producer(store) as producer:
        for i in range(5):
            producer.send(Message("T", f"m{i}".encode()))
    aged = time.time() - 11 * 60
    for name in _log_jsons(store, schemas.COMMIT_LOG):
        os.utime(Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log" / name, (aged, aged))
    with Producer(store) as producer:
        producer.send(Message("T", b"fresh"))
    newest = store.version(schemas.COMMIT_LOG)
    checkpoint(store, schemas.COMMIT_LOG)
    assert _log_jsons(store, schemas.COMMIT_LOG) == [f"{newest:020d}.json"]
    bodies = sorted(store.read(schemas.COMMIT_LOG).column("body").to_pylist())
    assert bodies == [b"fresh", b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_young_log_files_stay_whatever_the_checkpoints(tmp_path: Path):
    store = Store.open(str(tmp_path / "s"), config=load_config(log_retention_minutes=10))
    Admin(store).create_topic("T", 1)
    with Producer(store) as producer:
        for i in range(3):
            producer.send(Message("T", f"m{i}".encode()))
    kept = _log_jsons(store, schemas.COMMIT_LOG)
    checkpoint(store, schemas.COMMIT_LOG)
    assert _log_jsons(store, schemas.COMMIT_LOG) == kept


@pytest.mark.parametrize("bad", [0, -1])
def test_a_log_retention_that_is_not_positive_is_refused(bad: int):
    with pytest.raises(ConfigError, match="log_retention_minutes"):
        load_config(log_retention_minutes=bad)


def test_a_handles_properties_follow_its_version(store: Store):
    # read once per version of the handle: a change through the handle itself, and one by another
    # handle the first one catches up with, are both seen
    mine = store.snapshot(schemas.COMMIT_LOG)
    assert mine.configuration()[LOG_RETENTION_KEY] == "interval 10080 minutes"
    mine.set_properties({LOG_RETENTION_KEY: "interval 60 minutes"})
    assert mine.configuration()[LOG_RETENTION_KEY] == "interval 60 minutes"
    store.snapshot(schemas.COMMIT_LOG).set_properties({"delta.checkpointInterval": "7"})
    assert mine.configuration().get("delta.checkpointInterval") != "7"  # not caught up yet
    assert mine.refresh().configuration()["delta.checkpointInterval"] == "7"
    assert mine.configuration()[LOG_RETENTION_KEY] == "interval 60 minutes"
