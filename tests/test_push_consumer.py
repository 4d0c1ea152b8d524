"""PushConsumer: rebalance, offsets, broadcasting, consume-from, orderly locks, NACKs, bad input.

Messages become pullable through ``dispatch_pending`` run by a background thread (no Spark).
Intervals are shortened so the group reacts in a fraction of a second; every "eventually"
condition is polled against a generous deadline, never timed.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import (
    Admin,
    ConsumeFrom,
    ConsumerClosedError,
    ConsumerError,
    ConsumeResult,
    InvalidArgumentError,
    InvalidTopicError,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    Producer,
    ProducerClosedError,
    PushConsumer,
    Store,
    TopicNotFoundError,
)
from engine.broker.dispatch import dispatch_pending
from engine.client.membership import GroupMembership, live_members
from engine.protocol import PROPERTY_RETRY_TOPIC, retry_topic
from engine.protocol.actions import ACK, NACK, PULL
from engine.store import schemas
from engine.store.action_log import ActionLogWriter, read_actions
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.stamping import PendingMessage
from engine.store.consumer_offset import OffsetStore
from engine.store.groups import LOCK, UNLOCK
from engine.store.store import now_ms
from tests.helpers import versions

FAST: dict[str, Any] = {
    "heartbeat_interval_ms": 100,
    "member_timeout_ms": 1_500,
    "rebalance_interval_ms": 150,
    "commit_interval_ms": 200,
    "pull_suspend_ms": 200,
    "lock_ttl_ms": 3_000,
    "relock_interval_ms": 500,
    "suspend_current_queue_ms": 30,
}
DEADLINE_S = 20.0


def eventually(condition: Callable[[], bool], timeout: float = DEADLINE_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.03)
    raise AssertionError(f"{what} did not hold within {timeout} s")


# One dispatcher at a time: dispatch_pending calls racing on one Store object can dispatch a
# version twice (they share the store's table handle, so the optimistic commit does not conflict).
_DISPATCH = threading.Lock()


def dispatch(store: Store) -> None:
    with _DISPATCH:
        dispatch_pending(store)


@pytest.fixture
def dispatcher(store: Store) -> Iterator[None]:
    """Dispatches new commit-log versions continuously, as the dispatch job would."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            dispatch(store)
            stop.wait(0.03)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


class Collector:
    """A thread-safe listener recording what it consumed, optionally failing on purpose."""

    def __init__(self, fail: Callable[[MessageExt], bool] | None = None) -> None:
        self.lock = threading.Lock()
        self.messages: list[MessageExt] = []
        self.calls: list[MessageExt] = []
        self.fail = fail

    def __call__(self, messages: list[MessageExt]) -> ConsumeResult:
        with self.lock:
            self.calls.extend(messages)
            if self.fail is not None and any(self.fail(m) for m in messages):
                return ConsumeResult.RECONSUME_LATER
            self.messages.extend(messages)
        return ConsumeResult.SUCCESS

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.messages]


def consumer(
    store: Store,
    group: str,
    topic: str = "T",
    listener: Any = None,
    *,
    orderly: bool = False,
    expression: str = "*",
    **kwargs: Any,
) -> PushConsumer:
    c = PushConsumer(store, group, **{**FAST, **kwargs})
    c.subscribe(topic, expression)
    c.register_listener(listener or Collector(), orderly=orderly)
    return c


def send(store: Store, bodies: list[str], topic: str = "T", queue_id: int | None = None) -> None:
    """Send in one batch per queue: round robin over the topic's 4 queues, or all to ``queue_id``."""
    by_queue: dict[int, list[Message]] = defaultdict(list)
    for i, body in enumerate(bodies):
        by_queue[i % 4 if queue_id is None else queue_id].append(Message(topic, body.encode()))
    with Producer(store) as p:
        for qid, messages in by_queue.items():
            p.send_batch(messages, queue_id=qid)


def topic_queues(c: PushConsumer, topic: str = "T") -> list[int]:
    return [mq.queue_id for mq in c.assignment() if mq.topic == topic]


