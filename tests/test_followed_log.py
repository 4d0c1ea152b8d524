"""Decisions committed directly on a local action log (engine.store.delta.followed_log): the app
transaction lands with the rows as Delta readers see it, a decision loses to one about the same app
id and lands after one about another, commits through delta-rs interleave, a table change ends the
following, checkpoints keep the app transactions, and the consumers' lease decisions take this path
on local stores (delta-rs's with MQ_DIRECT_APPEND=0)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from engine import Admin, CommitConflictError, Message, Producer, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.store import schemas
from engine.store.action_log import ActionLogWriter, reset_leases
from engine.store.commit_markers import lease_app
from engine.store.delta import FollowedLog, follow_log, open_snapshot


def _log(store: Store) -> FollowedLog:
    log = follow_log(
        store.snapshot(schemas.ACTION_LOG),
        schemas.ACTION_LOG_SCHEMA,
        lambda version: store.snapshot(schemas.ACTION_LOG, version),
    )
    assert log is not None
    return log


def _rows(store: Store, note: str, n: int = 1) -> pa.Table:
    writer = ActionLogWriter(store, "G", note)
    rows = [writer.row("ACK", "T", 0, i, ts=1, sequence=i) for i in range(n)]
    return pa.Table.from_pylist(rows, schema=schemas.ACTION_LOG_SCHEMA)


def _commit_lines(store: Store, version: int) -> list[dict]:
    path = Path(store.uri(schemas.ACTION_LOG)) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_decision_lands_at_the_next_version_with_its_app_transaction_as_delta_readers_see_it(
    store: Store,
) -> None:
    log = _log(store)
    base = log.version
    version = log.commit(_rows(store, "c1", 3), "app-a", 41)
    assert version == base + 1 == log.version
    assert log.app_version("app-a") == 41
    uri = store.uri(schemas.ACTION_LOG)
    assert open_snapshot(uri).app_version("app-a") == 41  # delta-rs reads the txn action
    table = DeltaTable(uri)
    assert table.version() == version
    assert table.transaction_version("app-a") == 41
    assert sorted(
        table.to_pyarrow_table()
        .filter(pa.compute.equal(table.to_pyarrow_table()["consumer_id"], "c1"))["queue_offset"]
        .to_pylist()
    ) == [0, 1, 2]
    kinds = [next(iter(line)) for line in _commit_lines(store, version)]
    assert kinds == ["commitInfo", "txn", "add"]
    info = _commit_lines(store, version)[0]["commitInfo"]
    assert info["engineInfo"] == "lakemq" and json.loads(info["mq.counts"]) == {"txn": 1, "add": 1}


def test_a_decision_loses_to_one_about_the_same_app_and_lands_after_one_about_another(store: Store) -> None:
    first, second = _log(store), _log(store)
    base = first.version
    assert first.commit(_rows(store, "first"), "queue-1", 10) == base + 1
    # second decided as of base: a commit about another queue landed meanwhile, so it goes on top
    assert second.commit(_rows(store, "second"), "queue-2", 20) == base + 2
    assert second.app_version("queue-1") == 10  # and it read the one it went past
    # first is still at base + 1; second's commit (about queue-2) landed after it decided
    with pytest.raises(CommitConflictError, match="queue-2"):
        first.commit(_rows(store, "first-again"), "queue-2", 30)
    assert store.version(schemas.ACTION_LOG) == base + 2  # the loser committed nothing
    assert first.version == base + 2 and first.app_version("queue-2") == 20  # read what won
    assert first.commit(_rows(store, "first-again"), "queue-2", 30) == base + 3  # decided again


def test_a_delta_rs_commit_of_the_same_app_makes_a_direct_decision_lose_and_the_other_way_round(
    store: Store,
) -> None:
    Admin(store).create_topic("T", 1)
    log = _log(store)
    app = lease_app("G", "T", 0)
    assert log.commit(_rows(store, "c"), app, 5) is not None
    stale = _log(store)  # decides as of now
    assert reset_leases(store, "G", "T", {0: 2}) == 1  # an administrator's reset, through delta-rs
    with pytest.raises(CommitConflictError):
        stale.commit(_rows(store, "c"), app, 9)
    assert stale.app_version(app) == 2
    # delta-rs's conflict check sees the direct commits' txn actions the same way
    snapshot = store.snapshot(schemas.ACTION_LOG)
    assert stale.commit(_rows(store, "c"), app, 7) is not None
    with pytest.raises(CommitConflictError):
        store.append(schemas.ACTION_LOG, _rows(store, "admin"), app_id=app, app_version=8, snapshot=snapshot)
    assert open_snapshot(store.uri(schemas.ACTION_LOG)).app_version(app) == 7


def test_a_change_of_the_table_ends_the_following_and_nothing_is_committed(store: Store) -> None:
    log = _log(store)
    store.snapshot(schemas.ACTION_LOG).set_properties({"delta.logRetentionDuration": "interval 2 days"})
    latest = store.version(schemas.ACTION_LOG)
    assert log.follow() is None
    fresh = _log(store)
    assert fresh.commit(_rows(store, "c"), "a", 1) == latest + 1
    stale = FollowedLog(
        open_snapshot(store.uri(schemas.ACTION_LOG), version=latest - 1), fresh._appender, store.snapshot
    )
    assert stale.commit(_rows(store, "c"), "b", 1) is None  # met the metadata commit: made anew
    assert store.version(schemas.ACTION_LOG) == latest + 1


def test_checkpoints_at_the_interval_keep_every_app_transaction(store: Store) -> None:
    log = _log(store)
    interval = int(store.snapshot(schemas.ACTION_LOG).configuration()["delta.checkpointInterval"])
    apps = {}
    while log.version < 2 * interval + 1:
        app = f"app-{log.version % 3}"
        apps[app] = log.version
        log.commit(_rows(store, "c"), app, log.version)
    meta = json.loads((Path(store.uri(schemas.ACTION_LOG)) / "_delta_log" / "_last_checkpoint").read_text())
    assert meta["version"] == 2 * interval
    reopened = _log(store)
    for app, version in apps.items():
        assert reopened.app_version(app) == version
        assert DeltaTable(store.uri(schemas.ACTION_LOG)).transaction_version(app) == version


def test_racing_writers_decide_every_step_of_one_app_once(store: Store) -> None:
    """Four writers each move one app's version on by one from what they read, 15 times: each step
    is decided exactly once (a decision on a stale read loses and is made again)."""
    app, steps, writers = "counter", 15, 4
    decided: list[int] = []
    errors: list[BaseException] = []

    def work(name: str) -> None:
        log = _log(store)
        try:
            for _ in range(steps):
                while True:
                    log.follow()
                    value = log.app_version(app) + 1
                    try:
                        log.commit(_rows(store, name), app, value)
                    except CommitConflictError:
                        continue
                    decided.append(value)
                    break
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(decided) == list(range(steps * writers))
    assert open_snapshot(store.uri(schemas.ACTION_LOG)).app_version(app) == steps * writers - 1


@pytest.mark.parametrize("direct", ["1", "0"])
def test_lease_decisions_are_direct_on_a_local_store_and_through_delta_rs_when_asked(
    store: Store, monkeypatch: pytest.MonkeyPatch, direct: str
) -> None:
    monkeypatch.setenv("MQ_DIRECT_APPEND", direct)
    Admin(store).create_topic("T", 2)
    with Producer(store, "P") as producer:
        producer.send_batch([Message("T", f"m{i}".encode()) for i in range(20)])
    dispatch_pending(store)
    got = []
    with SimpleConsumer(store, "G", "c") as consumer:
        consumer.subscribe("T")
        while batch := consumer.receive(max_nums=8, invisible_ms=30_000):
            for message in batch:
                consumer.ack(message)
            got += batch
    assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(20))
    latest = store.version(schemas.ACTION_LOG)
    engines = set()
    for version in range(1, latest + 1):
        lines = _commit_lines(store, version)
        if any("txn" in line for line in lines):
            engines.add(lines[0]["commitInfo"].get("engineInfo", "").split("/")[0].split("-")[0])
    assert engines == ({"lakemq"} if direct == "1" else {"delta"}), engines
