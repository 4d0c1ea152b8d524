"""SimpleConsumer: per-message ack, leases shared message by message, redelivery after the deadline."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import (
    Admin,
    ConsumerError,
    InvalidArgumentError,
    Message,
    MessageExt,
    Producer,
    SimpleConsumer,
    Store,
    TopicNotFoundError,
)
from engine.broker.dispatch import dispatch_pending
from engine.client.simple import ReceivedMessage
from engine.config import load_config
from engine.errors import InvalidReceiptHandleError, ReceiptHandleExpiredError
from engine.protocol.actions import ACK, CHANGE_INVISIBLE, EXPIRED, NACK, PULL
from engine.protocol.lease_book import LeaseBook
from engine.store.action_log import read_actions
from engine.store.consumer_offset import OffsetStore
from tests.helpers import eventually, versions

GROUP = "G"


@pytest.fixture
def one_queue(admin: Admin) -> str:
    admin.create_topic("Q1", 1)
    return "Q1"


@pytest.fixture
def consumers(store: Store) -> Iterator[Callable[..., SimpleConsumer]]:
    made: list[SimpleConsumer] = []

    def make(consumer_id: str | None = None, group: str = GROUP, **kwargs: Any) -> SimpleConsumer:
        consumer = SimpleConsumer(store, group, consumer_id, **kwargs)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


def produce(store: Store, topic: str, n: int, tags: str | None = None, start: int = 0) -> list[bytes]:
    with Producer(store) as producer:
        bodies = [f"m{i}".encode() for i in range(start, start + n)]
        for body in bodies:
            producer.send(Message(topic, body, tags=tags))
    dispatch_pending(store)
    return bodies


def subscribed(consumers: Callable[..., SimpleConsumer], topic: str, *ids: str) -> list[SimpleConsumer]:
    """One consumer per id, each subscribed to ``topic``."""
    made = [consumers(consumer_id) for consumer_id in ids]
    for consumer in made:
        consumer.subscribe(topic)
    return made


def actions(store: Store, action: str | None = None) -> list[dict[str, Any]]:
    return read_actions(store, GROUP, action)


def covered(rows: list[dict[str, Any]]) -> list[int]:
    """The queue offsets action rows cover (a range row covers [queue_offset, end_offset))."""
    out: list[int] = []
    for r in rows:
        end = r["end_offset"] if r["end_offset"] is not None else r["queue_offset"] + 1
        out.extend(range(r["queue_offset"], end))
    return sorted(out)


# ----------------------------------------------------------------------------- basics
def test_receive_returns_messages_and_ack_finishes_them(store: Store, one_queue: str, consumers: Any) -> None:
    bodies = produce(store, one_queue, 5)
    [consumer] = subscribed(consumers, one_queue, "c1")
    got = consumer.receive(max_nums=10)
    assert [m.body for m in got] == bodies
    assert all(isinstance(m, ReceivedMessage) and m.reconsume_times == 0 for m in got)
    assert all(m.receipt_handle.startswith("c1#") for m in got)
    [lease] = actions(store, PULL)  # one lease for the five, durable before receive returned
    assert (lease["queue_offset"], lease["end_offset"]) == (0, 5)
    for m in got:
        consumer.ack(m)
    consumer.flush()
    [acks] = actions(store, ACK)  # acks travel as ranges
    assert covered([acks]) == [0, 1, 2, 3, 4]
    assert consumer.receive() == []


def test_acks_are_flushed_in_the_background(store: Store, one_queue: str, consumers: Any) -> None:
    produce(store, one_queue, 3)
    consumer = consumers("c1", ack_linger_ms=20)
    consumer.subscribe(one_queue)
    for m in consumer.receive():
        consumer.ack(m)
    assert eventually(lambda: covered(actions(store, ACK)) == [0, 1, 2])


def test_two_consumers_on_one_queue_get_disjoint_messages(
    store: Store, one_queue: str, consumers: Any
) -> None:
    bodies = produce(store, one_queue, 10)
    a, b = subscribed(consumers, one_queue, "a", "b")
    got_a = a.receive(max_nums=4)
    got_b = b.receive(max_nums=4)
    got_a2 = a.receive(max_nums=4)
    seen = [m.body for m in got_a + got_b + got_a2]
    assert sorted(seen) == sorted(bodies)
    assert len(set(seen)) == len(seen) == 10


def test_concurrent_consumers_never_share_a_message(store: Store, one_queue: str, consumers: Any) -> None:
    bodies = produce(store, one_queue, 40)
    group = [consumers(f"c{i}") for i in range(3)]  # more consumers than queues
    received: dict[str, list[bytes]] = {c.consumer_id: [] for c in group}
    errors: list[BaseException] = []

    def run(consumer: SimpleConsumer) -> None:
        try:
            consumer.subscribe(one_queue)
            idle_until = time.monotonic() + 3
            while time.monotonic() < idle_until:
                got = consumer.receive(max_nums=3)
                if got:
                    idle_until = time.monotonic() + 3
                for m in got:
                    received[consumer.consumer_id].append(m.body)
                    consumer.ack(m)
                if sum(len(v) for v in received.values()) >= len(bodies):
                    return
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in group]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    everything = [b for got in received.values() for b in got]
    assert sorted(everything) == sorted(bodies)  # each message exactly once: no overlap, no loss


def _consume_in_process(root: str, consumer_id: str, out: Any) -> None:
    """A consumer process: receive and ack until nothing came for 2 s."""
    store = Store.open(root)
    consumer = SimpleConsumer(store, GROUP, consumer_id)
    consumer.subscribe("Q1")
    idle_until = time.monotonic() + 2
    try:
        while time.monotonic() < idle_until:
            got = consumer.receive(max_nums=4, invisible_ms=60_000)
            if got:
                idle_until = time.monotonic() + 2
            for m in got:
                out.put(m.body)
                consumer.ack(m)
    finally:
        consumer.close()
        out.put(None)


def test_consumers_in_separate_processes_never_share_a_message(store: Store, one_queue: str) -> None:
    import multiprocessing

    bodies = produce(store, one_queue, 24)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_consume_in_process, args=(store.root, f"p{i}", out)) for i in range(2)]
    for p in procs:
        p.start()
    got: list[bytes] = []
    finished = 0
    deadline = time.monotonic() + 60
    while finished < len(procs) and time.monotonic() < deadline:
        try:
            item = out.get(timeout=1)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        if item is None:
            finished += 1
        else:
            got.append(item)
    for p in procs:
        p.join(30)
    assert finished == len(procs)
    assert sorted(got) == sorted(bodies)  # every message once: no overlap, no loss


# ----------------------------------------------------------------------------- invisibility
def test_unacked_message_is_delivered_again_after_its_deadline(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, one_queue, 1)
    dying, survivor = subscribed(consumers, one_queue, "dying", "survivor")
    first = dying.receive(invisible_ms=300)
    assert len(first) == 1 and first[0].reconsume_times == 0
    # "dies": never acks. While invisible, nobody else gets it; afterwards the survivor does.
    again = eventually(lambda: survivor.receive(invisible_ms=30_000))
    assert [m.body for m in again] == [first[0].body]
    assert again[0].reconsume_times == 1
    assert again[0].queue_offset == first[0].queue_offset
    pulls = actions(store, PULL)
    assert [(r["consumer_id"], r["reconsume_times"]) for r in sorted(pulls, key=lambda r: r["ts_ms"])] == [
        ("dying", 0),
        ("survivor", 1),
    ]


def test_message_is_invisible_to_the_group_until_its_deadline(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, one_queue, 1)
    a, b = subscribed(consumers, one_queue, "a", "b")
    assert len(a.receive(invisible_ms=60_000)) == 1
    assert b.receive() == []
    assert a.receive() == []  # the holder does not get it twice either


def test_acked_message_is_never_delivered_again(store: Store, one_queue: str, consumers: Any) -> None:
    produce(store, one_queue, 2)
    a, b = subscribed(consumers, one_queue, "a", "b")
    got = a.receive(invisible_ms=200)
    a.ack(got[0])
    a.flush()
    time.sleep(0.3)  # both deadlines have passed; only the unacked one comes back
    again = eventually(lambda: b.receive())
    assert [m.queue_offset for m in again] == [got[1].queue_offset]
    b.ack(again[0])
    b.flush()
    time.sleep(0.3)
    assert b.receive() == [] and a.receive() == []


def test_change_invisible_time_extends_the_deadline(store: Store, one_queue: str, consumers: Any) -> None:
    produce(store, one_queue, 1)
    a, b = subscribed(consumers, one_queue, "a", "b")
    [message] = a.receive(invisible_ms=300)
    changed = a.change_invisible_time(message, 60_000)
    [row] = actions(store, CHANGE_INVISIBLE)
    assert row["consumer_id"] == "a" and row["deadline_ms"] >= message.invisible_until_ms + 50_000
    assert changed.invisible_until_ms == row["deadline_ms"]
    assert changed.receipt_handle == f"a#{row['sequence']}" != message.receipt_handle
    time.sleep(0.4)  # past the original deadline
    assert b.receive() == []
    a.ack(message)  # the first handle of this delivery still acks it


def test_change_invisible_time_after_takeover_raises(store: Store, one_queue: str, consumers: Any) -> None:
    produce(store, one_queue, 1)
    a, b = subscribed(consumers, one_queue, "a", "b")
    [message] = a.receive(invisible_ms=100)
    assert eventually(lambda: b.receive())
    before = versions(store)
    with pytest.raises(ReceiptHandleExpiredError):
        a.change_invisible_time(message, 10_000)
    with pytest.raises(InvalidReceiptHandleError):
        a.nack(message)
    with pytest.raises(InvalidReceiptHandleError):
        a.ack(message)
    assert versions(store) == before


def test_nack_records_a_nack_and_the_message_leaves_the_queue(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, one_queue, 1)
    a, b = subscribed(consumers, one_queue, "a", "b")
    [message] = a.receive(invisible_ms=100)
    a.nack(message)
    [row] = actions(store, NACK)
    assert (row["consumer_id"], row["queue_offset"], row["msg_id"]) == ("a", 0, message.msg_id)
    time.sleep(0.2)
    assert b.receive() == []  # the retry job brings it back through %RETRY%G, not the original queue
    with pytest.raises(InvalidArgumentError):
        a.ack(message)


def test_nacked_message_comes_back_through_the_retry_topic(
    store: Store, one_queue: str, consumers: Any
) -> None:
    retry = pytest.importorskip("engine.broker.retry")
    schedule = pytest.importorskip("engine.broker.schedule")
    produce(store, one_queue, 1)
    [consumer] = subscribed(consumers, one_queue, "a")
    [message] = consumer.receive()
    consumer.nack(message)
    assert retry.route_retries(store) == 1
    dispatch_pending(store)
    assert schedule.deliver_due(store, now_ms=int(time.time() * 1000) + 3_600_000) == 1
    dispatch_pending(store)
    [again] = consumer.receive()
    assert again.topic == "%RETRY%G" and again.body == message.body
    assert again.reconsume_times == 1


def test_too_many_deliveries_are_dead_lettered_with_the_right_count(tmp_path: Any) -> None:
    from engine.broker.retry import route_retries

    store = Store.open(tmp_path / "s", config=load_config(max_reconsume_times=1))
    Admin(store).create_topic("Q1", 1)
    produce(store, "Q1", 1)
    consumer = SimpleConsumer(store, GROUP, "a")
    consumer.subscribe("Q1")
    try:
        # eventually: a receive right after subscribing may come before the consumer's queues are
        # allocated (seen on a loaded machine before and after direct commit-log appends)
        assert [m.reconsume_times for m in eventually(lambda: consumer.receive(invisible_ms=50))] == [0]
        assert [m.reconsume_times for m in eventually(lambda: consumer.receive(invisible_ms=50))] == [1]
        time.sleep(0.1)
        # The third delivery would exceed 1 reconsume: the consumer that finds the expired lease
        # records EXPIRED with the failed delivery's count, and the retry job dead-letters it.
        assert eventually(lambda: read_actions(store, GROUP, EXPIRED) or consumer.receive())
        assert consumer.receive() == []
        [expired] = read_actions(store, GROUP, EXPIRED)
        assert expired["reconsume_times"] == 1
        assert route_retries(store) == 1
        [dead] = [r for r in store.read("commit_log").to_pylist() if r["topic"] == "%DLQ%G"]
        assert dead["reconsume_times"] == 2  # two failed deliveries, not three
    finally:
        consumer.close()


def test_dead_letter_sends_a_received_message_to_the_dlq_at_its_first_delivery(
    store: Store, one_queue: str, consumers: Any
) -> None:
    from engine.broker.retry import route_retries

    produce(store, one_queue, 1)
    [consumer] = subscribed(consumers, one_queue, "a")
    [message] = consumer.receive()
    consumer.dead_letter(message)
    [row] = actions(store, NACK)
    assert row["reconsume_times"] == store.config.max_reconsume_times  # counted as the last delivery
    with pytest.raises(InvalidReceiptHandleError):
        consumer.ack(message)  # no longer held
    assert route_retries(store) == 1
    [dead] = [r for r in store.read("commit_log").to_pylist() if r["topic"] == "%DLQ%G"]
    assert dead["body"] == message.body and dead["uniq_key"] == message.msg_id


# ----------------------------------------------------------------------------- state from the log
def test_a_new_consumer_rebuilds_the_leases_from_the_action_log(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, one_queue, 4)
    [first] = subscribed(consumers, one_queue, "first")
    got = first.receive(max_nums=3, invisible_ms=60_000)
    first.ack(got[0])
    first.close()
    [late] = subscribed(consumers, one_queue, "late")
    assert [m.queue_offset for m in late.receive()] == [3]  # 0 acked, 1 and 2 still invisible


def test_a_restarted_consumer_id_continues_its_sequences(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, one_queue, 2)
    [one] = subscribed(consumers, one_queue, "same")
    one.ack(one.receive(max_nums=1)[0])
    one.close()
    [two] = subscribed(consumers, one_queue, "same")
    two.ack(two.receive(max_nums=1)[0])
    two.close()
    sequences = [r["sequence"] for r in actions(store)]
    assert sequences == sorted(set(sequences))


def test_floors_are_persisted_as_consumer_offsets(store: Store, one_queue: str, consumers: Any) -> None:
    produce(store, one_queue, 3)
    [consumer] = subscribed(consumers, one_queue, "c")
    got = consumer.receive()
    consumer.ack(got[0])
    consumer.ack(got[2])
    consumer.close()
    assert OffsetStore(store, GROUP).read(one_queue) == {(one_queue, 0): 1}  # offset 1 is unacked


def test_tag_expression_filters_messages(store: Store, one_queue: str, consumers: Any) -> None:
    produce(store, one_queue, 2, tags="TagA")
    produce(store, one_queue, 2, tags="TagB", start=2)
    consumer = consumers("c")
    consumer.subscribe(one_queue, "TagB || TagC")
    got = consumer.receive()
    assert [(m.body, m.tags) for m in got] == [(b"m2", "TagB"), (b"m3", "TagB")]


def test_receive_spans_every_queue_of_a_topic(store: Store, topic: str, consumers: Any) -> None:
    bodies = produce(store, topic, 8)  # round robin over 4 queues
    consumer = consumers("c")
    consumer.subscribe(topic)
    got = consumer.receive(max_nums=32)
    assert sorted(m.body for m in got) == sorted(bodies)
    assert {m.queue_id for m in got} == {0, 1, 2, 3}


def test_receive_waits_for_new_messages(store: Store, one_queue: str, consumers: Any) -> None:
    [consumer] = subscribed(consumers, one_queue, "c")
    timer = threading.Timer(0.3, produce, args=(store, one_queue, 1))
    timer.start()
    try:
        got = consumer.receive(wait_ms=15_000)
    finally:
        timer.join()
    assert [m.body for m in got] == [b"m0"]


# ----------------------------------------------------------------------------- bad input
def test_bad_input_raises_typed_errors_and_writes_nothing(
    store: Store, one_queue: str, consumers: Any
) -> None:
    produce(store, one_queue, 1)
    consumer = consumers("c")
    before = versions(store)
    with pytest.raises(ConsumerError):
        consumer.receive()  # nothing subscribed
    with pytest.raises(TopicNotFoundError):
        consumer.subscribe("NoSuchTopic")
    with pytest.raises(InvalidArgumentError):
        consumer.subscribe(one_queue, "A || ")
    consumer.subscribe(one_queue)
    for bad in ({"max_nums": 0}, {"max_nums": 2000}, {"invisible_ms": 0}, {"wait_ms": -1}):
        with pytest.raises(InvalidArgumentError):
            consumer.receive(**bad)
    stranger = MessageExt("Q1", 0, 0, 0, "X" * 32, "u", b"x", None, (), {}, 0, 0, 0)
    with pytest.raises(InvalidArgumentError):
        consumer.ack(stranger)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        consumer.nack(stranger)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        consumer.ack("not a message")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        SimpleConsumer(store, "bad group!")
    with pytest.raises(InvalidArgumentError):
        SimpleConsumer(store, GROUP, invisible_ms_default=0)
    assert versions(store) == before
    [message] = consumer.receive()
    with pytest.raises(InvalidArgumentError):
        consumer.change_invisible_time(message, 0)
    consumer.ack(message)
    with pytest.raises(InvalidReceiptHandleError):
        consumer.ack(message)  # twice


# ----------------------------------------------------------------------------- the rules, pure
def _row(
    action: str,
    consumer: str,
    seq: int,
    ts: int,
    offset: int = 0,
    deadline: int | None = None,
    end: Any = None,
) -> Any:
    return {
        "end_offset": end,
        "group": GROUP,
        "consumer_id": consumer,
        "sequence": seq,
        "action": action,
        "topic": "T",
        "queue_id": 0,
        "queue_offset": offset,
        "ts_ms": ts,
        "deadline_ms": deadline,
    }


def test_lease_rules_first_valid_pull_wins_until_its_deadline() -> None:
    book = LeaseBook(GROUP)
    book.apply(
        [
            _row(PULL, "a", 0, 100, deadline=200),
            _row(PULL, "b", 0, 150, deadline=250),  # too early: ignored
            _row(CHANGE_INVISIBLE, "b", 1, 160, deadline=900),  # not the holder: ignored
            _row(CHANGE_INVISIBLE, "a", 1, 190, deadline=400),  # holder, in time: extends
            _row(PULL, "b", 2, 300, deadline=500),  # still before 400: ignored
            _row(PULL, "b", 3, 400, deadline=600),  # takes over
        ]
    )
    lease = book.lease(("T", 0, 0))
    assert lease is not None and (lease.consumer_id, lease.deadline_ms, lease.deliveries) == ("b", 600, 2)
    book.apply([_row(NACK, "a", 2, 450)])  # the former holder cannot nack
    assert not book.is_done(("T", 0, 0))
    book.apply([_row(ACK, "a", 3, 460)])  # but its ack counts: the message was processed
    assert book.is_done(("T", 0, 0)) and book.queue("T", 0).floor == 1
    book.apply([_row(PULL, "c", 0, 9_999, deadline=10_000)])
    assert book.lease(("T", 0, 0)) is None


def test_lease_rules_snapshot_order_matches_commit_order() -> None:
    rows = [
        _row(PULL, "a", 0, 100, 0, 200),
        _row(PULL, "a", 1, 100, 1, 200),
        _row(PULL, "b", 0, 120, 2, 300),
        _row(ACK, "a", 2, 130, 0),
        _row(PULL, "b", 1, 250, 1, 450),
        _row(NACK, "b", 2, 260, 2),
        _row(ACK, "a", 3, 270, 1),  # late ack of a taken-over message still finishes it
    ]
    in_order, shuffled = LeaseBook(GROUP), LeaseBook(GROUP)
    in_order.apply(rows)
    shuffled.bootstrap(list(reversed(rows)))
    for book in (in_order, shuffled):
        assert book.queue("T", 0).floor == 3
        assert book.sequences == {"a": 3, "b": 2}
