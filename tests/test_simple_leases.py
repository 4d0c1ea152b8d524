"""SimpleConsumer on QMQ's model: leased ranges, receipts, returning consumers, resets, new groups."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from engine import Admin, Message, MessageSelector, Producer, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.pull_log import pull_rows
from engine.client.simple.deliveries import topic_of
from engine.config import load_config
from engine.errors import ConsumerError, InvalidReceiptHandleError, ReceiptHandleExpiredError
from engine.model import MessageExt
from engine.protocol.actions import ACK, EXPIRED, OFFLINE, PULL, RELEASE, RESET
from engine.protocol.lease_book import LeaseBook
from engine.protocol.names import PROPERTY_RETRY_TOPIC
from engine.store import schemas
from engine.store.action_log import read_actions
from engine.store.consumer_offset import OffsetStore
from engine.store.delta.log import VERSION_COLUMN
from tests.helpers import eventually, versions

GROUP = "G"


@pytest.fixture
def one_queue(admin: Admin) -> str:
    admin.create_topic("Q1", 1)
    return "Q1"


@pytest.fixture
def consumers(store: Store) -> Iterator[Callable[..., SimpleConsumer]]:
    made: list[SimpleConsumer] = []

    def make(consumer_id: str, topic: str = "Q1", **kwargs: Any) -> SimpleConsumer:
        consumer = SimpleConsumer(kwargs.pop("on", store), GROUP, consumer_id, **kwargs)
        consumer.subscribe(topic)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


def produce(store: Store, n: int, topic: str = "Q1", start: int = 0) -> list[bytes]:
    bodies = [f"m{i}".encode() for i in range(start, start + n)]
    with Producer(store) as producer:
        producer.send_batch([Message(topic, body) for body in bodies])
    dispatch_pending(store)
    return bodies


def effective_ackers(store: Store) -> dict[int, set[str]]:
    """Queue offset -> consumers that wrote an ACK covering it."""
    out: dict[int, set[str]] = {}
    for r in read_actions(store, GROUP, ACK):
        end = r["end_offset"] if r["end_offset"] is not None else r["queue_offset"] + 1
        for offset in range(r["queue_offset"], end):
            out.setdefault(offset, set()).add(r["consumer_id"])
    return out


# ----------------------------------------------------------------------------- one commit, many messages
def test_one_lease_serves_many_receives(store: Store, one_queue: str, consumers: Any) -> None:
    bodies = produce(store, 60)
    consumer = consumers("c")
    got = []
    for _ in range(60):
        [message] = consumer.receive(max_nums=1)
        got.append(message.body)
        consumer.ack(message)
    assert got == bodies
    pulls = read_actions(store, GROUP, PULL)
    assert len(pulls) <= 10  # the lease size doubles while the buffer drains: 1, 2, 4, ... 64
    assert sum(r["end_offset"] - r["queue_offset"] for r in pulls) == 60


def test_max_unacked_bounds_messages_received_and_not_acked(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, 10)
    consumer = consumers("c", max_unacked=4)
    first = consumer.receive(max_nums=10)
    assert len(first) == 4
    assert consumer.receive(max_nums=10) == []  # back-pressure: 4 unacked
    consumer.ack(first[0])
    consumer.ack(first[1])
    assert len(consumer.receive(max_nums=10)) == 2


# ----------------------------------------------------------------------------- receipts
def test_ack_after_the_invisible_time_is_refused(store: Store, one_queue: str, consumers: Any) -> None:
    produce(store, 1)
    consumer = consumers("c")
    [message] = consumer.receive(invisible_ms=150)
    time.sleep(0.3)
    before = versions(store)
    with pytest.raises(ReceiptHandleExpiredError):
        consumer.ack(message)
    consumer.flush()
    assert versions(store) == before


def test_a_message_delivered_again_is_acked_only_by_its_new_holder(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, 1)
    slow, fast = consumers("slow"), consumers("fast")
    [stale] = slow.receive(invisible_ms=100)
    [fresh] = eventually(lambda: fast.receive(invisible_ms=60_000))
    assert (fresh.queue_offset, fresh.reconsume_times) == (stale.queue_offset, 1)
    assert fresh.receipt_handle != stale.receipt_handle
    with pytest.raises(InvalidReceiptHandleError):  # expired: RocketMQ 5 refuses the stale receipt
        slow.ack(stale)
    fast.ack(fresh)
    fast.flush()
    slow.flush()
    assert effective_ackers(store) == {0: {"fast"}}


# ----------------------------------------------------------------------------- returning consumers
def test_a_returning_consumer_id_gets_its_unacked_messages_back_at_once(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, 3)
    first = SimpleConsumer(store, GROUP, "same")
    first.subscribe(one_queue)
    got = first.receive(max_nums=3, invisible_ms=60_000)
    first.ack(got[0])
    first.flush()  # then the process "dies": no close, nothing given back
    again = consumers("same")
    back = again.receive(max_nums=3)
    assert [(m.queue_offset, m.receipt_handle, m.reconsume_times) for m in back] == [
        (m.queue_offset, m.receipt_handle, 0) for m in got[1:]
    ]
    assert consumers("other").receive() == []  # still leased to "same"
    for m in back:
        again.ack(m)


def test_a_new_consumer_id_waits_for_the_invisible_time_of_a_dead_one(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, 2)
    dead = SimpleConsumer(store, GROUP, "dead")
    dead.subscribe(one_queue)
    held = dead.receive(max_nums=2, invisible_ms=400)
    successor = consumers("successor")
    assert successor.receive() == []
    again = eventually(lambda: successor.receive(max_nums=2))
    assert sorted((m.queue_offset, m.reconsume_times) for m in again) == [(0, 1), (1, 1)]
    assert all(m.store_ts_ms == h.store_ts_ms for m, h in zip(again, held, strict=True))


def test_offline_close_hands_unacked_messages_to_the_group_at_once(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, 2)
    leaving = SimpleConsumer(store, GROUP, "leaving")
    leaving.subscribe(one_queue)
    assert len(leaving.receive(max_nums=2, invisible_ms=600_000)) == 2
    leaving.close(offline=True)
    assert [r["consumer_id"] for r in read_actions(store, GROUP, OFFLINE)] == ["leaving"]
    taken = eventually(lambda: consumers("stayer").receive(max_nums=2))
    assert [(m.queue_offset, m.reconsume_times) for m in taken] == [(0, 1), (1, 1)]


def test_close_gives_back_prefetched_messages_without_counting_a_delivery(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, 40)
    first = SimpleConsumer(store, GROUP, "first")
    first.subscribe(one_queue)
    handed = []
    while len(handed) < 6:
        [message] = first.receive(max_nums=1)
        handed.append(message)
        first.ack(message)
    waiting = first._leases.waiting
    assert waiting > 0  # leased ahead, never handed out
    first.close()
    assert read_actions(store, GROUP, RELEASE)
    second = consumers("second")
    rest: list[Any] = []
    eventually(lambda: rest.extend(second.receive(max_nums=64)) or len(rest) >= 34)
    assert sorted(m.queue_offset for m in rest) == list(range(6, 40))
    assert all(m.reconsume_times == 0 for m in rest)


def test_a_message_leased_for_a_receive_is_handed_out_even_if_its_lease_ran_out_first(
    store: Store, one_queue: str, consumers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.client.simple.leases as leases_module

    produce(store, 1)
    consumer = consumers("c")
    real = leases_module.now_ms
    # the lease commit and the read took longer than the invisible time: it ran out before hand-out
    monkeypatch.setattr(leases_module, "now_ms", lambda: real() + 60_000)
    [late] = consumer.receive(1, invisible_ms=50)  # its delivery counts: the user sees it
    assert (late.body, late.reconsume_times) == (b"m0", 0)
    monkeypatch.setattr(leases_module, "now_ms", real)
    [again] = eventually(lambda: consumer.receive(1, invisible_ms=60_000))
    assert (again.body, again.reconsume_times) == (b"m0", 1)  # its second delivery, not its first
    assert not read_actions(store, GROUP, RELEASE)


# ----------------------------------------------------------------------------- where a group starts
@pytest.mark.parametrize(
    ("setting", "consume_from", "expected"),
    [
        ({}, "LAST", [b"m0", b"m1", b"m2"]),  # a young queue: from 0, as RocketMQ's POP
        ({"in_memory_max_bytes": 0}, "LAST", [b"m2"]),  # an old queue: the last message
        ({"in_memory_max_bytes": 0}, "FIRST", [b"m0", b"m1", b"m2"]),
    ],
)
def test_a_new_group_starts_by_consume_from_and_the_age_of_the_queue(
    tmp_path: Path, setting: dict[str, int], consume_from: str, expected: list[bytes]
) -> None:
    store = Store.open(tmp_path / "s", config=load_config(**setting))
    Admin(store).create_topic("Q1", 1)
    produce(store, 3)
    with SimpleConsumer(store, GROUP, "c", consume_from=consume_from) as consumer:
        consumer.subscribe("Q1")
        assert [m.body for m in consumer.receive(max_nums=10)] == expected
        [reset] = read_actions(store, GROUP, RESET)
        assert reset["queue_offset"] == 3 - len(expected)


def test_a_new_group_by_timestamp_and_a_committed_offset_wins(store: Store, one_queue: str) -> None:
    produce(store, 2)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce(store, 2, start=2)
    with SimpleConsumer(store, "ByTime", "c", consume_from="TIMESTAMP", consume_from_timestamp_ms=cut) as c:
        c.subscribe(one_queue)
        assert [m.body for m in c.receive(max_nums=10)] == [b"m2", b"m3"]
    OffsetStore(store, "Committed").commit([(one_queue, 0, 1)])
    with SimpleConsumer(store, "Committed", "c", consume_from="FIRST") as c:
        c.subscribe(one_queue)
        assert [m.body for m in c.receive(max_nums=10)] == [b"m1", b"m2", b"m3"]


# ----------------------------------------------------------------------------- live resets
def test_an_offset_reset_reaches_a_running_consumer(store: Store, one_queue: str, consumers: Any) -> None:
    produce(store, 4)
    consumer = consumers("c", max_unacked=64)
    for m in consumer.receive(max_nums=4, invisible_ms=60_000):
        consumer.ack(m)
    held = consumer.receive(max_nums=4)
    assert held == []
    Admin(store).reset_offset(GROUP, one_queue, 0, 1)
    again = eventually(lambda: consumer.receive(max_nums=4))  # within the consumer's scan interval
    assert [m.queue_offset for m in again] == [1, 2, 3]


def test_a_reset_drops_what_the_consumer_holds_of_the_queue(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, 3)
    consumer = consumers("c")
    held = consumer.receive(max_nums=1, invisible_ms=60_000)
    Admin(store).reset_offset_by_time(GROUP, one_queue, 0)
    again = eventually(lambda: consumer.receive(max_nums=3))
    assert [m.queue_offset for m in again] == [0, 1, 2]
    with pytest.raises(InvalidReceiptHandleError):
        consumer.ack(held[0])  # dropped by the reset


# ----------------------------------------------------------------------------- the rules, pure
def _row(action: str, consumer: str, seq: int, ts: int, start: int, end: int | None = None, **kw: Any) -> Any:
    return {
        "group": GROUP,
        "consumer_id": consumer,
        "sequence": seq,
        "action": action,
        "topic": "T",
        "queue_id": 0,
        "queue_offset": start,
        "end_offset": end,
        "deadline_ms": kw.get("deadline"),
        "ts_ms": ts,
    }


def test_lease_rules_for_ranges_releases_offline_resets_and_expiry() -> None:
    book = LeaseBook(GROUP)
    book.apply(
        [
            _row(RESET, "a", 0, 100, 10),
            _row(PULL, "a", 1, 100, 10, 14, deadline=500),
            _row(ACK, "a", 2, 110, 10, 12),
            _row(RELEASE, "a", 3, 120, 13, 14, deadline=500),  # never handed out: free, not counted
            _row(PULL, "b", 0, 130, 13, 14, deadline=900),
        ]
    )
    queue = book.queue("T", 0)
    assert queue.floor == 12 and queue.leases[12].consumer_id == "a"
    assert (queue.leases[13].consumer_id, queue.leases[13].deliveries) == ("b", 1)
    book.apply([_row(OFFLINE, "b", 1, 200, 0)])  # b is gone: its lease ends now
    assert queue.expired(200) == [13]
    book.apply([_row(PULL, "c", 0, 210, 13, 14, deadline=800), _row(EXPIRED, "c", 1, 600, 12)])
    assert queue.leases[13].deliveries == 2 and queue.floor == 13
    book.apply([_row(RESET, "%ADMIN%", 5, 700, 0)])
    assert (queue.floor, queue.leases, queue.done) == (0, {}, set())


def test_a_release_ends_only_the_lease_it_names() -> None:
    book = LeaseBook(GROUP)
    book.apply(
        [
            _row(PULL, "a", 0, 100, 5, 6, deadline=200),
            _row(PULL, "a", 1, 250, 5, 6, deadline=400),  # a leases it again after the first ended
            _row(RELEASE, "a", 2, 260, 5, 6, deadline=200),  # a late release of the first lease
        ]
    )
    lease = book.queue("T", 0).leases[5]
    assert (lease.sequence, lease.deadline_ms, lease.deliveries) == (1, 400, 2)


def test_pull_log_rows_expand_a_leased_range_through_the_consume_queue() -> None:
    actions = pa.Table.from_pylist(
        [
            {**_row(PULL, "a", 0, 100, 5, 8, deadline=200), "physical_offset": -1, VERSION_COLUMN: 3},
            {**_row(ACK, "a", 1, 110, 5, 8), "physical_offset": -1, VERSION_COLUMN: 4},
        ]
    )
    physical = {5: 50, 6: 60, 7: 70}
    rows = pull_rows(actions, {}, lambda t, q, s, e: {o: physical[o] for o in range(s, e)}).to_pylist()
    assert [(r["pull_sequence"], r["queue_offset"], r["physical_offset"]) for r in rows] == [
        (0, 5, 50),
        (1, 6, 60),
        (2, 7, 70),
    ]


def test_a_store_from_before_end_offset_gains_the_column(tmp_path: Path) -> None:
    root = tmp_path / "old"
    old = pa.schema([f for f in schemas.ACTION_LOG_SCHEMA if f.name != "end_offset"])
    write_deltalake(str(root / schemas.ACTION_LOG), old.empty_table())
    store = Store.open(root)
    assert "end_offset" in store.read(schemas.ACTION_LOG).column_names


def test_sql92_selector_filters_what_a_simple_consumer_receives(
    store: Store, one_queue: str, consumers: Any
) -> None:
    with Producer(store) as producer:
        producer.send_batch(
            [Message("Q1", f"m{i}".encode(), tags="A", properties={"amount": str(i * 10)}) for i in range(6)]
        )
    dispatch_pending(store)
    consumer = consumers("c", topic="Q1")
    consumer.subscribe("Q1", MessageSelector.by_sql("amount BETWEEN 20 AND 40 AND TAGS = 'A'"))
    got = consumer.receive(max_nums=10)
    assert [m.body for m in got] == [b"m2", b"m3", b"m4"]
    assert consumer.subscriptions == {"Q1": "SQL92: amount BETWEEN 20 AND 40 AND TAGS = 'A'"}
    assert consumer.receive(max_nums=10) == []  # the others were consumed by filtering


def test_a_second_instance_with_the_same_id_adopts_a_live_handle_and_acks_it(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, 2)
    first = consumers("same-id")
    got = first.receive(2, 30_000)
    assert len(got) == 2
    second = consumers("same-id")  # another process with the id (a client on another door)
    adopted = second.adopt(got[0].topic, got[0].queue_id, got[0].queue_offset, got[0].receipt_handle)
    assert (adopted.body, adopted.receipt_handle) == (got[0].body, got[0].receipt_handle)
    second.ack(adopted)
    with pytest.raises(InvalidReceiptHandleError):  # acked: not a live lease any more
        second.adopt(got[0].topic, got[0].queue_id, got[0].queue_offset, got[0].receipt_handle)
    other = consumers("other-id")
    with pytest.raises(InvalidReceiptHandleError):  # not a handle of its id
        other.adopt(got[1].topic, got[1].queue_id, got[1].queue_offset, got[1].receipt_handle)


def test_a_receive_naming_a_topic_gets_only_that_topics_messages(
    store: Store, admin: Admin, one_queue: str, consumers: Any
) -> None:
    admin.create_topic("Q2", 1)
    produce(store, 3)
    produce(store, 3, topic="Q2")
    consumer = consumers("c")
    consumer.subscribe("Q2")
    first = consumer.receive(1, 30_000, topic="Q1")
    assert [m.topic for m in first] == ["Q1"]
    assert sorted(m.body for m in consumer.receive(16, 30_000, topic="Q2")) == [b"m0", b"m1", b"m2"]
    assert {m.topic for m in consumer.receive(16, 30_000, topic="Q1")} == {"Q1"}
    with pytest.raises(ConsumerError):
        consumer.receive(1, 30_000, topic="Q3")


def test_a_retry_topics_message_is_of_the_topic_it_was_first_sent_to() -> None:
    def message(topic: str, properties: dict[str, str]) -> MessageExt:
        return MessageExt(topic, 0, 0, 0, "id", "oid", b"", None, (), properties, 0, 0, 0)

    assert topic_of(message("Q1", {})) == "Q1"
    assert topic_of(message("%RETRY%G", {PROPERTY_RETRY_TOPIC: "Q1"})) == "Q1"
    assert topic_of(message("%RETRY%G", {})) == "%RETRY%G"
