"""Recent messages (engine.remoting.recent): a pull the door answers from memory is byte for byte the
pull the engine answers, and nothing the engine would not serve is served from memory."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Admin, Message, Producer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.retention import retain
from engine.broker.schedule import deliver_due
from engine.config import load_config
from engine.model import MessageExt, PullStatus
from engine.protocol.selectors import MessageSelector
from engine.remoting import RemotingServer
from engine.remoting.codes import MessageSysFlag, RequestCode, ResponseCode
from engine.remoting.frames import RemotingCommand, encode_command
from engine.remoting.message_layout import BatchItem, BatchRecord, decode_stored
from engine.remoting.recent import (
    ENTRY_OVERHEAD,
    READ_AHEAD_ENTRIES,
    READ_AHEAD_LOW,
    READ_ON_MISS,
    Recent,
    RecentMessages,
    encode,
    read_ahead,
    sent,
)
from engine.remoting.wire_messages import encode_rows, incoming
from engine.remoting.wire_producer import WireProducer
from engine.store import schemas
from engine.store.consume_queue import QueueIndex
from tests.remoting.helpers import FAR_FUTURE_MS
from tests.remoting.wire_client import WireClient

TAGS = ["TagA", "TagB", None, "TagC"]


def _store(tmp_path: Path, **config: int) -> Store:
    store = Store.open(tmp_path / "store", config=load_config().replace(**config))
    Admin(store).create_topic("T", 2)
    return store


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Store, RemotingServer, WireClient]]:
    # A small transfer limit, so the byte stop falls inside the held messages too.
    store = _store(tmp_path, max_transfer_bytes=20_000)
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as srv:
        client = WireClient(srv.broker_address)
        yield store, srv, client
        client.close()


def _fill(store: Store, n: int, queue_id: int = 0) -> None:
    """``n`` messages of mixed sizes, tags, keys and properties, through the Python API."""
    with Producer(store) as producer:
        for i in range(n):
            message = Message(
                "T",
                bytes([65 + i % 26]) * (100 + 700 * (i % 5)),
                tags=TAGS[i % len(TAGS)],
                keys=[f"k{i}"] if i % 3 == 0 else [],
                properties={"n": str(i)} if i % 2 else {},
            )
            producer.send(message, queue_id=queue_id)


def _frame(response: RemotingCommand) -> bytes:
    """The response as it went on the wire, but for the request's own ``opaque``."""
    return encode_command(dataclasses.replace(response, opaque=0))


def _pull(client: WireClient, offset: int, **kw: object) -> RemotingCommand:
    response, _ = client.pull("G", "T", 0, offset, **kw)  # type: ignore[arg-type]
    return response


def test_answers_from_memory_are_byte_for_byte_the_engines(
    served: tuple[Store, RemotingServer, WireClient],
) -> None:
    store, srv, client = served
    _fill(store, 60)
    dispatch_pending(store)
    # Sent through the door: born host and flag kept in the stored layout.
    sent = client.send("T", b"wire", properties={"TAGS": "TagA", "k": "v"}, flag=7)
    assert sent.code == ResponseCode.SUCCESS
    recent = srv.ctx.recent
    pulls: list[dict[str, object]] = [
        {"offset": o, "max_nums": n, "subscription": s}
        for o in (0, 3, 17, 40, 59, 60, 61, 62)
        for n in (1, 5, 32)
        for s in ("*", "TagA", "TagA || TagC", "TagZ")
    ]
    _pull(client, 0)  # reads ahead: every message of the queue is held now
    hits = recent.hits
    cached = [_pull(client, **p) for p in pulls]  # type: ignore[arg-type]
    # Every pull inside the queue (61 messages) was answered from memory; at or past its end the
    # bounds alone answer.
    assert recent.hits - hits == sum(1 for p in pulls if p["offset"] < 61)  # type: ignore[operator]
    max_bytes, recent.max_bytes = recent.max_bytes, 0  # off: every pull is the engine's
    engine = [_pull(client, **p) for p in pulls]  # type: ignore[arg-type]
    recent.max_bytes = max_bytes
    assert [_frame(r) for r in cached] == [_frame(r) for r in engine]
    codes = {r.code for r in cached}
    assert {ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED} <= codes
    assert ResponseCode.PULL_RETRY_IMMEDIATELY in codes  # TagZ: nothing matched