def committed(store: Store, group: str, topic: str = "T", consumer_id: str = "") -> dict[int, int]:
    return {q: o for (t, q), o in OffsetStore(store, group, consumer_id).read(topic).items() if t == topic}


# --------------------------------------------------------------------------- action log
def test_action_log_writer_buffers_and_numbers_actions_per_consumer(store: Store) -> None:
    w = ActionLogWriter(store, "g", "c1")
    assert w.record(NACK, topic="T", queue_id=1, queue_offset=7, physical_offset=700, msg_id="m") == 0
    assert w.record(PULL, topic="T", queue_id=1, queue_offset=8, physical_offset=800, deadline_ms=5) == 1
    assert w.pending == 2 and read_actions(store, "g") == []
    assert w.flush() == 2 and w.pending == 0
    with ActionLogWriter(store, "g", "c1") as again:  # a restarted consumer continues its sequence
        assert again.record(ACK, topic="T", queue_id=1, queue_offset=7, physical_offset=700) == 2
    rows = read_actions(store, "g")
    assert [(r["sequence"], r["action"], r["queue_offset"]) for r in rows] == [
        (0, NACK, 7),
        (1, PULL, 8),
        (2, ACK, 7),
    ]
    assert rows[1]["deadline_ms"] == 5 and rows[0]["msg_id"] == "m"


def test_action_log_writer_rejects_unknown_actions_and_missing_positions(store: Store) -> None:
    w = ActionLogWriter(store, "g", "c1")
    before = versions(store)
    with pytest.raises(InvalidArgumentError, match="unknown"):
        w.record("EXPLODE", topic="T", queue_id=0, queue_offset=0, physical_offset=0)
    with pytest.raises(InvalidArgumentError, match="queue_offset"):
        w.record(NACK, topic="T", queue_id=0)
    with pytest.raises(InvalidArgumentError):
        ActionLogWriter(store, "bad group!", "c1")
    w.close()
    assert versions(store) == before


# --------------------------------------------------------------------------- membership
def test_heartbeats_make_members_live_and_leave_removes_them(store: Store) -> None:
    a = GroupMembership(store, "g", "a", member_timeout_ms=5_000)
    b = GroupMembership(store, "g", "b", member_timeout_ms=5_000)
    a.heartbeat({"T": "*"})
    b.heartbeat({"T": "TagA"})
    assert a.live_members() == ["a", "b"] == live_members(store, "g")
    assert a.subscriptions() == {"a": {"T": "*"}, "b": {"T": "TagA"}}
    b.leave()
    assert a.live_members() == ["a"]
    b.heartbeat()  # a restarted instance with the same id is back
    assert a.live_members() == ["a", "b"]
    assert live_members(store, "other") == []


def test_member_silent_longer_than_the_timeout_is_not_live(store: Store) -> None:
    a = GroupMembership(store, "g", "a", member_timeout_ms=400)
    a.heartbeat()
    assert a.live_members() == ["a"]
    eventually(lambda: a.live_members() == [], timeout=5, what="silent member dropped")


