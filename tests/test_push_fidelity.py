"""PushConsumer behaviour as RocketMQ's clients have it: live offset resets, orderly retry in place,
the reconsume limit's defaults, the next delay level chosen by a listener, stable broadcast ids."""

from __future__ import annotations

import pytest

from engine import (
    Admin,
    ConsumeConcurrentlyContext,
    ConsumeFrom,
    ConsumeOrderlyContext,
    ConsumeResult,
    InvalidArgumentError,
    MessageExt,
    MessageModel,
    MessageQueue,
    PullConsumer,
    Store,
)
from engine.broker.dispatch import dispatch_pending
from engine.broker.retry import retry_message, route_retries
from engine.client.resets import ResetWatcher
from engine.protocol import PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC
from engine.protocol.actions import NACK
from engine.store.action_log import read_actions
from engine.store.consumer_offset import OffsetStore
from engine.store.offset_resets import latest_resets, record_resets
from engine.store.store import now_ms
from tests.helpers import commit_log_rows
from tests.test_push_consumer import (
    Collector,
    committed,
    consumer,
    dispatcher,
    eventually,
    send,
    topic_queues,
)

__all__ = ["dispatcher"]  # the fixture, used by name


def pull_everything(store: Store, topic: str) -> list[MessageExt]:
    dispatch_pending(store)
    if topic not in store.topic_configs(refresh=True):
        return []
    puller = PullConsumer(store, "probe")
    return [
        m for q in range(store.topic(topic).queues) for m in puller.pull(topic, q, 0, max_nums=64).messages
    ]


# --------------------------------------------------------------------------- live resets
def test_reset_watcher_reports_only_resets_made_after_it_was_created(store: Store, topic: str) -> None:
    record_resets(store, "g", [("T", 0, 5)], ts_ms=1_000)
    watcher = ResetWatcher(store, "g")
    assert watcher.poll() == {}
    record_resets(store, "other", [("T", 1, 3)], ts_ms=2_000)
    assert watcher.poll() == {}
    record_resets(store, "g", [("T", 0, 2), ("T", 1, 4)], ts_ms=3_000)
    fresh = watcher.poll()
    assert {k: (r.offset, r.ts_ms) for k, r in fresh.items()} == {("T", 0): (2, 3_000), ("T", 1): (4, 3_000)}
    assert watcher.poll() == {}  # each reset is reported once


def test_reset_watcher_refuses_a_bad_group(store: Store) -> None:
    with pytest.raises(InvalidArgumentError):
        ResetWatcher(store, "bad group")


def test_admin_resets_are_recorded_for_running_consumers(store: Store, topic: str) -> None:
    send(store, ["a", "b", "c"], queue_id=1)
    dispatch_pending(store)
    admin = Admin(store)
    admin.reset_offset(
        "g",
        "T",
        1,
        2,
    )
    assert {k: r.offset for k, r in latest_resets(store, "g").items()} == {("T", 1): 2}
    admin.reset_offset_by_time("g", "T", 0)
    assert {k: r.offset for k, r in latest_resets(store, "g").items()} == {("T", q): 0 for q in range(4)}


def test_a_reset_reaches_a_running_consumer_which_consumes_again_and_keeps_the_reset(
    store: Store, topic: str, dispatcher: None
) -> None:
    seen = Collector()
    c = consumer(store, "g", listener=seen, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, [f"m{i}" for i in range(8)])
        eventually(lambda: len(seen.bodies()) == 8, what="first pass consumed")
        eventually(lambda: committed(store, "g") == {q: 2 for q in range(4)}, what="first pass committed")
        Admin(store).reset_offset_by_time("g", "T", 0)
        eventually(lambda: len(seen.bodies()) == 16, what="consumed again after the reset")
        assert sorted(seen.bodies()) == sorted([f"m{i}".encode() for i in range(8)] * 2)
        eventually(lambda: committed(store, "g") == {q: 2 for q in range(4)}, what="committed again")


def test_a_reset_reaches_every_member_of_a_clustering_group(
    store: Store, topic: str, dispatcher: None
) -> None:
    seen = Collector()  # shared: the group as a whole consumes everything twice
    a = consumer(store, "g", listener=seen, consume_from=ConsumeFrom.FIRST, instance_id="a").start()
    b = consumer(store, "g", listener=seen, consume_from=ConsumeFrom.FIRST, instance_id="b").start()
    try:
        eventually(lambda: len(topic_queues(a)) == len(topic_queues(b)) == 2, what="queues split")
        send(store, [f"m{i}" for i in range(8)])
        eventually(lambda: len(seen.bodies()) == 8, what="first pass consumed")
        eventually(lambda: committed(store, "g") == {q: 2 for q in range(4)}, what="first pass committed")
        Admin(store).reset_offset_by_time("g", "T", 0)
        eventually(lambda: len(seen.bodies()) == 16, what="both members consumed their queues again")
    finally:
        a.shutdown()
        b.shutdown()
    assert sorted(seen.bodies()) == sorted([f"m{i}".encode() for i in range(8)] * 2)
    assert committed(store, "g") == {q: 2 for q in range(4)}


