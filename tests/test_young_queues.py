"""Where a new group reading from LAST starts: 0 while the queue is young, measured as RocketMQ's
"first message still in memory" by the commit log written since the queue's first message
(``in_memory_max_bytes``), never by a clock: a week-old, little-used queue is young; a queue with
more than the threshold written after its first message starts at its end. Through the Python push
consumer and the wire's QUERY_CONSUMER_OFFSET alike."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine import Admin, ConsumeFrom, Message, Producer, PushConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.client.offsets import is_young
from engine.config import EngineConfig, load_config
from engine.errors import ConfigError
from engine.remoting import RemotingServer
from engine.remoting.codes import RequestCode, ResponseCode
from engine.store import schemas
from engine.store.commit_log.reads import log_end
from engine.store.commit_markers import MARKS_KEY
from engine.store.consume_queue import QueueIndex
from engine.store.consumer_offset import OffsetStore
from engine.store.delta.commits import commit_next
from engine.store.store import now_ms
from tests.remoting.wire_client import WireClient

WEEK_MS = 7 * 24 * 3600 * 1000
THRESHOLD = 20_000  # bytes of commit log after a queue's first message it may take and stay young


def _store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, written_after: int) -> Store:
    """Topic T (2 queues): queue 0's three messages stored a week ago (a fake store clock), then
    ``written_after`` KiB-sized messages in queue 1, all dispatched."""
    store = Store.open(tmp_path / "s", config=load_config(in_memory_max_bytes=THRESHOLD))
    Admin(store).create_topic("T", 2)
    week_ago = now_ms() - WEEK_MS
    monkeypatch.setattr("engine.store.commit_log.writer.now_ms", lambda: week_ago)
    with Producer(store) as p:
        p.send_batch([Message("T", f"old{i}".encode()) for i in range(3)], queue_id=0)
    monkeypatch.undo()
    if written_after:
        with Producer(store) as p:
            p.send_batch([Message("T", b"x" * 1024) for _ in range(written_after)], queue_id=1)
    dispatch_pending(store)
    return store


def _first_store_ts(store: Store) -> int:
    index = QueueIndex(store)
    index.refresh()
    return int(index.entries("T", 0, 0, 1)["store_ts_ms"][0].as_py())


def _push_start_offset(store: Store) -> int:
    """Where a new push group reading from LAST fixes queue 0's start (committed at first sight)."""
    c = PushConsumer(store, "new-group", consume_from=ConsumeFrom.LAST, rebalance_interval_ms=100)
    c.subscribe("T")
    c.register_listener(lambda messages: "SUCCESS")
    with c.start():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            offsets = OffsetStore(store, "new-group").read("T")
            if ("T", 0) in offsets:
                return offsets["T", 0]
            time.sleep(0.05)
    raise AssertionError("no start offset was fixed")


def _wire_query(store: Store) -> tuple[int, str | None]:
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as server:
        client = WireClient(server.broker_address)
        try:
            fields = {"consumerGroup": "NewWireGroup", "topic": "T", "queueId": 0}
            response = client.call(RequestCode.QUERY_CONSUMER_OFFSET, fields)
        finally:
            client.close()
    return response.code, response.ext_fields.get("offset")


def test_a_week_old_little_used_queue_is_young_and_a_new_group_replays_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path, monkeypatch, written_after=2)
    assert now_ms() - _first_store_ts(store) >= WEEK_MS  # the old clock rule called it old
    index = QueueIndex(store)
    index.refresh()
    assert is_young(store, index, "T", 0)
    assert _push_start_offset(store) == 0
    assert _wire_query(store) == (ResponseCode.SUCCESS, "0")


def test_a_queue_with_more_than_the_threshold_written_after_its_first_message_starts_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path, monkeypatch, written_after=THRESHOLD // 1024 + 5)
    index = QueueIndex(store)
    index.refresh()
    assert not is_young(store, index, "T", 0)
    assert _push_start_offset(store) == 3  # LAST: the next message to be written
    assert _wire_query(store)[0] == ResponseCode.QUERY_NOT_FOUND  # the client applies its LAST


def test_the_threshold_is_inclusive_of_exactly_what_was_written_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path, monkeypatch, written_after=1)
    index = QueueIndex(store)
    index.refresh()
    first = int(index.entries("T", 0, 0, 1)["physical_offset"][0].as_py())
    newest = index.entries("T", 1, 0, 1)  # the newest message: RocketMQ counts it whole (maxOffsetPy)
    end = int(newest["physical_offset"][0].as_py()) + int(newest["size"][0].as_py())
    assert log_end(store, schemas.COMMIT_LOG) == end
    exact = store.config.replace(in_memory_max_bytes=end - first)
    monkeypatch.setattr(store, "config", exact)
    assert is_young(store, index, "T", 0)
    monkeypatch.setattr(store, "config", exact.replace(in_memory_max_bytes=end - first - 1))
    assert not is_young(store, index, "T", 0)
    monkeypatch.setattr(store, "config", exact.replace(in_memory_max_bytes=0))  # 0: never young
    assert not is_young(store, index, "T", 0)
    assert not is_young(store, index, "T", 1)


def test_an_empty_queue_is_young_unless_disabled(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = QueueIndex(store)
    index.refresh()
    assert is_young(store, index, topic, 0)
    monkeypatch.setattr(store, "config", store.config.replace(in_memory_max_bytes=0))
    assert not is_young(store, index, topic, 0)


def test_the_log_end_is_where_the_next_message_goes_whatever_commits_and_their_files_say(
    store: Store, topic: str
) -> None:
    assert log_end(store, schemas.COMMIT_LOG) == 0  # an empty log
    with Producer(store) as p:
        p.send_batch([Message(topic, b"x" * 100) for _ in range(3)], queue_id=0)
        sent = p.send(Message(topic, b"last"), queue_id=1)
    rows = store.read(schemas.COMMIT_LOG)
    newest = max(rows.to_pylist(), key=lambda r: int(r["physical_offset"]))  # type: ignore[arg-type]
    end = int(newest["physical_offset"]) + int(newest["size"])
    assert newest["physical_offset"] == sent.physical_offset
    assert log_end(store, schemas.COMMIT_LOG) == end
    # a commit that moves no mark (as maintenance's): the newest one that does tells
    commit_next(store.snapshot(schemas.COMMIT_LOG), custom_metadata={"note": "no marks"})
    assert MARKS_KEY not in store.snapshot(schemas.COMMIT_LOG).commit_info(store.version(schemas.COMMIT_LOG))
    assert log_end(store, schemas.COMMIT_LOG) == end
    with Producer(store) as p:
        more = p.send(Message(topic, b"more"), queue_id=0)
    assert more.physical_offset == end  # where the end said the next message goes
    assert log_end(store, schemas.COMMIT_LOG) > end


def test_the_default_threshold_is_4_gib_and_documented_in_engine_toml() -> None:
    assert EngineConfig().in_memory_max_bytes == 4 * 1024**3
    assert load_config().in_memory_max_bytes == 4 * 1024**3
    with pytest.raises(ConfigError):
        load_config(in_memory_max_bytes=-1)


def test_the_removed_age_setting_is_an_unknown_key_whose_error_lists_the_new_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="in_memory_age_ms"):
        load_config(in_memory_age_ms=600_000)
    toml = tmp_path / "engine.toml"
    toml.write_text("in_memory_age_ms = 600000\n")
    with pytest.raises(ConfigError, match="in_memory_max_bytes"):
        load_config(toml)