def test_lock_race_exactly_one_member_wins_each_queue(store: Store) -> None:
    members = [GroupMembership(store, "g", f"m{i}", lock_ttl_ms=30_000) for i in range(3)]
    for round_ in range(6):
        mq = MessageQueue("T", round_)
        barrier = threading.Barrier(len(members))
        won: dict[str, set[MessageQueue]] = {}

        def race(
            m: GroupMembership,
            mq: MessageQueue = mq,
            barrier: threading.Barrier = barrier,
            won: dict[str, set[MessageQueue]] = won,
        ) -> None:
            barrier.wait()
            won[m.consumer_id] = m.lock([mq])

        threads = [threading.Thread(target=race, args=(m,)) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [cid for cid, got in won.items() if got == {mq}]
        assert len(winners) == 1, won
        assert [m.consumer_id for m in members if m.is_locked(mq)] == winners
        assert members[0].lock_owners()[mq] == winners[0]
    # The SQL view of the same history: one LOCK row per granted queue, by its holder.
    rows = [r for r in store.read(schemas.GROUPS).to_pylist() if r["event"] == LOCK]
    assert len(rows) == 6
    owners = members[0].lock_owners()
    assert {MessageQueue(r["topic"], r["queue_id"]): r["consumer_id"] for r in rows} == owners


def test_lock_is_renewed_by_its_holder_released_by_unlock_and_taken_after_expiry(store: Store) -> None:
    a = GroupMembership(store, "g", "a", lock_ttl_ms=600)
    b = GroupMembership(store, "g", "b", lock_ttl_ms=600)
    q0, q1 = MessageQueue("T", 0), MessageQueue("T", 1)
    assert a.lock([q0, q1]) == {q0, q1}
    assert b.lock([q0, q1]) == set()
    assert a.lock([q0]) == {q0}  # renewal
    a.unlock([q1])
    assert not a.is_locked(q1)
    assert b.lock([q1]) == {q1}
    assert b.lock([q0]) == set()
    eventually(lambda: b.lock([q0]) == {q0}, timeout=5, what="expired lease taken over")
    assert not a.is_locked(q0)  # a stopped trusting it after half the TTL
    assert a.lock([q0]) == set()
    events = [r["event"] for r in store.read(schemas.GROUPS).to_pylist()]
    assert events.count(UNLOCK) == 1


def test_membership_rejects_bad_settings(store: Store) -> None:
    with pytest.raises(InvalidArgumentError):
        GroupMembership(store, "g", "has space")
    with pytest.raises(InvalidArgumentError):
        GroupMembership(store, "g", "a", lock_ttl_ms=0)
    with pytest.raises(InvalidArgumentError):
        GroupMembership(store, "g", "a", lock_ttl_ms=3_600_000)
    with pytest.raises(InvalidArgumentError):
        GroupMembership(store, "", "a")


# --------------------------------------------------------------------------- rebalance
def test_two_consumers_split_queues_and_the_survivor_takes_all_after_a_leave(
    store: Store, topic: str, dispatcher: None
) -> None:
    a = consumer(store, "g").start()
    eventually(lambda: topic_queues(a) == [0, 1, 2, 3], what="a owns every queue")
    b = consumer(store, "g").start()
    try:
        eventually(
            lambda: (
                sorted(topic_queues(a) + topic_queues(b)) == [0, 1, 2, 3]
                and len(topic_queues(a)) == 2
                and len(topic_queues(b)) == 2
            ),
            what="2/2 split",
        )
        retry = MessageQueue(retry_topic("g"), 0)
        eventually(lambda: (retry in a.assignment()) != (retry in b.assignment()), what="one retry owner")
    finally:
        b.shutdown()
    eventually(lambda: topic_queues(a) == [0, 1, 2, 3], what="a takes every queue back")
    a.shutdown()
    assert live_members(store, "g") == []


def test_member_that_stops_heartbeating_is_dropped_after_the_timeout(
    store: Store, topic: str, dispatcher: None
) -> None:
    ghost = GroupMembership(store, "g", "a-ghost", member_timeout_ms=FAST["member_timeout_ms"])
    ghost.heartbeat({"T": "*"})  # sorts first, so it would own queues 0 and 1
    with consumer(store, "g", instance_id="b-live").start() as c:
        eventually(lambda: topic_queues(c) == [2, 3], timeout=5, what="ghost counted as a member")
        eventually(lambda: topic_queues(c) == [0, 1, 2, 3], what="ghost dropped after the timeout")


def test_every_message_is_consumed_once_by_the_group_across_rebalances(
    store: Store, topic: str, dispatcher: None
) -> None:
    seen = Collector()
    a = consumer(store, "g", listener=seen, consume_from=ConsumeFrom.FIRST).start()
    eventually(lambda: topic_queues(a) == [0, 1, 2, 3], what="a started")
    phase1 = [f"p1-{i}" for i in range(40)]
    send(store, phase1)
    eventually(lambda: len(seen.bodies()) == 40, what="phase 1 consumed")
    eventually(lambda: sum(committed(store, "g").values()) == 40, what="phase 1 committed")

    b = consumer(store, "g", listener=seen, consume_from=ConsumeFrom.FIRST).start()
    eventually(lambda: len(topic_queues(a)) == 2 and len(topic_queues(b)) == 2, what="2/2 split")
    phase2 = [f"p2-{i}" for i in range(40)]
    send(store, phase2)
    eventually(lambda: len(seen.bodies()) == 80, what="phase 2 consumed")
    b.shutdown()
    eventually(lambda: topic_queues(a) == [0, 1, 2, 3], what="a took b's queues")
    phase3 = [f"p3-{i}" for i in range(40)]
    send(store, phase3)
    eventually(lambda: len(seen.bodies()) >= 120, what="phase 3 consumed")
    a.shutdown()
    bodies = [b.decode() for b in seen.bodies()]
    assert sorted(bodies) == sorted(phase1 + phase2 + phase3)  # each exactly once
    assert sum(committed(store, "g").values()) == 120


def test_tag_expression_filters_pushed_messages(store: Store, topic: str, dispatcher: None) -> None:
    seen = Collector()
    with consumer(store, "g", listener=seen, expression="A || C", consume_from="FIRST").start():
        with Producer(store) as p:
            for i, tag in enumerate("ABCAB"):
                p.send(Message("T", f"{tag}{i}".encode(), tags=tag), queue_id=0)
        eventually(lambda: len(seen.bodies()) == 3, what="tagged messages consumed")
        eventually(lambda: committed(store, "g").get(0) == 5, what="offset past filtered entries")
    assert sorted(seen.bodies()) == [b"A0", b"A3", b"C2"]


# --------------------------------------------------------------------------- broadcasting
def test_broadcasting_delivers_every_message_to_every_instance(
    store: Store, topic: str, dispatcher: None
) -> None:
    seen_a, seen_b = Collector(), Collector()
    kw: dict[str, Any] = {"model": MessageModel.BROADCASTING, "consume_from": ConsumeFrom.FIRST}
    a = consumer(store, "g", listener=seen_a, instance_id="inst-a", **kw).start()
    b = consumer(store, "g", listener=seen_b, instance_id="inst-b", **kw).start()
    assert retry_topic("g") not in a.subscriptions()  # broadcasting has no retry topic
    bodies = [f"m{i}" for i in range(20)]
    send(store, bodies)
    expected = sorted(x.encode() for x in bodies)
    eventually(lambda: sorted(seen_a.bodies()) == expected == sorted(seen_b.bodies()), what="both saw all")
    assert topic_queues(a) == topic_queues(b) == [0, 1, 2, 3]
    a.shutdown()
    b.shutdown()
    # Offsets are per instance; a restarted instance resumes where it stopped.
    assert sum(committed(store, "g", consumer_id="inst-a").values()) == 20
    assert committed(store, "g") == {}
    send(store, ["late"])
    again = Collector()
    with consumer(store, "g", listener=again, instance_id="inst-a", **kw).start():
        eventually(lambda: again.bodies() == [b"late"], what="restarted instance resumed")
        time.sleep(0.3)
    assert again.bodies() == [b"late"]


# --------------------------------------------------------------------------- consume from
def _preload(store: Store) -> int:
    """Four old messages per queue; returns a time between them and the rest."""
    send(store, [f"old{i}" for i in range(8)])
    dispatch(store)
    time.sleep(0.05)
    middle = now_ms()
    time.sleep(0.05)
    send(store, [f"mid{i}" for i in range(8)])
    dispatch(store)
    return middle


@pytest.mark.parametrize(
    ("consume_from", "young", "expected_prefixes"),
    [
        (ConsumeFrom.FIRST, False, {"old", "mid", "new"}),
        (ConsumeFrom.LAST, False, {"new"}),
        # RocketMQ's broker: a queue whose first message is still "in memory" starts at 0.
        (ConsumeFrom.LAST, True, {"old", "mid", "new"}),
        (ConsumeFrom.TIMESTAMP, False, {"mid", "new"}),
    ],
)
def test_consume_from_applies_to_a_group_without_offsets(
    store: Store,
    topic: str,
    dispatcher: None,
    monkeypatch: pytest.MonkeyPatch,
    consume_from: ConsumeFrom,
    young: bool,
    expected_prefixes: set[str],
) -> None:
    if not young:  # every queue counts as old: its first message is no longer "in memory"
        monkeypatch.setattr(store, "config", store.config.replace(in_memory_max_bytes=0))
    middle = _preload(store)
    seen = Collector()
    c = consumer(store, "g", listener=seen, consume_from=consume_from, consume_from_timestamp_ms=middle)
    with c.start():
        eventually(lambda: len(committed(store, "g")) == 4, what="start offsets fixed")
        send(store, [f"new{i}" for i in range(8)])
        want = 8 * len(expected_prefixes)
        eventually(lambda: len(seen.bodies()) >= want, what="messages consumed")
        time.sleep(0.3)
    assert {b.decode()[:3] for b in seen.bodies()} == expected_prefixes
    assert len(seen.bodies()) == 8 * len(expected_prefixes)


def test_committed_offsets_win_over_consume_from(store: Store, topic: str, dispatcher: None) -> None:
    send(store, [f"m{i}" for i in range(8)])
    dispatch(store)
    OffsetStore(store, "g").commit([("T", q, 1) for q in range(4)])
    seen = Collector()
    with consumer(store, "g", listener=seen, consume_from=ConsumeFrom.LAST).start():
        eventually(lambda: len(seen.bodies()) == 4, what="resumed from committed offsets")
        time.sleep(0.3)
    assert len(seen.bodies()) == 4 and all(m.queue_offset == 1 for m in seen.messages)


# --------------------------------------------------------------------------- NACK / retry
def test_reconsume_later_and_listener_errors_record_nacks_and_move_on(
    store: Store, topic: str, dispatcher: None
) -> None:
    def listener(messages: list[MessageExt]) -> ConsumeResult:
        body = messages[0].body
        if body == b"boom":
            raise RuntimeError("listener bug")
        return ConsumeResult.RECONSUME_LATER if body == b"later" else ConsumeResult.SUCCESS

    c = consumer(store, "g", listener=listener, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, ["ok", "later", "boom", "ok2"], queue_id=2)
        eventually(lambda: committed(store, "g").get(2) == 4, what="offset moved past the failures")
    nacks = read_actions(store, "g", NACK)
    assert [(r["queue_offset"], r["reconsume_times"]) for r in nacks] == [(1, 0), (2, 0)]
    row = nacks[0]
    assert (row["group"], row["consumer_id"], row["topic"], row["queue_id"]) == ("g", c.instance_id, "T", 2)
    assert row["physical_offset"] >= 0 and len(row["msg_id"]) == 32 and row["ts_ms"] > 0
    assert [r["sequence"] for r in nacks] == [0, 1]


def test_retried_messages_show_their_original_topic(store: Store, topic: str, dispatcher: None) -> None:
    seen = Collector(fail=lambda m: m.reconsume_times >= 20)  # fails forever once past the max
    with consumer(store, "g", listener=seen, max_reconsume_times=20).start() as c:
        retry = retry_topic("g")
        eventually(lambda: MessageQueue(retry, 0) in c.assignment(), what="retry queue assigned")
        CommitLogWriter(store).append(
            [
                PendingMessage(
                    retry, 0, b"again", "u1", properties={PROPERTY_RETRY_TOPIC: "T"}, reconsume_times=1
                ),
                PendingMessage(
                    retry, 0, b"dead", "u2", properties={PROPERTY_RETRY_TOPIC: "T"}, reconsume_times=20
                ),
            ]
        )
        eventually(lambda: len(seen.calls) == 2, what="retry messages consumed")
    assert [(m.topic, m.body, m.reconsume_times) for m in seen.messages] == [("T", b"again", 1)]
    nacks = read_actions(store, "g", NACK)
    assert [(r["topic"], r["reconsume_times"]) for r in nacks] == [(retry, 20)]  # past the max: DLQ


# --------------------------------------------------------------------------- orderly
def test_orderly_consumption_keeps_queue_order_under_failures(
    store: Store, topic: str, dispatcher: None
) -> None:
    failures: dict[bytes, int] = defaultdict(int)
    order: dict[int, list[bytes]] = defaultdict(list)
    seen_times: dict[bytes, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def listener(messages: list[MessageExt]) -> ConsumeResult:
        (m,) = messages
        with lock:
            seen_times[m.body].append(m.reconsume_times)
            if int(m.body.split(b"-")[1]) % 4 == 1 and failures[m.body] < 2:
                failures[m.body] += 1
                return ConsumeResult.RECONSUME_LATER if failures[m.body] == 1 else _raise()
            order[m.queue_id].append(m.body)
        return ConsumeResult.SUCCESS

    sent: dict[int, list[bytes]] = defaultdict(list)
    with Producer(store) as p:
        for i in range(48):
            r = p.send(Message("T", f"k{i % 6}-{i}".encode()), sharding_key=f"k{i % 6}")
            sent[r.queue_id].append(f"k{i % 6}-{i}".encode())
    c = consumer(store, "g", listener=listener, orderly=True, consume_from=ConsumeFrom.FIRST)
    with c.start():
        eventually(lambda: sum(len(v) for v in order.values()) == 48, what="all consumed")
        eventually(lambda: sum(committed(store, "g").values()) == 48, what="all committed")
        assert c._membership.held_locks() >= {MessageQueue("T", q) for q in sent}
    assert dict(order) == dict(sent)
    assert all(seen_times[b] == [0, 1, 2] for b in failures)  # same message again, count visible
    assert read_actions(store, "g", NACK) == []
    assert GroupMembership(store, "g", "probe").lock_owners() == {}  # released at shutdown


def _raise() -> ConsumeResult:
    raise RuntimeError("injected failure")


def test_orderly_message_failing_past_max_goes_to_dlq_and_the_queue_continues(
    store: Store, topic: str, dispatcher: None
) -> None:
    seen = Collector(fail=lambda m: m.body == b"poison")
    c = consumer(
        store, "g", listener=seen, orderly=True, consume_from=ConsumeFrom.FIRST, max_reconsume_times=2
    )
    with c.start():
        send(store, ["a", "poison", "b"], queue_id=0)
        eventually(lambda: seen.bodies() == [b"a", b"b"], what="queue continued after the poison")
        eventually(lambda: committed(store, "g").get(0) == 3, what="committed past the poison")
    assert [m.reconsume_times for m in seen.calls if m.body == b"poison"] == [0, 1, 2]
    nacks = read_actions(store, "g", NACK)
    assert len(nacks) == 1 and nacks[0]["queue_offset"] == 1
    assert nacks[0]["reconsume_times"] >= store.config.max_reconsume_times  # the job dead-letters it


def test_orderly_consumers_split_queues_and_each_holds_the_locks_of_its_own(
    store: Store, topic: str, dispatcher: None
) -> None:
    a = consumer(store, "g", orderly=True, instance_id="a").start()
    b = consumer(store, "g", orderly=True, instance_id="b").start()
    try:
        eventually(lambda: topic_queues(a) == [0, 1] and topic_queues(b) == [2, 3], what="orderly split")
        owners = a._membership.lock_owners()
        assert {q.queue_id for q, o in owners.items() if q.topic == "T" and o == "a"} == {0, 1}
        assert {q.queue_id for q, o in owners.items() if q.topic == "T" and o == "b"} == {2, 3}
    finally:
        b.shutdown()
    eventually(lambda: topic_queues(a) == [0, 1, 2, 3], what="a locked b's queues after b left")
    a.shutdown()


# --------------------------------------------------------------------------- bad input
def test_bad_input_raises_typed_errors_and_writes_nothing(store: Store, topic: str) -> None:
    before = versions(store)
    with pytest.raises(InvalidArgumentError):
        PushConsumer(store, "bad group!")
    with pytest.raises(InvalidArgumentError):
        PushConsumer(store, "g", model="P2P")
    with pytest.raises(InvalidArgumentError):
        PushConsumer(store, "g", allocate="fastest")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        PushConsumer(store, "g", relock_interval_ms=40_000, lock_ttl_ms=60_000)
    with pytest.raises(InvalidArgumentError):
        PushConsumer(store, "g", pull_batch_size=0)
    c = PushConsumer(store, "g")
    with pytest.raises(TopicNotFoundError):
        c.subscribe("Nope")
    with pytest.raises(InvalidTopicError):
        c.subscribe("bad topic")
    with pytest.raises(InvalidArgumentError):
        c.subscribe("T", "A || ")
    with pytest.raises(InvalidArgumentError):
        c.register_listener("not callable")  # type: ignore[arg-type]
    with pytest.raises(ConsumerError, match="subscribe"):
        c.register_listener(Collector())
        c.start()
    assert versions(store) == before
    assert c.subscriptions() == {}


def test_start_needs_a_listener_and_runs_once(store: Store, topic: str) -> None:
    c = PushConsumer(store, "g", **FAST)
    c.subscribe("T")
    assert c.subscriptions() == {"T": "*", retry_topic("g"): "*"}
    assert Admin(store).topics(include_system=True)[0].name == retry_topic("g")
    before = versions(store)
    with pytest.raises(ConsumerError, match="listener"):
        c.start()
    assert versions(store) == before
    c.register_listener(Collector())
    c.start()
    try:
        with pytest.raises(ConsumerError):
            c.start()
        with pytest.raises(ConsumerError):
            c.register_listener(Collector())
    finally:
        c.shutdown()
    c.shutdown()  # idempotent
    with pytest.raises(ConsumerError):
        c.start()


@pytest.mark.parametrize("started", [False, True])
def test_a_shut_down_consumer_refuses_everything_with_a_consumer_error(
    store: Store, topic: str, started: bool
) -> None:
    c = PushConsumer(store, "g", **FAST)
    c.subscribe("T")
    c.register_listener(Collector())
    if started:
        c.start()
    c.shutdown()
    before = versions(store)
    for call in (
        lambda: c.subscribe("T"),
        lambda: c.subscribe("Nope"),  # closed wins over an unknown topic
        lambda: c.register_listener(Collector()),
        lambda: c.start(),
    ):
        with pytest.raises(ConsumerClosedError, match="shut down") as raised:
            call()
        assert not isinstance(raised.value, ProducerClosedError)
    assert versions(store) == before
    c.close()  # idempotent


def test_queue_locks_are_renewed_a_relock_interval_after_the_first_lock_whatever_the_uptime(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from engine.client.push import consumer as push_module
    from engine.client.push.process_queue import ProcessQueue

    clock = [5.0]  # time.monotonic() on a machine booted 5 s ago
    monkeypatch.setattr(push_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    c = PushConsumer(store, "g", relock_interval_ms=20_000, lock_ttl_ms=60_000)
    c.subscribe(topic)
    c.register_listener(Collector(), orderly=True)
    asked: list[set[Any]] = []

    def lock(queues: list[Any]) -> set[Any]:
        asked.append(set(queues))
        return set(queues)

    def start_queues(added: list[Any], target: dict[Any, str]) -> None:
        c._pqs.update({mq: ProcessQueue(mq, target[mq], 0, None) for mq in added})

    monkeypatch.setattr(c._membership, "lock", lock)
    monkeypatch.setattr(c._membership, "is_locked", lambda mq: True)
    monkeypatch.setattr(c._membership, "live_members", lambda: [c.instance_id])
    monkeypatch.setattr(c, "_start_queues", start_queues)
    c._rebalance()  # every queue is new: locked now
    clock[0] = 21.0
    c._rebalance()  # 16 s later, still held: nothing to renew yet
    clock[0] = 25.5
    c._rebalance()  # 20.5 s after the first lock: every held queue renewed
    assert len(asked) == 2 and asked[0] == asked[1]
    assert {(mq.topic, mq.queue_id) for mq in asked[0]} >= {(topic, q) for q in range(4)}