def test_a_reset_of_one_queue_resumes_that_queue_from_the_new_offset_only(
    store: Store, topic: str, dispatcher: None
) -> None:
    seen = Collector()
    c = consumer(store, "g", listener=seen, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, ["a", "b", "c", "d"], queue_id=2)
        send(store, ["x"], queue_id=0)
        eventually(lambda: len(seen.bodies()) == 5, what="first pass consumed")
        Admin(store).reset_offset("g", "T", 2, 2)
        eventually(lambda: len(seen.bodies()) == 7, what="queue 2 consumed again from offset 2")
        assert sorted(seen.bodies()[5:]) == [b"c", b"d"]
        eventually(lambda: committed(store, "g").get(2) == 4, what="committed again")


def test_a_reset_wins_over_a_commit_of_the_old_progress_that_raced_it(
    store: Store, topic: str, dispatcher: None
) -> None:
    seen = Collector()
    c = consumer(store, "g", listener=seen, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, ["a", "b", "c"], queue_id=3)
        eventually(lambda: committed(store, "g").get(3) == 3, what="consumed and committed")
        Admin(store).reset_offset("g", "T", 3, 0)
        OffsetStore(store, "g").commit([("T", 3, 3)])  # the old progress, committed after the reset
        eventually(lambda: len(seen.bodies()) == 6, what="consumed again from the reset")
        eventually(lambda: committed(store, "g").get(3) == 3, what="committed again")
    assert sorted(seen.bodies()) == [b"a", b"a", b"b", b"b", b"c", b"c"]


def test_a_reset_made_while_no_consumer_runs_is_where_the_next_one_starts(
    store: Store, topic: str, dispatcher: None
) -> None:
    first = consumer(store, "g", consume_from=ConsumeFrom.FIRST)
    with first.start():
        send(store, ["a", "b", "c"], queue_id=1)
        eventually(lambda: committed(store, "g").get(1) == 3, what="consumed and committed")
    Admin(store).reset_offset("g", "T", 1, 1)
    seen = Collector()
    with consumer(store, "g", listener=seen).start():
        eventually(lambda: seen.bodies() == [b"b", b"c"], what="resumed from the reset")


# --------------------------------------------------------------------------- orderly retry in place
def test_an_orderly_listener_retries_a_failing_message_in_place_beyond_16_times_by_default(
    store: Store, topic: str, dispatcher: None
) -> None:
    attempts: list[int] = []

    def listener(messages: list[MessageExt]) -> ConsumeResult:
        (m,) = messages
        if m.body == b"poison" and len(attempts) < 20:
            attempts.append(m.reconsume_times)
            return ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
        seen.append(m.body)
        return ConsumeResult.SUCCESS

    seen: list[bytes] = []
    c = consumer(store, "g", listener=listener, orderly=True, consume_from=ConsumeFrom.FIRST)
    assert c.max_reconsume_times == 2**31 - 1  # RocketMQ's orderly default: Integer.MAX_VALUE
    with c.start():
        send(store, ["a", "poison", "b"], queue_id=0)
        eventually(lambda: seen == [b"a", b"poison", b"b"], what="the poison message succeeded in place")
        eventually(lambda: committed(store, "g").get(0) == 3, what="committed past it")
    assert attempts == list(range(20))  # the same message again and again, its count visible
    assert read_actions(store, "g", NACK) == []  # never dead-lettered


def test_an_orderly_context_sets_the_pause_before_the_batch_comes_again(
    store: Store, topic: str, dispatcher: None
) -> None:
    calls: list[bytes] = []

    def listener(messages: list[MessageExt], context: ConsumeOrderlyContext) -> ConsumeResult:
        assert context.message_queue == MessageQueue("T", 0)
        calls.extend(m.body for m in messages)
        if len(calls) == 1:
            context.suspend_current_queue_time_ms = 10
            return ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeResult.SUCCESS

    c = consumer(store, "g", listener=listener, orderly=True, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, ["x"], queue_id=0)
        eventually(lambda: calls == [b"x", b"x"], what="retried in place")


