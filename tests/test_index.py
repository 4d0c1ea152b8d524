"""The message index (engine/broker/index.py, jobs/index.py) and the queries it serves
(Admin.view_message, query_by_key, query_by_uniq_key)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from engine import (
    Admin,
    InvalidArgumentError,
    InvalidTopicError,
    Message,
    MessageNotFoundError,
    MQError,
    Producer,
    SendResult,
    Store,
    StoreError,
    SysFlag,
    TopicNotFoundError,
)
from engine.broker.index import Indexer, build_index, index_pending
from engine.spark.jobs.index import IndexStats, run_index
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.stamping import PendingMessage
from engine.store.commit_markers import INDEX_APP
from engine.store.delta import RENEW_HANDLE_COMMITS
from engine.store.delta.direct_append import DIRECT_ENV, ENGINE_INFO
from engine.store.delta.file_reader import FileReader
from engine.store.delta.log import table_filesystem
from engine.store.index import KIND_KEY, KIND_UNIQ_KEY, indexed_version

FAR_FUTURE = 2**62


def _commit_file(store: Store, version: int) -> Path:
    return Path(store.uri(schemas.INDEX)) / "_delta_log" / f"{version:020d}.json"


def _send(store: Store, topic: str, bodies_keys: list[tuple[bytes, tuple[str, ...]]]) -> list[SendResult]:
    with Producer(store) as p:
        return [p.send(Message(topic, body, keys=keys)) for body, keys in bodies_keys]


def _index_rows(store: Store) -> list[tuple[Any, ...]]:
    rows = store.read(schemas.INDEX).to_pylist()
    return sorted((r["topic"], r["kind"], r["key"], r["physical_offset"], r["log_version"]) for r in rows)


# ----------------------------------------------------------------------------- building
def test_every_key_and_uniq_key_is_indexed_once_and_a_second_pass_adds_nothing(
    store: Store, topic: str
) -> None:
    sent = _send(store, topic, [(b"a", ("order-1", "user-7")), (b"b", ("order-2", "order-2")), (b"c", ())])
    added = index_pending(store)
    rows = _index_rows(store)
    expected = {
        (topic, KIND_KEY, "order-1", sent[0].physical_offset),
        (topic, KIND_KEY, "user-7", sent[0].physical_offset),
        (topic, KIND_KEY, "order-2", sent[1].physical_offset),  # a key listed twice: indexed once
        *((topic, KIND_UNIQ_KEY, s.uniq_key, s.physical_offset) for s in sent),
    }
    assert {r[:4] for r in rows} == expected
    assert added == len(rows) == 6
    assert indexed_version(store) == store.version(schemas.COMMIT_LOG)

    version = store.version(schemas.INDEX)
    assert index_pending(store) == 0
    assert store.version(schemas.INDEX) == version
    assert _index_rows(store) == rows


def test_replayed_rows_are_not_indexed_twice(store: Store, topic: str) -> None:
    from engine.broker.index import unindexed_rows

    _send(store, topic, [(b"a", ("k",)), (b"b", ("k",))])
    rows = unindexed_rows(store, 0, store.version(schemas.COMMIT_LOG))
    assert build_index(store, rows) == 4
    assert build_index(store, rows) == 0  # the same micro-batch again
    assert build_index(store, rows.slice(0, 1)) == 0  # a part of it
    assert store.read(schemas.INDEX).num_rows == 4
    assert store.app_version(schemas.INDEX, INDEX_APP) == store.version(schemas.COMMIT_LOG)


@pytest.fixture
def indexed_once(any_store: Store) -> tuple[Store, str, Indexer]:
    """A store of either kind with topic ``T``, one message sent with key ``k1``, and an
    :class:`Indexer` that has indexed it (its snapshot kept)."""
    Admin(any_store).create_topic("T", 2)
    indexer = Indexer(any_store)
    _send(any_store, "T", [(b"a", ("k1",))])
    assert indexer() == 2
    assert _view(indexer) is not None
    return any_store, "T", indexer


def _view(indexer: Indexer) -> object:
    """What an indexer keeps of the index between passes: its followed log on a local store (direct
    commits), its own snapshot elsewhere."""
    return indexer._log if indexer._log is not None else indexer._snapshot


def test_the_loops_indexer_keeps_its_snapshot_and_follows_another_indexer(
    indexed_once: tuple[Store, str, Indexer], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, topic, indexer = indexed_once
    opened = []
    real_snapshot = store.snapshot
    monkeypatch.setattr(store, "snapshot", lambda *a, **k: opened.append(a) or real_snapshot(*a, **k))
    _send(store, topic, [(b"b", ("k2",))])
    assert indexer() == 2
    assert index_pending(store) == 0  # (another indexer, which opens its own)
    _send(store, topic, [(b"c", ("k3",))])
    assert index_pending(store) == 2  # another indexer indexes the newest message first
    _send(store, topic, [(b"d", ("k4",))])
    opened.clear()
    assert indexer() == 2  # follows it: the newest one only, and without opening the index again
    assert opened == []
    rows = _index_rows(store)
    assert sorted(r[2] for r in rows if r[1] == KIND_KEY) == ["k1", "k2", "k3", "k4"]
    assert len(rows) == 8
    assert indexed_version(store) == store.version(schemas.COMMIT_LOG)


def test_the_indexer_opens_its_snapshot_anew_once_it_has_aged(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DIRECT_ENV, "0")  # commits through delta-rs, on the indexer's own snapshot
    indexer = Indexer(store)
    _send(store, topic, [(b"a", ("k0",))])
    indexer()
    first = indexer._snapshot
    assert first is not None
    for i in range(1, RENEW_HANDLE_COMMITS + 2):
        _send(store, topic, [(b"m", (f"k{i}",))])
        indexer()
        if indexer._snapshot is not first:
            break
    assert indexer._snapshot is not first, "a handle that moved on by its renewal bound is reopened"
    assert first.moved_since_open > 0 and first.aged
    assert len(_index_rows(store)) == 2 * (i + 1)


def test_a_failed_pass_of_the_indexer_forgets_its_snapshot(
    indexed_once: tuple[Store, str, Indexer], monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.broker.index as index_module

    store, topic, indexer = indexed_once
    kept = _view(indexer)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise StoreError("disk gone")

    monkeypatch.setattr(index_module, "commit_index", fail)
    monkeypatch.setattr(index_module, "commit_index_directly", fail)
    _send(store, topic, [(b"b", ("k2",))])
    with pytest.raises(StoreError):
        indexer()
    assert indexer._snapshot is None and indexer._log is None
    monkeypatch.undo()
    assert indexer() == 2  # a new view of the index, and the pass goes on
    assert _view(indexer) is not kept
    assert len(_index_rows(store)) == 4


def test_on_a_local_store_the_indexer_commits_directly_a_file_per_kind_with_its_covered_version(
    store: Store, topic: str
) -> None:
    indexer = Indexer(store)
    sent = _send(store, topic, [(b"a", ("k1", "k2")), (b"b", ())])
    assert indexer() == 4
    assert indexer._log is not None and indexer._snapshot is None  # no delta-rs handle kept
    version = store.version(schemas.INDEX)
    actions = [json.loads(line) for line in _commit_file(store, version).read_text().splitlines()]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["engineInfo"] == ENGINE_INFO
    adds = [a["add"] for a in actions if "add" in a]
    assert sorted(json.loads(a["stats"])["minValues"]["kind"] for a in adds) == [KIND_KEY, KIND_UNIQ_KEY]
    (txn,) = [a["txn"] for a in actions if "txn" in a]
    assert (txn["appId"], txn["version"]) == (INDEX_APP, store.version(schemas.COMMIT_LOG))
    assert indexed_version(store) == store.version(schemas.COMMIT_LOG)  # as delta-rs reads it
    assert sorted(r[2] for r in _index_rows(store)) == sorted(["k1", "k2", sent[0].msg_id, sent[1].msg_id])
    assert index_pending(store) == 0 and store.version(schemas.INDEX) == version  # nothing left to index


@pytest.mark.parametrize("other", ["direct", "delta-rs"])
def test_a_direct_indexer_that_another_indexer_overtook_adds_nothing_twice(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    import engine.broker.index as index_module
    from engine.broker.index import unindexed_rows

    def another_indexer() -> int:
        if other == "direct":
            return index_pending(store)  # another loop's indexer
        # the Spark index job's commit, through delta-rs
        return build_index(store, unindexed_rows(store, 0, store.version(schemas.COMMIT_LOG)))

    indexer = Indexer(store)
    _send(store, topic, [(b"a", ("k1",))])
    assert indexer() == 2
    real = index_module.commit_index_directly
    overtaken: list[int] = []

    def overtaken_first(*args: Any, **kwargs: Any) -> int | None:
        if not overtaken:
            overtaken.append(-1)
            overtaken[0] = another_indexer()  # it commits between this indexer's plan and commit
        return real(*args, **kwargs)

    monkeypatch.setattr(index_module, "commit_index_directly", overtaken_first)
    _send(store, topic, [(b"b", ("k2",)), (b"c", ("k3",))])
    assert indexer() == 0 and overtaken == [4]  # the race is lost, the plan made again: all indexed
    _send(store, topic, [(b"d", ("k4",))])
    assert indexer() == 2  # and it goes on directly
    rows = _index_rows(store)
    assert sorted(r[2] for r in rows if r[1] == KIND_KEY) == ["k1", "k2", "k3", "k4"]
    assert len(rows) == 8
    assert indexed_version(store) == store.version(schemas.COMMIT_LOG)


def test_a_direct_indexer_follows_the_index_anew_after_a_change_of_its_metadata(
    store: Store, topic: str
) -> None:
    from deltalake import DeltaTable

    indexer = Indexer(store)
    _send(store, topic, [(b"a", ("k1",))])
    assert indexer() == 2
    followed = indexer._log
    DeltaTable(store.uri(schemas.INDEX)).alter.set_table_properties({"delta.checkpointInterval": "5"})
    _send(store, topic, [(b"b", ("k2",))])
    assert indexer() == 2
    assert indexer._log is not None and indexer._log is not followed  # a log it could not follow further
    assert sorted(r[2] for r in _index_rows(store) if r[1] == KIND_KEY) == ["k1", "k2"]
    assert indexed_version(store) == store.version(schemas.COMMIT_LOG)


def test_transaction_halves_and_rollbacks_are_not_indexed(store: Store, topic: str) -> None:
    writer = CommitLogWriter(store)
    writer.append(
        [
            PendingMessage(topic, 0, b"half", "U-HALF", keys=("k",), sys_flag=int(SysFlag.PREPARED)),
            PendingMessage(topic, 0, b"rb", "U-RB", keys=("k",), sys_flag=int(SysFlag.ROLLBACK)),
            PendingMessage(topic, 0, b"ok", "U-OK", keys=("k",), sys_flag=int(SysFlag.COMMIT)),
        ]
    )
    index_pending(store)
    assert {(r[1], r[2]) for r in _index_rows(store)} == {(KIND_KEY, "k"), (KIND_UNIQ_KEY, "U-OK")}


def test_each_commit_writes_one_key_sorted_file_per_kind_with_statistics(store: Store, topic: str) -> None:
    _send(store, topic, [(f"m{i}".encode(), (f"key-{9 - i}",)) for i in range(10)])
    index_pending(store)
    actions = store.snapshot(schemas.INDEX).add_actions().to_pylist()
    fs = table_filesystem(store.uri(schemas.INDEX))
    kinds = []
    for action in actions:
        rows = pq.read_table(action["path"], filesystem=fs)
        [kind] = set(rows["kind"].to_pylist())
        kinds.append(kind)
        keys = rows["key"].to_pylist()
        assert keys == sorted(keys) and len(keys) == 10
        assert (action["min.key"], action["max.key"]) == (keys[0], keys[-1])
        assert action["min.store_ts_ms"] is not None and action["max.physical_offset"] is not None
    assert sorted(kinds) == [KIND_KEY, KIND_UNIQ_KEY]


@pytest.mark.spark
def test_index_job_once_builds_the_index_and_runs_again_without_adding(
    spark: Any, store: Store, topic: str, tmp_path: Any
) -> None:
    sent = _send(store, topic, [(b"a", ("k1",)), (b"b", ("k2",))])
    stats = IndexStats()
    query = run_index(spark, store, once=True, stats=stats)
    assert not query.isActive and query.exception() is None
    assert (stats.rows, stats.entries) == (2, 4)
    assert stats.max_store_ts_ms == max(store.read(schemas.COMMIT_LOG)["store_ts_ms"].to_pylist())
    rows, version = _index_rows(store), store.version(schemas.INDEX)

    again = IndexStats()
    run_index(spark, store, once=True, stats=again)  # same checkpoint
    run_index(spark, store, once=True, stats=again, checkpoint=str(tmp_path / "fresh"))  # replays all
    assert again.entries == 0
    assert (store.version(schemas.INDEX), _index_rows(store)) == (version, rows)
    assert Admin(store).query_by_uniq_key(topic, sent[1].uniq_key) is not None


# ----------------------------------------------------------------------------- view_message
def test_view_message_reads_one_commit_log_file_by_msg_id(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = Admin(store)
    sent = [_send(store, topic, [(f"m{i}".encode(), (f"k{i}",))])[0] for i in range(5)]  # 5 files
    opened: list[str] = []
    original = FileReader.rows_at

    def spy(self: FileReader, path: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(path)
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(FileReader, "rows_at", spy)
    message = admin.view_message(sent[3].offset_msg_id)
    assert (message.body, message.keys, message.topic) == (b"m3", ("k3",), topic)
    assert (message.queue_id, message.queue_offset) == (sent[3].queue_id, sent[3].queue_offset)
    assert len(opened) == 1  # file statistics on physical_offset chose the one file
    assert admin.view_message(sent[0].offset_msg_id.lower()).body == b"m0"


def test_view_message_finds_messages_that_are_not_dispatched(store: Store, topic: str) -> None:
    [stamped] = CommitLogWriter(store).append(
        [PendingMessage(topic, 0, b"half", "U-HALF", sys_flag=int(SysFlag.PREPARED))]
    )
    message = Admin(store).view_message(stamped.msg_id)
    assert (message.body, message.sys_flag) == (b"half", int(SysFlag.PREPARED))


@pytest.mark.parametrize("bad", ["", "xyz", "Z" * 32, "0" * 31, 12345, None])
def test_view_message_with_a_malformed_id_is_an_invalid_argument(store: Store, bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="msg_id"):
        Admin(store).view_message(bad)


def test_view_message_with_another_stores_id_is_an_invalid_argument(store: Store, topic: str) -> None:
    [sent] = _send(store, topic, [(b"a", ())])
    other = ("0" if store.store_id[0] != "0" else "1") + sent.offset_msg_id[1:]
    with pytest.raises(InvalidArgumentError, match="belongs to store") as info:
        Admin(store).view_message(other)
    assert not isinstance(info.value, MessageNotFoundError)


def test_view_message_at_an_offset_holding_no_message_is_not_found(store: Store, topic: str) -> None:
    [sent] = _send(store, topic, [(b"a", ())])
    admin = Admin(store)
    for physical in (sent.physical_offset + 1, sent.physical_offset + 10**9):
        with pytest.raises(MessageNotFoundError, match="no message is stored") as info:
            admin.view_message(f"{store.store_id}{physical:016X}")
        assert info.value.physical_offset == physical  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- query_by_key
def _timed_sends(store: Store, topic: str, n: int, key: str) -> list[tuple[SendResult, int]]:
    """``n`` messages with ``key``, one commit each, a few ms apart; with their store times."""
    admin = Admin(store)
    out = []
    for i in range(n):
        [sent] = _send(store, topic, [(f"m{i}".encode(), (key, f"only-{i}"))])
        out.append((sent, admin.view_message(sent.offset_msg_id).store_ts_ms))
        time.sleep(0.005)
    return out


def test_query_by_key_returns_messages_stored_within_the_time_range(store: Store, topic: str) -> None:
    sent = _timed_sends(store, topic, 6, "order-1")
    _send(store, topic, [(b"other", ("order-2",))])
    index_pending(store)
    admin = Admin(store)

    everything = admin.query_by_key(topic, "order-1", 0, FAR_FUTURE)
    assert [m.body for m in everything] == [f"m{i}".encode() for i in range(6)]
    assert all("order-1" in m.keys for m in everything)

    begin, end = sent[2][1], sent[4][1]
    window = admin.query_by_key(topic, "order-1", begin, end)
    assert [m.offset_msg_id for m in window] == [s.offset_msg_id for s, ts in sent if begin <= ts <= end]
    assert {"m2", "m4"} <= {m.body.decode() for m in window}  # both ends are inclusive
    assert admin.query_by_key(topic, "order-1", 0, sent[0][1] - 1) == []
    assert admin.query_by_key(topic, "no-such-key", 0, FAR_FUTURE) == []


def test_query_by_key_returns_at_most_max_num_of_the_most_recent_in_store_order(
    store: Store, topic: str
) -> None:
    _send(store, topic, [(f"m{i}".encode(), ("k",)) for i in range(40)])
    index_pending(store)
    admin = Admin(store)
    assert len(admin.query_by_key(topic, "k", 0, FAR_FUTURE)) == 32  # RocketMQ's default
    newest = admin.query_by_key(topic, "k", 0, FAR_FUTURE, max_num=3)
    assert [m.body for m in newest] == [b"m37", b"m38", b"m39"]


def test_query_by_key_is_scoped_to_its_topic(store: Store, admin: Admin, topic: str) -> None:
    admin.create_topic("U", 1)
    _send(store, topic, [(b"in-T", ("shared",))])
    _send(store, "U", [(b"in-U", ("shared",))])
    index_pending(store)
    assert [m.body for m in admin.query_by_key("U", "shared", 0, FAR_FUTURE)] == [b"in-U"]


def test_lookups_read_only_index_files_whose_statistics_match(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = []
    for i in range(4):  # four passes, each a KEY file and a UNIQ_KEY file
        sent += _send(store, topic, [(f"m{i}".encode(), (f"batch-{i}",))])
        index_pending(store)
    files: list[int] = []
    original = Store.dataset

    def spy(self: Store, name: str, predicate: str | None = None, **kwargs: Any) -> Any:
        dataset = original(self, name, predicate, **kwargs)
        if name == schemas.INDEX:
            files.append(len(dataset.files))
        return dataset

    monkeypatch.setattr(Store, "dataset", spy)
    [found] = Admin(store).query_by_key(topic, "batch-2", 0, FAR_FUTURE)
    assert found.body == b"m2"
    found_by_uniq = Admin(store).query_by_uniq_key(topic, sent[1].uniq_key)
    assert found_by_uniq is not None and found_by_uniq.body == b"m1"
    assert files == [1, 1]  # of 8 index files


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("T", "", 0, 1), InvalidArgumentError, "key"),
        (("T", "a b", 0, 1), InvalidArgumentError, "key"),
        (("T", None, 0, 1), InvalidArgumentError, "key"),
        (("T", "k", -1, 1), InvalidArgumentError, "begin_ms"),
        (("T", "k", 0, "1"), InvalidArgumentError, "end_ms"),
        (("T", "k", 5, 4), InvalidArgumentError, "after end_ms"),
        (("T", "k", 0, 1, 0), InvalidArgumentError, "max_num"),
        (("T", "k", 0, 1, 1025), InvalidArgumentError, "max_num"),
        (("T", "k", 0, 1, True), InvalidArgumentError, "max_num"),
        (("bad topic", "k", 0, 1), InvalidTopicError, "topic"),
        (("Nope", "k", 0, 1), TopicNotFoundError, "Nope"),
    ],
)
def test_query_by_key_rejects_bad_input_with_a_typed_error(
    admin: Admin, topic: str, args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        admin.query_by_key(*args)


# ----------------------------------------------------------------------------- query_by_uniq_key
def test_query_by_uniq_key_finds_the_message_in_its_topic(store: Store, admin: Admin, topic: str) -> None:
    admin.create_topic("U", 1)
    sent = _send(store, topic, [(b"a", ()), (b"b", ())])
    index_pending(store)
    found = admin.query_by_uniq_key(topic, sent[1].uniq_key)
    assert found is not None
    assert (found.body, found.offset_msg_id, found.msg_id) == (b"b", sent[1].offset_msg_id, sent[1].msg_id)
    assert admin.query_by_uniq_key("U", sent[1].uniq_key) is None  # another topic
    assert admin.query_by_uniq_key(topic, "0" * 32) is None


def test_query_by_uniq_key_finds_a_message_before_and_after_the_index_job_indexed_it(
    store: Store, admin: Admin, topic: str
) -> None:
    [sent] = _send(store, topic, [(b"a", ())])
    assert indexed_version(store) == -1
    found = admin.query_by_uniq_key(topic, sent.uniq_key)
    assert found is not None and found.offset_msg_id == sent.offset_msg_id
    index_pending(store)
    found = admin.query_by_uniq_key(topic, sent.uniq_key)
    assert found is not None and found.offset_msg_id == sent.offset_msg_id


@pytest.mark.parametrize(
    ("topic_name", "uniq", "error"),
    [
        ("T", "", InvalidArgumentError),
        ("T", "a b", InvalidArgumentError),
        ("T", 7, InvalidArgumentError),
        ("", "U", InvalidTopicError),
        ("Nope", "U", TopicNotFoundError),
    ],
)
def test_query_by_uniq_key_rejects_bad_input_with_a_typed_error(
    admin: Admin, topic: str, topic_name: Any, uniq: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        admin.query_by_uniq_key(topic_name, uniq)


# ----------------------------------------------------------------------------- msg_id vs offset_msg_id
def test_send_result_msg_id_is_the_unique_id_and_offset_msg_id_the_store_id(store: Store, topic: str) -> None:
    [sent] = _send(store, topic, [(b"a", ())])
    [row] = [r for r in store.read(schemas.COMMIT_LOG).to_pylist()]
    assert (sent.msg_id, sent.offset_msg_id) == (row["uniq_key"], row["msg_id"])
    assert sent.uniq_key == sent.msg_id


def test_view_message_accepts_the_unique_id_or_the_offset_id(store: Store, admin: Admin, topic: str) -> None:
    admin.create_topic("U", 1)
    sent = _send(store, topic, [(b"a", ()), (b"b", ())])
    assert admin.view_message(sent[1].offset_msg_id).body == b"b"  # no index needed
    assert admin.view_message(sent[1].msg_id).body == b"b"  # nor for a unique id not indexed yet
    index_pending(store)
    assert admin.view_message(sent[1].msg_id).body == b"b"
    assert admin.view_message(sent[1].msg_id, topic=topic).body == b"b"
    with pytest.raises(MQError):
        admin.view_message(sent[1].msg_id, topic="U")


def test_query_by_uniq_key_accepts_an_offset_msg_id_of_its_topic(
    store: Store, admin: Admin, topic: str
) -> None:
    admin.create_topic("U", 1)
    [sent] = _send(store, topic, [(b"a", ())])
    found = admin.query_by_uniq_key(topic, sent.offset_msg_id)
    assert found is not None and found.uniq_key == sent.msg_id
    assert admin.query_by_uniq_key("U", sent.offset_msg_id) is None
