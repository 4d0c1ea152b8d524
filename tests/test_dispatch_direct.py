"""Dispatch commits to the consume queue without delta-rs (engine.broker.dispatch): what it writes is
what Delta readers expect, it follows other writers of the table, and it never commits behind the
log; on a local store and on S3."""

from __future__ import annotations

import json
from typing import Any

import pytest
from deltalake import DeltaTable

import engine.broker.dispatch as dispatch_module
from engine import Admin, Message, Producer, PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.model import SysFlag
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.stamping import PendingMessage
from engine.store.commit_markers import COUNTS_KEY, CQ_KEY, DISPATCH_APP
from engine.store.consume_queue import dispatched_version, queue_marks
from engine.store.delta import delete_object, get_object, object_exists, open_snapshot


@pytest.fixture
def store(any_store: Store) -> Store:
    Admin(any_store).create_topic("T", 4)
    return any_store


@pytest.fixture
def topic() -> str:
    return "T"


def _log_object(store: Store, name: str) -> bytes | None:
    return get_object(store.uri(schemas.CONSUME_QUEUE), f"_delta_log/{name}", store.storage_options)


def _commit(store: Store, version: int) -> list[dict[str, Any]]:
    text = _log_object(store, f"{version:020d}.json")
    assert text is not None
    return [json.loads(line) for line in text.decode().splitlines()]


def _table(store: Store) -> DeltaTable:
    return DeltaTable(store.uri(schemas.CONSUME_QUEUE), storage_options=store.storage_options)


def _fresh(store: Store) -> Any:
    """The consume queue opened anew by delta-rs."""
    return open_snapshot(store.uri(schemas.CONSUME_QUEUE), store.storage_options, name=schemas.CONSUME_QUEUE)


def _again(store: Store) -> Store:
    """The store opened again, as another process would."""
    return Store.open(store.root, storage_options=store.storage_options)


def _send(store: Store, topic: str, bodies: list[bytes], queue_id: int = 0) -> None:
    with Producer(store) as producer:
        for body in bodies:
            producer.send(Message(topic, body), queue_id=queue_id)


def _entries(store: Store, topic: str) -> list[tuple[int, int]]:
    rows = _table(store).to_pyarrow_table().to_pylist()
    return sorted((r["queue_id"], r["queue_offset"]) for r in rows if r["topic"] == topic)


def test_a_dispatch_commit_is_put_directly_and_delta_rs_reads_its_entries_coverage_and_marks(
    store: Store, topic: str
) -> None:
    _send(store, topic, [b"a", b"b", b"c"])
    assert dispatch_pending(store) == 3
    version = _table(store).version()
    actions = _commit(store, version)
    info = actions[0]["commitInfo"]
    assert isinstance(info, dict) and info["engineInfo"] == "lakemq"  # not delta-rs's writer
    [txn] = [a["txn"] for a in actions if "txn" in a]
    assert isinstance(txn, dict) and (txn["appId"], txn["version"]) == (
        DISPATCH_APP,
        store.version(schemas.COMMIT_LOG),
    )
    assert sum("add" in a for a in actions) == 1
    # A reader that opens the table anew (delta-rs, its own log replay) sees what dispatch recorded.
    fresh = _fresh(store)
    assert fresh.app_version(DISPATCH_APP) == store.version(schemas.COMMIT_LOG)
    assert queue_marks(fresh).max_offset(topic, 0) == 3
    assert _entries(store, topic) == [(0, 0), (0, 1), (0, 2)]
    assert [m.body for m in PullConsumer(_again(store), "G").pull(topic, 0, 0).messages] == [
        b"a",
        b"b",
        b"c",
    ]


