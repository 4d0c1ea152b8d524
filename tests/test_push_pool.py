"""PushConsumer as RocketMQ's DefaultMQPushConsumer consumes: pulling apart from consuming, a pool of
consume threads, a bound on each queue's cache of pulled messages, ``consume_timeout`` for messages
stuck in a listener, and offsets that never pass a message not consumed.

A listener "hangs" by waiting on an event the test sets at its end. Every "eventually" condition is
polled against a generous deadline; nothing here is timed.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import (
    ConsumeFrom,
    ConsumeResult,
    InvalidArgumentError,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    Producer,
    PushConsumer,
    Store,
)
from engine.broker.retry import route_retries
from engine.broker.schedule import deliver_due
from engine.client.push.consume_pool import ConsumePool
from engine.protocol import retry_topic
from engine.protocol.actions import NACK
from engine.store.action_log import read_actions
from engine.store.store import now_ms
from tests.test_push_consumer import committed, consumer, dispatch, dispatcher, eventually, send

__all__ = ["dispatcher"]  # the fixture, used by name

Q0 = MessageQueue("T", 0)


class Gate:
    """A listener that hangs on the messages ``hang`` picks until :meth:`release`, records every
    call and the most calls ever running at once."""

    def __init__(self, hang: Callable[[MessageExt], bool]) -> None:
        self.hang = hang
        self.released = threading.Event()
        self.lock = threading.Lock()
        self.done: list[MessageExt] = []
        self.started: list[MessageExt] = []
        self.running = 0
        self.peak = 0

    def __call__(self, messages: list[MessageExt]) -> ConsumeResult:
        with self.lock:
            self.started.extend(messages)
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            if any(self.hang(m) for m in messages):
                self.released.wait(60)
            with self.lock:
                self.done.extend(messages)
            return ConsumeResult.SUCCESS
        finally:
            with self.lock:
                self.running -= 1

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.done]

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def gates() -> Iterator[list[Gate]]:
    """Gates opened at the end of the test, so no listener thread outlives it."""
    made: list[Gate] = []
    yield made
    for gate in made:
        gate.release()


def gate(gates: list[Gate], hang: Callable[[MessageExt], bool]) -> Gate:
    g = Gate(hang)
    gates.append(g)
    return g


def preload(store: Store, bodies: list[bytes], queue_id: int = 0) -> None:
    with Producer(store) as p:
        p.send_batch([Message("T", body) for body in bodies], queue_id=queue_id)
    dispatch(store)


def paused(c: PushConsumer) -> bool:
    """Whether pulling queue 0 has paused for its cache bounds."""
    info = c.process_queue_info().get(Q0)
    return info is not None and info.flow_control_times > 0


# --------------------------------------------------------------------------- a hung listener
def test_a_hung_listener_does_not_stall_the_other_messages_of_its_queue(
    store: Store, topic: str, dispatcher: None, gates: list[Gate]
) -> None:
    listener = gate(gates, lambda m: m.body == b"hang")
    c = consumer(store, "g", listener=listener, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, ["hang", "a", "b", "c"], queue_id=0)
        eventually(lambda: sorted(listener.bodies()) == [b"a", b"b", b"c"], what="the rest consumed")
        info = c.process_queue_info()[Q0]
        assert (info.in_flight, info.cached_msg_count, info.consumed_offset) == (1, 1, 0)
        listener.release()
        eventually(lambda: committed(store, "g").get(0) == 4, what="committed once the hang ended")
    assert read_actions(store, "g", NACK) == []


def test_a_message_stuck_past_consume_timeout_is_sent_back_and_delivered_again(
    store: Store, topic: str, dispatcher: None, gates: list[Gate]
) -> None:
    listener = gate(gates, lambda m: m.body == b"stuck" and m.reconsume_times == 0)
    c = consumer(store, "g", listener=listener, consume_from=ConsumeFrom.FIRST, consume_timeout_ms=300)
    with c.start():
        send(store, ["stuck", "next"], queue_id=0)
        eventually(lambda: len(read_actions(store, "g", NACK)) == 1, what="the stuck message sent back")
        [nack] = read_actions(store, "g", NACK)
        assert (nack["queue_offset"], nack["reconsume_times"]) == (0, 0)
        assert nack["deadline_ms"] > nack["ts_ms"]  # delay level 3, as RocketMQ's cleanExpireMsg
        eventually(lambda: committed(store, "g").get(0) == 2, what="the offset moved past it")
        route_retries(store)
        dispatch(store)
        deliver_due(store, now_ms() + 60_000)  # the retry's delay, passed at once
        eventually(lambda: b"stuck" in listener.bodies(), what="delivered again through the retry topic")
        [again] = [m for m in listener.done if m.body == b"stuck"]
        assert again.reconsume_times == 1 and again.topic == "T"
        listener.release()  # the hung call answers SUCCESS late: ignored, nothing more is sent back
        eventually(lambda: listener.bodies().count(b"stuck") == 2, what="the hung call returned")
        time.sleep(0.3)
    assert len(read_actions(store, "g", NACK)) == 1
    assert committed(store, "g", topic=retry_topic("g")).get(0) == 1


def test_a_broadcast_message_stuck_past_consume_timeout_is_dropped_not_retried(
    store: Store, topic: str, dispatcher: None, gates: list[Gate]
) -> None:
    listener = gate(gates, lambda m: m.body == b"stuck")
    kw: dict[str, Any] = {"model": MessageModel.BROADCASTING, "instance_id": "i1", "consume_timeout_ms": 200}
    with consumer(store, "g", listener=listener, consume_from=ConsumeFrom.FIRST, **kw).start():
        send(store, ["stuck", "next"], queue_id=0)
        eventually(lambda: committed(store, "g", consumer_id="i1").get(0) == 2, what="offset moved past")
    assert listener.bodies() == [b"next"] and read_actions(store, "g", NACK) == []


def test_an_orderly_listener_is_never_timed_out_and_keeps_one_call_per_queue_in_order(
    store: Store, topic: str, dispatcher: None
) -> None:
    lock = threading.Lock()
    running: dict[int, int] = defaultdict(int)
    overlap: list[int] = []
    seen: dict[int, list[int]] = defaultdict(list)
    slow = threading.Event()

    def listener(messages: list[MessageExt]) -> ConsumeResult:
        (m,) = messages
        with lock:
            running[m.queue_id] += 1
            if running[m.queue_id] > 1:
                overlap.append(m.queue_id)
        if m.queue_id == 0 and m.queue_offset == 0:
            slow.wait(1.0)  # longer than consume_timeout: an orderly call is never timed out
        with lock:
            seen[m.queue_id].append(m.queue_offset)
            running[m.queue_id] -= 1
        return ConsumeResult.SUCCESS

    c = consumer(
        store, "g", listener=listener, orderly=True, consume_from=ConsumeFrom.FIRST, consume_timeout_ms=100
    )
    with c.start():
        send(store, [f"m{i}" for i in range(40)])  # 10 per queue
        eventually(lambda: all(len(seen[q]) == 10 for q in range(4)), what="every queue consumed")
        eventually(lambda: committed(store, "g") == {q: 10 for q in range(4)}, what="committed")
    assert all(seen[q] == list(range(10)) for q in range(4)) and overlap == []
    assert read_actions(store, "g", NACK) == []


# --------------------------------------------------------------------------- flow control
def test_pulling_a_queue_pauses_at_its_cached_message_bound(
    store: Store, topic: str, dispatcher: None, gates: list[Gate]
) -> None:
    preload(store, [f"m{i}".encode() for i in range(40)])
    listener = gate(gates, lambda m: True)
    kw: dict[str, Any] = {"pull_threshold_for_queue": 10, "pull_batch_size": 4, "consume_thread_max": 1}
    c = consumer(store, "g", listener=listener, consume_from=ConsumeFrom.FIRST, consume_thread_min=1, **kw)
    with c.start():
        eventually(lambda: paused(c), what="pulling paused")
        info = c.process_queue_info()[Q0]
        # Pulls of 4 until more than 10 are cached (RocketMQ: count > pullThresholdForQueue).
        assert (info.cached_msg_count, info.next_pull_offset, info.in_flight) == (12, 12, 1)
        assert (info.cached_min_offset, info.cached_max_offset) == (0, 11)
        listener.release()
        eventually(lambda: len(listener.bodies()) == 40, what="everything consumed once released")
        eventually(lambda: committed(store, "g").get(0) == 40, what="committed")
    assert sorted(listener.bodies()) == sorted(f"m{i}".encode() for i in range(40))


def test_pulling_a_queue_pauses_at_its_cached_size_bound(
    store: Store, topic: str, dispatcher: None, gates: list[Gate]
) -> None:
    preload(store, [bytes([i]) * 300_000 for i in range(10)])  # one per pull (256 KiB a pull)
    listener = gate(gates, lambda m: True)
    c = consumer(
        store,
        "g",
        listener=listener,
        consume_from=ConsumeFrom.FIRST,
        pull_threshold_size_for_queue=1,  # MiB
        consume_thread_min=1,
        consume_thread_max=1,
    )
    with c.start():
        eventually(lambda: paused(c), what="pulling paused")
        info = c.process_queue_info()[Q0]
        assert (info.cached_msg_count, info.cached_msg_bytes) == (4, 1_200_000)  # past 1 MiB
        listener.release()
        eventually(lambda: len(listener.bodies()) == 10, what="everything consumed once released")


# --------------------------------------------------------------------------- the pool
def test_no_more_listener_calls_run_at_once_than_consume_thread_max(
    store: Store, topic: str, dispatcher: None, gates: list[Gate]
) -> None:
    listener = gate(gates, lambda m: True)
    c = consumer(
        store,
        "g",
        listener=listener,
        consume_from=ConsumeFrom.FIRST,
        consume_thread_min=2,
        consume_thread_max=3,
    )
    with c.start():
        send(store, [f"m{i}" for i in range(20)])
        eventually(lambda: listener.running == 3, what="the pool full")
        eventually(
            lambda: sum(i.cached_msg_count for i in c.process_queue_info().values()) == 20, what="all cached"
        )
        time.sleep(0.3)  # more is waiting: still no fourth call
        assert listener.peak == 3 and c.consume_threads == 3
        assert sum(i.in_flight for i in c.process_queue_info().values()) == 3
        listener.release()
        eventually(lambda: len(listener.bodies()) == 20, what="all consumed")
    assert listener.peak == 3


def test_the_committed_offset_never_passes_a_message_not_consumed(
    store: Store, topic: str, dispatcher: None, gates: list[Gate]
) -> None:
    listener = gate(gates, lambda m: m.queue_offset == 3)
    kw: dict[str, Any] = {"consume_from": ConsumeFrom.FIRST, "await_termination_ms_when_shutdown": 0}
    c = consumer(store, "g", listener=listener, **kw)
    with c.start():
        send(store, [f"m{i}" for i in range(10)], queue_id=0)
        eventually(lambda: len(listener.bodies()) == 9, what="all but the hung one consumed")
        eventually(lambda: committed(store, "g").get(0) == 3, what="committed up to the hung one")
        time.sleep(0.5)  # several commit intervals later: still there
        assert committed(store, "g").get(0) == 3 and c.process_queue_info()[Q0].consumed_offset == 3
    assert committed(store, "g").get(0) == 3  # shutdown without waiting: the hung one comes again
    again = gate(gates, lambda m: False)
    with consumer(store, "g", listener=again).start():
        eventually(lambda: len(again.bodies()) == 7, what="redelivered from the committed offset")
    assert [m.queue_offset for m in sorted(again.done, key=lambda m: m.queue_offset)] == list(range(3, 10))


def test_close_with_a_hung_listener_returns(
    store: Store, topic: str, dispatcher: None, gates: list[Gate]
) -> None:
    listener = gate(gates, lambda m: True)
    kw: dict[str, Any] = {"consume_from": ConsumeFrom.FIRST, "await_termination_ms_when_shutdown": 100}
    c = consumer(store, "g", listener=listener, **kw).start()
    send(store, ["a", "b"], queue_id=1)
    eventually(lambda: listener.running == 2, what="both calls hung")
    closer = threading.Thread(target=c.close, daemon=True)
    closer.start()
    closer.join(20)
    assert not closer.is_alive(), "close() waited for a hung listener"
    assert committed(store, "g").get(1) == 0  # nothing consumed, nothing committed past it


# --------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "kwargs",
    [
        {"consume_thread_min": 0},
        {"consume_thread_min": 5, "consume_thread_max": 4},
        {"consume_thread_max": 1001},
        {"pull_threshold_for_queue": 0},
        {"pull_threshold_for_queue": 65_536},
        {"pull_threshold_size_for_queue": 1025},
        {"consume_concurrently_max_span": 0},
        {"consume_message_batch_max_size": 0},
        {"consume_timeout": 0},
        {"consume_timeout_ms": -5},
        {"await_termination_ms_when_shutdown": -1},
        {"await_termination_ms_when_shutdown": "1s"},
    ],
)
def test_bad_pool_and_flow_control_settings_are_refused(
    store: Store, topic: str, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgumentError):
        consumer(store, "g", **kwargs)


def test_defaults_are_rocketmqs() -> None:
    defaults = {n: p.default for n, p in inspect.signature(PushConsumer).parameters.items()}
    rocketmq = {
        "consume_thread_min": 20,
        "consume_thread_max": 20,
        "pull_threshold_for_queue": 1000,
        "pull_threshold_size_for_queue": 100,
        "consume_concurrently_max_span": 2000,
        "consume_message_batch_max_size": 1,
        "consume_timeout": 15,
    }
    assert {n: defaults[n] for n in rocketmq} == rocketmq


# --------------------------------------------------------------------------- the pool on its own
def test_a_pool_runs_at_most_its_max_threads_and_keeps_the_rest_waiting() -> None:
    pool = ConsumePool("t", 1, 2)
    release = threading.Event()
    ran: list[int] = []
    for i in range(5):
        pool.submit(lambda i=i: (release.wait(10), ran.append(i)))
    eventually(lambda: pool.busy == 2, what="two running")
    time.sleep(0.1)
    assert pool.threads == 2 and pool.peak_busy == 2 and ran == []
    release.set()
    eventually(lambda: sorted(ran) == [0, 1, 2, 3, 4], what="all ran")
    pool.shutdown()


def test_a_pool_runs_a_delayed_task_after_those_due_now_and_drops_waiting_tasks_at_shutdown() -> None:
    pool = ConsumePool("t", 1, 1)
    ran: list[str] = []
    pool.submit(lambda: ran.append("later"), delay_s=0.2)
    pool.submit(lambda: ran.append("now"))
    eventually(lambda: ran == ["now", "later"], what="in due order")
    pool.submit(lambda: ran.append("never"), delay_s=30)
    pool.shutdown()
    pool.submit(lambda: ran.append("after shutdown"))
    eventually(lambda: pool.threads == 0, what="threads ended")
    assert ran == ["now", "later"]


def test_a_pool_thread_above_the_min_ends_when_idle_and_a_failing_task_does_not_kill_its_thread() -> None:
    pool = ConsumePool("t", 1, 3, keep_alive_s=0.1)
    release = threading.Event()
    for _ in range(3):
        pool.submit(lambda: release.wait(10) and None)
    eventually(lambda: pool.threads == 3, what="grown to the max")
    release.set()
    eventually(lambda: pool.threads == 1, what="shrunk to the min")

    def boom() -> None:
        raise RuntimeError("listener bug")

    ran: list[int] = []
    pool.submit(boom)
    pool.submit(lambda: ran.append(1))
    eventually(lambda: ran == [1], what="the thread went on")
    pool.shutdown()
