"""FIFO groups: a SimpleConsumer of a FIFO group receives each queue in order, the next messages only
after the previous are acked or dead-lettered (RocketMQ 5's orderly POP; engine.client.simple.leases)."""

from __future__ import annotations

import gc
import hashlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import Admin, Message, Producer, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.client.offsets import ConsumeFrom
from engine.client.simple.leases import Leases
from engine.config import load_config
from engine.errors import InvalidArgumentError
from engine.protocol.actions import ACK, EXPIRED, PULL
from engine.protocol.lease_book import FIFO_AGAIN, FIFO_FRESH, FIFO_HELD, LeaseBook
from engine.protocol.messages import message_group_queue
from engine.protocol.names import PROPERTY_SHARDING_KEY
from engine.protocol.selectors import MessageSelector
from engine.store.action_log import read_actions
from tests.helpers import eventually

GROUP = "GF"


@pytest.fixture
def consumers(store: Store) -> Iterator[Callable[..., SimpleConsumer]]:
    made: list[SimpleConsumer] = []

    def make(consumer_id: str, topic: str = "F", **kwargs: Any) -> SimpleConsumer:
        consumer = SimpleConsumer(store, GROUP, consumer_id, fifo=True, **kwargs)
        consumer.subscribe(topic)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


def produce(store: Store, topic: str, n: int, group: str | None = None, prefix: str = "m") -> list[bytes]:
    bodies = [f"{prefix}{i}".encode() for i in range(n)]
    with Producer(store) as producer:
        for body in bodies:
            producer.send(Message(topic, body), message_group=group)
    dispatch_pending(store)
    return bodies


def bodies_of(messages: list[Any]) -> list[bytes]:
    return [m.body for m in messages]


# ----------------------------------------------------------------------------- the pure rules
def _row(action: str, offset: int, end: int | None = None, deadline: int | None = None, ts: int = 0) -> dict:
    return {
        "group": "G",
        "consumer_id": "c",
        "sequence": ts,
        "action": action,
        "topic": "T",
        "queue_id": 0,
        "queue_offset": offset,
        "end_offset": end,
        "deadline_ms": deadline,
        "ts_ms": ts,
    }


def test_fifo_rule_holds_a_queue_while_any_message_of_its_range_is_leased() -> None:
    book = LeaseBook("G")
    book.apply([_row(PULL, 0, 3, deadline=100, ts=1)])
    queue = book.queue("T", 0)
    assert queue.fifo_next(50) == (FIFO_HELD, [])
    book.apply([_row(ACK, 0, ts=2)])  # the head acked; 1 and 2 still held
    assert queue.fifo_next(50) == (FIFO_HELD, [])
    # The lease ended: the same unfinished offsets again, in order, never the next range.
    assert queue.fifo_next(100) == (FIFO_AGAIN, [1, 2])
    book.apply([_row(ACK, 1, 3, ts=3)])
    assert queue.fifo_next(100) == (FIFO_FRESH, [])


def test_message_group_queue_is_rocketmq5_python_clients_choice() -> None:
    for group in ["order-1", "order-2", "用户-7"]:
        expected = int.from_bytes(hashlib.sha256(group.encode()).digest(), "big") % 8
        assert message_group_queue(group, 8) == expected
    assert {message_group_queue(f"g{i}", 4) for i in range(64)} == {0, 1, 2, 3}
    with pytest.raises(InvalidArgumentError):
        message_group_queue(" ", 4)


# ----------------------------------------------------------------------------- producer and settings
def test_a_message_group_goes_to_one_queue_and_is_kept(store: Store, admin: Admin) -> None:
    admin.create_topic("F", 4)
    with Producer(store) as producer:
        results = [producer.send(Message("F", b"x"), message_group="order-9") for _ in range(5)]
        with pytest.raises(InvalidArgumentError):
            producer.send(Message("F", b"x"), queue_id=0, message_group="order-9")
    assert {r.queue_id for r in results} == {message_group_queue("order-9", 4)}
    dispatch_pending(store)
    stored = store.read("commit_log").to_pylist()
    assert {dict(r["properties"])[PROPERTY_SHARDING_KEY] for r in stored} == {"order-9"}