def test_a_sql92_pull_is_the_engines(served: tuple[Store, RemotingServer, WireClient]) -> None:
    store, srv, client = served
    _fill(store, 10)
    _pull(client, 0)
    misses, hits = srv.ctx.recent.misses, srv.ctx.recent.hits
    response, messages = client.pull("G", "T", 0, 0, subscription="n > 4", expression_type="SQL92")
    assert response.code == ResponseCode.SUCCESS
    assert [m.properties["n"] for m in messages] == ["5", "7", "9"]
    assert (srv.ctx.recent.hits, srv.ctx.recent.misses) == (hits, misses)


def test_what_wire_clients_send_is_pulled_from_memory_without_a_read(
    served: tuple[Store, RemotingServer, WireClient],
) -> None:
    store, srv, client = served
    for i in range(3):
        assert client.send("T", f"m{i}".encode(), properties={"TAGS": "A"}).code == ResponseCode.SUCCESS
    batch = [BatchItem(f"b{i}".encode(), {}, 0) for i in range(4)]
    assert client.send_batch("T", batch).code == ResponseCode.SUCCESS
    recent = srv.ctx.recent
    deadline = time.monotonic() + 10
    while not recent.holds("T", 0, 6) and time.monotonic() < deadline:  # held once answered
        time.sleep(0.01)
    assert all(recent.holds("T", 0, o) for o in range(7))
    hits, misses = recent.hits, recent.misses
    dispatch_pending(store)
    response, messages = client.pull("G", "T", 0, 0)
    assert [m.body for m in messages] == [b"m0", b"m1", b"m2", b"b0", b"b1", b"b2", b"b3"]
    assert (recent.hits, recent.misses) == (hits + 1, misses)  # answered from memory, nothing read
    assert response.code == ResponseCode.SUCCESS and not recent.reading


def test_a_message_the_python_api_sent_after_a_read_is_pulled(
    served: tuple[Store, RemotingServer, WireClient],
) -> None:
    store, _, client = served
    _fill(store, 3)
    assert [m.queue_offset for m in client.pull("G", "T", 0, 0)[1]] == [0, 1, 2]
    with Producer(store) as producer:
        producer.send(Message("T", b"later"), queue_id=0)  # not dispatched: the queue's tail
    response, messages = client.pull("G", "T", 0, 3)
    assert response.ext_fields["maxOffset"] == "4"
    assert [m.body for m in messages] == [b"later"]


def test_retention_is_never_answered_from_memory(served: tuple[Store, RemotingServer, WireClient]) -> None:
    store, srv, client = served
    _fill(store, 5)
    dispatch_pending(store)
    assert len(client.pull("G", "T", 0, 0)[1]) == 5
    assert srv.ctx.recent.holds("T", 0, 0)
    report = retain(store, file_reserved_hours=0, force=True, now_ms=FAR_FUTURE_MS)
    assert report["min_offsets"]["T"][0] == 5
    response = _pull(client, 0)
    assert response.code == ResponseCode.PULL_OFFSET_MOVED
    assert (response.ext_fields["nextBeginOffset"], response.ext_fields["minOffset"]) == ("5", "5")


def test_a_delayed_and_a_half_message_are_not_pulled_before_their_time(
    served: tuple[Store, RemotingServer, WireClient],
) -> None:
    store, _, client = served
    _fill(store, 2)
    assert len(client.pull("G", "T", 0, 0)[1]) == 2
    assert client.send("T", b"later", properties={"DELAY": "2"}).code == ResponseCode.SUCCESS
    prepared = MessageSysFlag.TRANSACTION_PREPARED
    half = client.send("T", b"half", properties={"TRAN_MSG": "true", "PGROUP": "P"}, sys_flag=prepared)
    assert half.code == ResponseCode.SUCCESS
    dispatch_pending(store)
    response = _pull(client, 2)
    assert response.code == ResponseCode.PULL_NOT_FOUND and response.ext_fields["maxOffset"] == "2"
    deliver_due(store, now_ms=FAR_FUTURE_MS)
    dispatch_pending(store)
    assert [m.body for m in client.pull("G", "T", 0, 2)[1]] == [b"later"]