def test_versions_without_entries_move_the_coverage_in_a_commit_of_no_file(store: Store, topic: str) -> None:
    _send(store, topic, [b"a"])
    dispatch_pending(store)
    CommitLogWriter(store).append(
        [PendingMessage(topic, 0, b"half", "U-HALF", sys_flag=int(SysFlag.PREPARED))]
    )
    assert dispatch_pending(store) == 0
    version = _table(store).version()
    actions = _commit(store, version)
    assert not any("add" in a for a in actions)
    info = actions[0]["commitInfo"]
    assert isinstance(info, dict) and json.loads(info[COUNTS_KEY]) == {"txn": 1, "add": 0}
    assert dispatched_version(_again(store)) == store.version(schemas.COMMIT_LOG)
    assert json.loads(info[CQ_KEY])["q"][topic][0] == 1  # the marks are carried on
    assert _entries(store, topic) == [(0, 0)]


def test_a_commit_of_another_dispatcher_is_followed_and_its_entries_kept(store: Store, topic: str) -> None:
    other = _again(store)  # another process's dispatcher: its own kept state
    _send(store, topic, [b"a"])
    assert dispatch_pending(store) == 1
    _send(store, topic, [b"b", b"c"])
    assert dispatch_pending(other) == 2
    _send(store, topic, [b"d"])
    assert dispatch_pending(store) == 1  # after the other's commit, not over it
    assert dispatch_pending(other) == 0
    assert _entries(store, topic) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    fresh = _fresh(store)
    assert queue_marks(fresh).max_offset(topic, 0) == 4


def test_direct_and_delta_rs_dispatch_commits_interleave(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = _again(store)
    _send(store, topic, [b"a"])
    dispatch_pending(store)
    monkeypatch.setenv("MQ_DIRECT_APPEND", "0")
    _send(store, topic, [b"b"])
    assert dispatch_pending(other) == 1
    through_delta_rs = _commit(store, _table(store).version())[0]["commitInfo"]
    assert isinstance(through_delta_rs, dict) and through_delta_rs.get("engineInfo") != "lakemq"
    monkeypatch.delenv("MQ_DIRECT_APPEND")
    _send(store, topic, [b"c"])
    assert dispatch_pending(store) == 1
    assert _entries(store, topic) == [(0, 0), (0, 1), (0, 2)]


def test_the_dispatcher_checkpoints_the_consume_queue_at_its_interval(store: Store, topic: str) -> None:
    for i in range(22):
        _send(store, topic, [b"%d" % i])
        dispatch_pending(store)
    for version in (10, 20):  # each on a snapshot opened at its version, the second too
        assert object_exists(
            store.uri(schemas.CONSUME_QUEUE),
            f"_delta_log/{version:020d}.checkpoint.parquet",
            store.storage_options,
        )
    last = _log_object(store, "_last_checkpoint")
    assert last is not None and json.loads(last)["version"] == 20
    fresh = _fresh(store)
    assert fresh.app_version(DISPATCH_APP) == store.version(schemas.COMMIT_LOG)
    assert len(_entries(store, topic)) == 22
    at_20 = open_snapshot(store.uri(schemas.CONSUME_QUEUE), store.storage_options, 20)  # from its checkpoint
    assert at_20.dataset().count_rows() == 20  # version 0 made the table, each later one added an entry


def test_an_idle_dispatcher_whose_next_commit_was_cleaned_up_does_not_commit_behind_the_log(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = _again(store)
    _send(store, topic, [b"first"])
    dispatch_pending(store)  # the idle dispatcher's last commit: version 1 (0 made the table)
    for i in range(11):
        _send(store, topic, [b"%d" % i])
        dispatch_pending(busy)  # versions 2..12, a checkpoint at 10
    last = _log_object(store, "_last_checkpoint")
    assert last is not None and json.loads(last)["version"] == 10
    for v in range(2, 10):  # what log cleanup removes once they are past the log retention
        delete_object(store.uri(schemas.CONSUME_QUEUE), f"_delta_log/{v:020d}.json", store.storage_options)
    monkeypatch.setattr(dispatch_module, "STALE_LOOK_S", 0.0)  # the idle one's last look is old now
    _send(store, topic, [b"late"])
    assert dispatch_pending(store) == 1
    assert _table(store).version() == 13
    assert _log_object(store, f"{2:020d}.json") is None  # not put where the log had passed
    assert _entries(store, topic) == [(0, o) for o in range(13)]