def test_fifo_is_a_group_setting_consumers_take(store: Store, admin: Admin) -> None:
    assert admin.group_config(GROUP).fifo is False
    assert admin.update_group(GROUP, fifo=True).fifo is True
    assert admin.group_config(GROUP).fifo is True
    assert admin.group_config("other").fifo is False
    with SimpleConsumer(store, GROUP, "c") as consumer:
        assert consumer.fifo is True
    admin.update_group(GROUP, fifo=False)
    with SimpleConsumer(store, GROUP, "c") as consumer:
        assert consumer.fifo is False
    with pytest.raises(InvalidArgumentError):
        admin.update_group(GROUP, fifo="yes")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- ordered delivery
def test_each_message_group_is_received_in_order_across_receives(any_store: Store) -> None:
    store = any_store
    Admin(store).create_topic("F", 4)
    sent = {g: produce(store, "F", 6, group=g, prefix=f"{g}-") for g in ("a", "b", "c")}
    got: dict[str, list[bytes]] = {g: [] for g in sent}
    with SimpleConsumer(store, GROUP, "c1", fifo=True) as consumer:
        consumer.subscribe("F")

        def drain() -> bool:
            for m in consumer.receive(4, wait_ms=200):
                got[m.body.decode().split("-")[0]].append(m.body)
                consumer.ack(m)
            return sum(map(len, got.values())) == 18

        assert eventually(drain, timeout_s=60)
    assert got == sent


def test_the_next_message_waits_for_the_ack_of_the_previous(
    store: Store, admin: Admin, consumers: Any
) -> None:
    admin.create_topic("F", 1)
    produce(store, "F", 3)
    first, other = consumers("c1"), consumers("c2")
    [m0] = eventually(lambda: first.receive(1))
    assert m0.body == b"m0"
    # The queue is held: neither this consumer nor another gets m1 while m0 is unacked.
    assert first.receive(1) == []
    assert other.receive(1) == []
    first.ack(m0)
    [m1] = other.receive(1, wait_ms=2000)
    assert m1.body == b"m1" and m1.reconsume_times == 0
    other.ack(m1)
    assert bodies_of(first.receive(2, wait_ms=2000)) == [b"m2"]


def test_one_receive_may_take_several_in_order_and_the_rest_waits_for_all(
    store: Store, admin: Admin, consumers: Any
) -> None:
    admin.create_topic("F", 1)
    produce(store, "F", 4)
    consumer = consumers("c1")
    batch = eventually(lambda: consumer.receive(2))
    assert bodies_of(batch) == [b"m0", b"m1"]
    consumer.ack(batch[1])  # acked out of order: m0 still holds the queue
    assert consumer.receive(2) == []
    consumer.ack(batch[0])
    assert bodies_of(consumer.receive(2, wait_ms=2000)) == [b"m2", b"m3"]


# ----------------------------------------------------------------------------- redelivery
def test_an_expired_lease_gives_the_same_head_again(store: Store, admin: Admin, consumers: Any) -> None:
    admin.create_topic("F", 1)
    produce(store, "F", 2)
    dying, survivor = consumers("dying"), consumers("survivor")
    assert bodies_of(eventually(lambda: dying.receive(1, invisible_ms=300))) == [b"m0"]
    again = eventually(lambda: survivor.receive(1))
    assert bodies_of(again) == [b"m0"] and again[0].reconsume_times == 1
    survivor.ack(again[0])
    assert bodies_of(survivor.receive(1, wait_ms=2000)) == [b"m1"]


def test_nack_gives_the_message_back_in_place(store: Store, admin: Admin, consumers: Any) -> None:
    admin.create_topic("F", 1)
    produce(store, "F", 2)
    consumer = consumers("c1")
    [m0] = eventually(lambda: consumer.receive(1))
    consumer.nack(m0)
    [again] = consumer.receive(1, wait_ms=2000)
    assert again.body == b"m0" and again.reconsume_times == 1
    assert read_actions(store, GROUP, "NACK") == []  # not routed to the retry topic