def test_a_topic_deleted_and_made_again_is_answered_as_the_engine_answers(
    served: tuple[Store, RemotingServer, WireClient],
) -> None:
    store, srv, client = served
    _fill(store, 4)
    assert len(client.pull("G", "T", 0, 0)[1]) == 4
    response = client.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "T"})
    assert response.code == ResponseCode.SUCCESS
    assert not srv.ctx.recent.holds("T", 0, 0)
    Admin(store).create_topic("T", 2)
    with Producer(store) as producer:
        producer.send(Message("T", b"new"), queue_id=0)
    answered = [_pull(client, offset) for offset in range(6)]
    recent = srv.ctx.recent
    max_bytes, recent.max_bytes = recent.max_bytes, 0
    engine = [_pull(client, offset) for offset in range(6)]
    recent.max_bytes = max_bytes
    assert [_frame(r) for r in answered] == [_frame(r) for r in engine]
    assert client.pull("G", "T", 0, int(answered[0].ext_fields["maxOffset"]) - 1)[1][0].body == b"new"


def test_off_when_configured_to_hold_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path, wire_recent_bytes=0)
    _fill(store, 3)
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as srv:
        client = WireClient(srv.broker_address)
        assert len(client.pull("G", "T", 0, 0)[1]) == 3
        assert len(client.pull("G", "T", 0, 0)[1]) == 3
        assert (len(srv.ctx.recent), srv.ctx.recent.hits) == (0, 0)
        client.close()


# ----------------------------------------------------------------- the holder itself
def _item(n: int, physical: int, tags: str | None = None) -> Recent:
    return Recent(b"x" * n, n, tags, 0, physical)


def test_the_oldest_messages_go_first_once_past_the_byte_bound() -> None:
    cost = 100 + ENTRY_OVERHEAD
    recent = RecentMessages(3 * cost, load_config())
    recent.put("T", 0, [(0, _item(100, 10)), (1, _item(100, 11))])
    recent.put("T", 1, [(0, _item(100, 20)), (1, _item(100, 21))])
    assert len(recent) == 3 and recent.bytes == 3 * cost
    assert not recent.holds("T", 0, 0)
    assert [recent.holds("T", 0, 1), recent.holds("T", 1, 0), recent.holds("T", 1, 1)] == [True] * 3


def test_an_offset_that_names_another_message_forgets_the_queue() -> None:
    recent = RecentMessages(1 << 20, load_config())
    recent.put("T", 0, [(0, _item(10, 10)), (1, _item(10, 11))])
    recent.put("T", 0, [(1, _item(10, 99))])  # the queue was made again
    assert not recent.holds("T", 0, 0) and recent.holds("T", 0, 1) and len(recent) == 1


def test_bounds_decide_before_what_is_held() -> None:
    recent = RecentMessages(1 << 20, load_config())
    recent.put("T", 0, [(i, _item(10, 10 + i)) for i in range(4)])
    select = MessageSelector.by_tag("*")
    below = recent.answer("T", 0, 0, 32, select, 2, 4)
    assert below is not None and (below.status, below.next_begin_offset, below.body) == (
        PullStatus.OFFSET_ILLEGAL,
        2,
        b"",
    )
    found = recent.answer("T", 0, 2, 32, select, 2, 4)
    assert found is not None and (found.status, found.next_begin_offset) == (PullStatus.FOUND, 4)
    assert found.body == b"x" * 20
    # The queue's end went back (made again, truncated): nothing held of it is trusted.
    assert recent.answer("T", 0, 0, 32, select, 0, 1) is None and len(recent) == 0
    assert recent.answer("T", 0, 0, 32, MessageSelector.by_sql("a > 1"), 0, 4) is None


def _until_held(recent: RecentMessages, queue_id: int, offset: int) -> None:
    deadline = time.monotonic() + 30
    while not recent.holds("T", queue_id, offset):  # read in the background
        assert time.monotonic() < deadline, f"offset {offset} was not read ahead"
        time.sleep(0.01)


