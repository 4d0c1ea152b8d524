"""Key and unique-key look-ups see every dispatched message, whether or not the index job has run;
when the index is too far behind for that, they say so (never a silent partial answer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import Admin, KeyQueryResult, Message, Producer, SendResult, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.cli import main
from engine.client import queries
from engine.store.index import indexed_version

FAR_FUTURE = 2**62


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store.open(str(tmp_path / "mqdata"))
    Admin(store).create_topic("T", 2)
    return store


def send(store: Store, *bodies: str, key: str = "order-1") -> list[SendResult]:
    with Producer(store) as producer:  # one commit each
        return [producer.send(Message("T", body.encode(), keys=(key,))) for body in bodies]


def test_a_key_and_a_unique_id_are_found_right_after_dispatch_without_the_index_job(store: Store) -> None:
    [sent] = send(store, "a")
    dispatch_pending(store)
    assert indexed_version(store) == -1  # the index job never ran
    admin = Admin(store)
    found = admin.query_by_key("T", "order-1", 0, FAR_FUTURE)
    assert isinstance(found, KeyQueryResult) and found.complete and found.unread_versions == 0
    assert [m.msg_id for m in found] == [sent.msg_id]
    by_uniq = admin.query_by_uniq_key("T", sent.msg_id)
    assert by_uniq is not None and by_uniq.offset_msg_id == sent.offset_msg_id
    assert admin.view_message(sent.msg_id).offset_msg_id == sent.offset_msg_id
    assert admin.query_by_key("T", "other-key", 0, FAR_FUTURE) == []


def test_indexed_and_unindexed_messages_are_found_together_once_each(store: Store) -> None:
    first = send(store, "a", "b")
    index_pending(store)
    later = send(store, "c")
    found = Admin(store).query_by_key("T", "order-1", 0, FAR_FUTURE)
    assert [m.body for m in found] == [b"a", b"b", b"c"] and found.complete
    assert [m.msg_id for m in found] == [s.msg_id for s in (*first, *later)]
    index_pending(store)
    assert [m.body for m in Admin(store).query_by_key("T", "order-1", 0, FAR_FUTURE)] == [b"a", b"b", b"c"]


def test_the_unindexed_part_keeps_the_time_range_and_the_topic(store: Store) -> None:
    Admin(store).create_topic("U", 1)
    [sent] = send(store, "a")
    with Producer(store) as producer:
        producer.send(Message("U", b"elsewhere", keys=("order-1",)))
    admin = Admin(store)
    assert [m.body for m in admin.query_by_key("T", "order-1", 0, FAR_FUTURE)] == [b"a"]
    stored = admin.view_message(sent.offset_msg_id).store_ts_ms
    assert admin.query_by_key("T", "order-1", 0, stored - 1) == []
    assert admin.query_by_key("T", "order-1", stored + 1, FAR_FUTURE) == []
    assert admin.query_by_uniq_key("U", sent.msg_id) is None


def test_a_transaction_half_is_not_found_by_key_before_its_commit(store: Store) -> None:
    from engine import LocalTransactionState, TransactionProducer

    unknown = LocalTransactionState.UNKNOWN
    with TransactionProducer(store, lambda m: unknown, "TXG") as producer:
        producer.send_in_transaction(Message("T", b"undecided", keys=("order-1",)), lambda m: unknown)
    assert Admin(store).query_by_key("T", "order-1", 0, FAR_FUTURE) == []


def test_past_the_bound_a_key_query_says_it_is_incomplete(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queries, "UNINDEXED_SCAN_VERSIONS", 2)
    sent = send(store, "a", "b", "c", "d")  # four commits, none indexed
    admin = Admin(store)
    found = admin.query_by_key("T", "order-1", 0, FAR_FUTURE)
    assert [m.body for m in found] == [b"c", b"d"]  # the newest versions were read
    assert not found.complete and found.unread_versions >= 2
    # A unique id is still found: past the bound its column is scanned.
    oldest = admin.query_by_uniq_key("T", sent[0].msg_id)
    assert oldest is not None and oldest.body == b"a"
    index_pending(store)
    found = admin.query_by_key("T", "order-1", 0, FAR_FUTURE)
    assert [m.body for m in found] == [b"a", b"b", b"c", b"d"] and found.complete


def _mq(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_mq_message_query_finds_a_key_right_after_mq_dispatch(
    capsys: pytest.CaptureFixture[str], store: Store
) -> None:
    root = store.root
    code, out, _ = _mq(capsys, "send", "T", "hello", "--keys", "K1", "--store", root, "--json")
    sent = json.loads(out)
    assert _mq(capsys, "dispatch", "--once", "--no-spark", "--store", root)[0] == 0
    code, out, err = _mq(capsys, "message", "query", "T", "--key", "K1", "--store", root, "--json")
    assert code == 0 and err == ""
    assert [m["msg_id"] for m in json.loads(out)] == [sent["msg_id"]]
    code, out, _ = _mq(capsys, "message", "view", sent["msg_id"], "--store", root, "--json")
    assert code == 0 and json.loads(out)["offset_msg_id"] == sent["offset_msg_id"]


def test_mq_message_query_warns_on_stderr_when_the_index_is_too_far_behind(
    capsys: pytest.CaptureFixture[str], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queries, "UNINDEXED_SCAN_VERSIONS", 1)
    send(store, "a", "b", key="K1")
    for extra in ([], ["--json"]):
        code, out, err = _mq(capsys, "message", "query", "T", "--key", "K1", "--store", store.root, *extra)
        assert code == 0
        [line] = err.strip().splitlines()
        assert line.startswith("warning: the key index is behind") and "index job" in line
    assert len(json.loads(out)) == 1  # stdout stays one document