def test_an_orderly_limit_set_by_the_user_still_dead_letters(store: Store, topic: str) -> None:
    c = consumer(store, "g", orderly=True, max_reconsume_times=3)
    assert c.max_reconsume_times == 3


# --------------------------------------------------------------------------- reconsume limits
def test_max_reconsume_times_minus_one_means_rocketmq_default(store: Store, topic: str) -> None:
    assert consumer(store, "g", max_reconsume_times=-1).max_reconsume_times == 16
    assert consumer(store, "g").max_reconsume_times == 16
    assert consumer(store, "g", orderly=True, max_reconsume_times=-1).max_reconsume_times == 2**31 - 1
    with pytest.raises(InvalidArgumentError):
        consumer(store, "g", max_reconsume_times=-2)


def test_a_concurrent_listener_sends_failures_to_the_dlq_at_once_with_delay_level_minus_one(
    store: Store, topic: str, dispatcher: None
) -> None:
    def listener(messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeResult:
        context.delay_level_when_next_consume = -1
        return ConsumeResult.RECONSUME_LATER

    c = consumer(store, "g", listener=listener, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, ["x"], queue_id=1)
        eventually(lambda: len(read_actions(store, "g", NACK)) == 1, what="a NACK")
    [nack] = read_actions(store, "g", NACK)
    assert nack["reconsume_times"] >= store.config.max_reconsume_times and nack["deadline_ms"] is None
    route_retries(store)
    assert [m.body for m in pull_everything(store, "%DLQ%g")] == [b"x"]


def test_a_concurrent_listener_chooses_the_next_delay_level(
    store: Store, topic: str, dispatcher: None
) -> None:
    def listener(messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeResult:
        context.delay_level_when_next_consume = 2  # 5 s, where the broker would choose 10 s
        return ConsumeResult.RECONSUME_LATER

    c = consumer(store, "g", listener=listener, consume_from=ConsumeFrom.FIRST)
    before = now_ms()
    with c.start():
        send(store, ["x"], queue_id=1)
        eventually(lambda: len(read_actions(store, "g", NACK)) == 1, what="a NACK")
    after = now_ms()
    [nack] = read_actions(store, "g", NACK)
    assert before + 5_000 <= nack["deadline_ms"] <= after + 5_000
    assert nack["reconsume_times"] == 0
    route_retries(store)
    [row] = [r for r in commit_log_rows(store) if r["topic"] == SCHEDULE_TOPIC]
    assert row["deliver_at_ms"] == nack["deadline_ms"]
    assert dict(row["properties"])[PROPERTY_REAL_TOPIC] == "%RETRY%g"  # type: ignore[call-overload]


def test_retry_message_at_a_chosen_time_waits_as_a_timer() -> None:
    row = {
        "topic": "T",
        "queue_id": 0,
        "body": b"x",
        "msg_id": "M",
        "uniq_key": "U",
        "reconsume_times": 0,
        "properties": [],
        "tags": None,
        "keys": [],
        "born_ts_ms": 1,
        "sys_flag": 0,
    }
    timed = retry_message(row, "g", 1_000, retry_at_ms=6_000)
    assert (timed.deliver_at_ms, timed.delay_level) == (6_000, 0)
    broker = retry_message(row, "g", 1_000)
    assert broker.delay_level == 3
    assert retry_message(row, "g", 9_000, retry_at_ms=6_000).deliver_at_ms == 9_000  # late: at once


# --------------------------------------------------------------------------- broadcasting ids
def test_a_broadcasting_consumer_id_is_stable_per_host_and_a_restart_resumes(
    store: Store, topic: str, dispatcher: None
) -> None:
    first_seen = Collector()
    first = consumer(store, "g", listener=first_seen, model=MessageModel.BROADCASTING, consume_from="FIRST")
    assert first.instance_id.endswith("@DEFAULT")
    with first.start():
        send(store, ["a", "b", "c", "d"])
        eventually(lambda: len(first_seen.bodies()) == 4, what="first run consumed")
    send(store, ["e", "f"])
    again_seen = Collector()
    again = consumer(store, "g", listener=again_seen, model=MessageModel.BROADCASTING, consume_from="FIRST")
    assert again.instance_id == first.instance_id
    with again.start():
        eventually(lambda: sorted(again_seen.bodies()) == [b"e", b"f"], what="resumed after the restart")
    assert consumer(store, "g").instance_id != consumer(store, "g").instance_id  # clustering: unique