def test_a_reader_has_the_messages_past_what_it_pulled_read_for_it_in_the_background(
    served: tuple[Store, RemotingServer, WireClient],
) -> None:
    store, srv, client = served
    total = READ_ON_MISS + READ_AHEAD_ENTRIES + 50
    with Producer(store) as producer:
        producer.send_batch([Message("T", b"m%d" % i) for i in range(total)], queue_id=1)
    dispatch_pending(store)
    recent = srv.ctx.recent
    # A miss reads READ_ON_MISS messages and answers; the next READ_AHEAD_ENTRIES follow.
    assert len(client.pull("G", "T", 1, 0)[1]) == 32
    _until_held(recent, 1, READ_ON_MISS + READ_AHEAD_ENTRIES - 1)
    assert not recent.holds("T", 1, READ_ON_MISS + READ_AHEAD_ENTRIES)
    # A pull with fewer than READ_AHEAD_LOW messages held past it starts the next read.
    near = READ_ON_MISS + READ_AHEAD_ENTRIES - READ_AHEAD_LOW
    hits = recent.hits
    response, messages = client.pull("G", "T", 1, near)
    assert response.code == ResponseCode.SUCCESS and len(messages) == 32 and recent.hits == hits + 1
    _until_held(recent, 1, total - 1)
    response, messages = client.pull("G", "T", 1, total - 10)
    assert [m.body for m in messages] == [b"m%d" % i for i in range(total - 10, total)]
    assert recent.hits == hits + 2


def test_rows_encode_column_by_column_as_each_message_does(tmp_path: Path) -> None:
    """The read ahead's row encoder gives, byte for byte, what the door encodes a message it read
    one by one gives: tags, keys, user properties, a wire client's born host and flag, a message
    without tags, a reconsumed copy."""
    store = _store(tmp_path)
    _fill(store, 12)
    wire = WireProducer(store)
    try:
        item = incoming(
            "T", b"wire", {"TAGS": "W", "KEYS": "k1 k2", "a": "1"}, born_host=("10.1.2.3", 4567), flag=9
        )
        wire.send_wire_grouped(item, 1).future.result(timeout=30)
    finally:
        wire.close()
    with Producer(store) as producer:
        producer.send(Message("T", b"plain"), queue_id=0)
    rows = store.read(schemas.COMMIT_LOG).select(schemas.COMMIT_LOG_SCHEMA.names)
    host = ("127.0.0.1", 10911)
    expected = [encode(MessageExt.from_row(r), host) for r in rows.to_pylist()]
    assert encode_rows(rows, host) == expected
    assert len({e for e in expected}) == rows.num_rows == 14
    decoded = decode_stored(b"".join(expected))
    wired = next(m for m in decoded if m.body == b"wire")
    assert (wired.born_host, wired.flag) == (("10.1.2.3", 4567), 9)
    assert wired.properties["KEYS"] == "k1 k2" and wired.properties["a"] == "1"


def test_what_a_wire_client_sent_is_held_as_a_pull_reads_it_back(tmp_path: Path) -> None:
    """Messages held at their send (engine.remoting.recent.sent) are byte for byte what a read ahead
    of the stored rows holds, with the consume-queue entry's size and tags code; a delayed send,
    stored in the schedule topic, is not held."""
    store = _store(tmp_path)
    host = ("127.0.0.1", 10911)
    wire = WireProducer(store)
    try:
        single = wire.send_wire_grouped(
            incoming("T", b"one", {"TAGS": "A", "KEYS": "k", "x": "y"}, born_host=("10.0.0.1", 1), flag=3), 1
        )
        batch = wire.queue_batch(
            wire.prepare_client_batch(
                "T", 1, [BatchRecord(f"b{i}".encode(), "TAGS\x01B\x02" if i % 2 else "") for i in range(5)]
            )
        )
        delayed = wire.send_wire_grouped(incoming("T", b"later", {"DELAY": "3"}), 1)
        held = [
            *sent(single.prepared, [single.future.result(30)], host),
            *sent(batch.prepared, batch.future.result(30), host),
            *sent(delayed.prepared, [delayed.future.result(30)], host),
        ]
    finally:
        wire.close()
    dispatch_pending(store)
    assert [offset for offset, _ in held] == list(range(6))  # the delayed one is left out
    index = QueueIndex(store)
    index.refresh()
    read = dict(read_ahead(index, host, "T", 1, 0, 6))
    assert [(o, h) for o, h in held] == [(o, read[o]) for o, _ in held]