def test_past_the_most_deliveries_the_head_is_dead_lettered_and_the_queue_moves_on(tmp_path: Any) -> None:
    from engine.broker.retry import route_retries

    store = Store.open(tmp_path / "s", config=load_config(max_reconsume_times=1))
    Admin(store).create_topic("F", 1)
    produce(store, "F", 2)
    with SimpleConsumer(store, GROUP, "c", fifo=True) as consumer:
        consumer.subscribe("F")
        counts = []
        for _ in range(2):
            [m] = eventually(lambda: consumer.receive(1, invisible_ms=50))
            assert m.body == b"m0"
            counts.append(m.reconsume_times)
        assert counts == [0, 1]
        # The third delivery would pass the limit: m0 is dead-lettered and m1 comes next.
        [m1] = eventually(lambda: consumer.receive(1))
        assert m1.body == b"m1" and m1.reconsume_times == 0
    [expired] = read_actions(store, GROUP, EXPIRED)
    assert expired["queue_offset"] == 0
    assert route_retries(store) == 1
    [dead] = [r for r in store.read("commit_log").to_pylist() if r["topic"] == f"%DLQ%{GROUP}"]
    assert dead["body"] == b"m0"


def test_a_consumer_back_with_its_id_gets_its_head_at_once(
    store: Store, admin: Admin, consumers: Any
) -> None:
    admin.create_topic("F", 1)
    produce(store, "F", 2)
    first = SimpleConsumer(store, GROUP, "same", fifo=True)
    first.subscribe("F")
    assert bodies_of(eventually(lambda: first.receive(1, invisible_ms=60_000))) == [b"m0"]
    first.close()  # what it received stays leased to its id until the invisible time ends
    again = consumers("same")
    [m0] = again.receive(1)
    assert m0.body == b"m0" and m0.reconsume_times == 0
    assert consumers("other").receive(1) == []  # still held, by "same"


def test_a_consumer_dropped_without_close_leaves_its_head_to_another(
    store: Store, admin: Admin, consumers: Any
) -> None:
    admin.create_topic("F", 1)
    produce(store, "F", 2)
    crashed = [SimpleConsumer(store, GROUP, "crashed", fifo=True)]
    crashed[0].subscribe("F")
    assert bodies_of(eventually(lambda: crashed[0].receive(1, invisible_ms=500))) == [b"m0"]
    crashed.clear()  # dropped without close(), as by a crash of its owner
    gc.collect()
    other = consumers("other")
    again = eventually(lambda: other.receive(1))
    assert bodies_of(again) == [b"m0"] and again[0].reconsume_times == 1


# ----------------------------------------------------------------------------- concurrency
def test_a_decision_on_a_stale_book_loses_the_race(store: Store, admin: Admin, consumers: Any) -> None:
    admin.create_topic("F", 1)
    produce(store, "F", 2)
    late = Leases(store, GROUP, "late", ConsumeFrom.LAST, 0, lambda m: 16, fifo=True)
    late.start()  # its book is read now: the queue is free
    holder = consumers("holder")
    assert bodies_of(eventually(lambda: holder.receive(1))) == [b"m0"]
    # On the old book the queue looks free; the commit conflicts and nothing is leased.
    late._index.refresh()
    assert late._lease_fifo_queue("F", 0, MessageSelector.by_tag("*"), 1, 30_000) is None
    assert late.lease([("F", 0, MessageSelector.by_tag("*"))], 1, 30_000) == 0
    assert late.waiting == 0 and late.conflicts == 1


def test_two_consumers_never_hold_one_queue_at_once(store: Store, admin: Admin, consumers: Any) -> None:
    admin.create_topic("F", 1)
    sent = produce(store, "F", 20)
    lock = threading.Lock()
    holder: list[str | None] = [None]
    order: list[bytes] = []
    overlaps: list[str] = []

    threads = []
    for name in ("c1", "c2"):
        consumer = consumers(name)

        def run(c: SimpleConsumer = consumer) -> None:
            while True:
                with lock:
                    if len(order) >= len(sent):
                        return
                got = c.receive(2, invisible_ms=60_000, wait_ms=100)
                with lock:
                    for m in got:
                        if holder[0] not in (None, c.consumer_id):
                            overlaps.append(f"{c.consumer_id} got {m.body!r} while {holder[0]} held")
                        holder[0] = c.consumer_id
                        order.append(m.body)
                if not got:
                    continue
                # Free in the record first, then ack: the record never shows free a queue that
                # is still held, so another consumer's receive meanwhile is an overlap.
                with lock:
                    holder[0] = None
                for m in got:
                    c.ack(m)

        threads.append(threading.Thread(target=run))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert overlaps == []
    assert order == sent
