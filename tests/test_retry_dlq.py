"""Retry and dead letters: failed messages come back through %RETRY%<group>, then go to %DLQ%<group>."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Admin, InvalidArgumentError, Message, MessageExt, Producer, PullConsumer, Store, protocol
from engine.broker.dispatch import dispatch_pending
from engine.broker.retry import RetryRouter, route_action_rows, route_message, route_retries, routed_version
from engine.broker.schedule import deliver_due
from engine.protocol.actions import ACK, EXPIRED, NACK, PULL
from engine.protocol.delays import DELAY_LEVELS_MS, max_reconsume_times
from engine.store import schemas
from engine.store.action_log import ActionLogWriter
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.stamping import PendingMessage
from engine.store.commit_markers import RETRY_APP, RETRY_SKIPPED_KEY
from engine.store.delta.log import read_versions
from engine.store.store import now_ms
from tests.helpers import commit_log_rows, run_in_threads, versions
from tests.raw_delta import raw_table

FAR_FUTURE = 10**13
GROUP = "g"
RETRY = "%RETRY%g"
DLQ = "%DLQ%g"


def pull_all(store: Store, topic: str) -> list[MessageExt]:
    dispatch_pending(store)
    if topic not in store.topic_configs(refresh=True):
        return []
    consumer = PullConsumer(store, "checker")
    out: list[MessageExt] = []
    for qid in range(store.topic(topic).queues):
        out.extend(consumer.pull(topic, qid, 0, max_nums=1024).messages)
    return out


def fail(store: Store, messages: list[MessageExt], action: str = NACK, group: str = GROUP) -> None:
    """What a consumer records when it gives up on messages."""
    with ActionLogWriter(store, group, "consumer-1") as writer:
        for m in messages:
            writer.record(action, m)


def raw_action(store: Store, action: str, physical_offset: int, msg_id: str | None = None) -> None:
    """An action row written directly (kinds or positions the writer would not produce)."""
    row = {
        "group": GROUP,
        "consumer_id": "raw",
        "sequence": 0,
        "action": action,
        "topic": "T",
        "queue_id": 0,
        "queue_offset": 0,
        "physical_offset": physical_offset,
        "msg_id": msg_id,
        "reconsume_times": 0,
        "deadline_ms": None,
        "ts_ms": now_ms(),
    }
    store.append(schemas.ACTION_LOG, pa.Table.from_pylist([row], schema=schemas.ACTION_LOG_SCHEMA))


def redeliver(store: Store) -> list[MessageExt]:
    """Route failures, let every retry come due, and return what the retry topic holds."""
    route_retries(store)
    dispatch_pending(store)
    deliver_due(store, FAR_FUTURE)
    return pull_all(store, RETRY)


def sent_message(store: Store, topic: str, **kwargs: Any) -> MessageExt:
    Producer(store).send(Message(topic, b"payload", tags="TagA", keys=("k1",), **kwargs), queue_id=0)
    [message] = pull_all(store, topic)
    return message


# ----------------------------------------------------------------- retry
def test_a_nack_waits_at_level_3_in_the_schedule_for_the_retry_topic(store: Store, topic: str) -> None:
    original = sent_message(store, topic)
    fail(store, [original])
    now = now_ms()
    assert route_retries(store, now_ms=now) == 1
    row = commit_log_rows(store)[-1]
    props = dict(row["properties"])  # type: ignore[call-overload]
    assert (row["topic"], row["queue_id"], row["delay_level"]) == (protocol.SCHEDULE_TOPIC, 2, 3)
    assert row["deliver_at_ms"] == row["tags_code"] == now + DELAY_LEVELS_MS[2]
    assert row["reconsume_times"] == 1
    assert props[protocol.PROPERTY_REAL_TOPIC] == RETRY and props[protocol.PROPERTY_REAL_QUEUE_ID] == "0"
    assert props[protocol.PROPERTY_DELAY] == "3"
    assert props[protocol.PROPERTY_RETRY_TOPIC] == topic
    assert props[protocol.PROPERTY_ORIGIN_MESSAGE_ID] == original.offset_msg_id
    assert store.topic(RETRY).queues == 1

    dispatch_pending(store)
    assert deliver_due(store, now + 9_999) == 0
    assert pull_all(store, RETRY) == []
    assert deliver_due(store, now + 10_000) == 1
    [retry] = pull_all(store, RETRY)
    assert (retry.body, retry.tags, retry.keys, retry.uniq_key) == (
        b"payload",
        "TagA",
        ("k1",),
        original.uniq_key,
    )
    assert retry.reconsume_times == 1
    assert retry.properties[protocol.PROPERTY_RECONSUME_TIME] == "1"
    assert retry.properties[protocol.PROPERTY_ORIGIN_MESSAGE_ID] == original.offset_msg_id
    assert protocol.PROPERTY_DELAY not in retry.properties
    assert retry.properties[protocol.PROPERTY_REAL_TOPIC] == RETRY  # kept, as RocketMQ's schedule keeps it


def test_each_retry_waits_one_level_longer_and_keeps_its_history(store: Store, topic: str) -> None:
    original = sent_message(store, topic)
    current = original
    for attempt in range(1, 4):
        fail(store, [current])
        route_retries(store)
        scheduled = commit_log_rows(store)[-1]
        assert scheduled["queue_id"] == 2 + attempt - 1  # delay level 3 + reconsume times, minus one
        retries = redeliver(store)
        current = retries[-1]
        assert current.reconsume_times == attempt
        assert current.properties[protocol.PROPERTY_ORIGIN_MESSAGE_ID] == original.offset_msg_id
        assert current.properties[protocol.PROPERTY_RETRY_TOPIC] == topic
    assert len(pull_all(store, RETRY)) == 3


def test_after_16_reconsumes_the_message_goes_to_the_dead_letter_queue(
    store: Store, topic: str, admin: Admin
) -> None:
    original = sent_message(store, topic)
    current = original
    for attempt in range(1, 17):
        fail(store, [current])
        current = redeliver(store)[-1]
        assert current.reconsume_times == attempt
    assert pull_all(store, DLQ) == []
    fail(store, [current])  # the 17th failure
    assert route_retries(store) == 1
    [dead] = pull_all(store, DLQ)
    assert store.topic(DLQ).queues == 1
    assert dead.body == b"payload" and dead.uniq_key == original.uniq_key
    assert dead.reconsume_times == 17
    assert dead.properties[protocol.PROPERTY_ORIGIN_MESSAGE_ID] == original.offset_msg_id
    assert dead.properties[protocol.PROPERTY_RETRY_TOPIC] == topic
    assert dead.properties[protocol.PROPERTY_RECONSUME_TIME] == "17"
    assert len(pull_all(store, RETRY)) == 16
    assert [m.msg_id for m in admin.dlq_messages(GROUP)] == [dead.msg_id]


def test_the_message_property_max_reconsume_times_overrides_the_group(store: Store, topic: str) -> None:
    # A reserved property: users cannot set it; a consumer's send-back (or a DLQ resend) writes it.
    CommitLogWriter(store).append(
        [PendingMessage(topic, 0, b"payload", "U-1", properties={protocol.PROPERTY_MAX_RECONSUME_TIMES: "1"})]
    )
    [original] = pull_all(store, topic)
    fail(store, [original])
    [retry] = redeliver(store)
    fail(store, [retry])
    route_retries(store, max_reconsume_times=5)
    assert [m.uniq_key for m in pull_all(store, DLQ)] == [original.uniq_key]


def test_a_group_setting_overrides_the_default(store: Store, topic: str) -> None:
    original = sent_message(store, topic)
    fail(store, [original], group="g")
    fail(store, [original], group="other")
    assert route_retries(store, max_reconsume_times={"g": 0}) == 2
    assert [m.uniq_key for m in pull_all(store, DLQ)] == [original.uniq_key]
    dispatch_pending(store)
    deliver_due(store, FAR_FUTURE)
    assert [m.uniq_key for m in pull_all(store, "%RETRY%other")] == [original.uniq_key]
    assert pull_all(store, "%DLQ%other") == []


def test_the_failure_row_count_wins_when_it_is_higher(store: Store, topic: str) -> None:
    original = sent_message(store, topic)
    with ActionLogWriter(store, GROUP, "simple-1") as writer:  # a redelivery counted in the row
        writer.record(NACK, original, reconsume_times=3)
    assert route_retries(store) == 1
    row = commit_log_rows(store)[-1]
    assert (row["queue_id"], row["reconsume_times"]) == (5, 4)  # delay level 3 + 3
    with ActionLogWriter(store, GROUP, "push-1") as writer:  # a consumer-side max reached
        writer.record(NACK, original, reconsume_times=16)
    assert route_retries(store) == 1
    [dead] = pull_all(store, DLQ)
    assert dead.reconsume_times == 17


def test_expired_rows_are_routed_like_nacks_and_other_actions_are_not(store: Store, topic: str) -> None:
    original = sent_message(store, topic)
    fail(store, [original], action=PULL)
    fail(store, [original], action=ACK)
    assert route_retries(store) == 0
    raw_action(store, EXPIRED, original.physical_offset, original.msg_id)
    assert route_retries(store) == 1
    assert [m.uniq_key for m in redeliver(store)] == [original.uniq_key]


def test_two_failure_rows_for_one_message_in_a_range_route_it_once(store: Store, topic: str) -> None:
    original = sent_message(store, topic)
    fail(store, [original, original])
    assert route_retries(store) == 1


def test_a_failure_row_pointing_at_no_message_is_skipped_and_does_not_block(store: Store, topic: str) -> None:
    original = sent_message(store, topic)
    raw_action(store, NACK, 10**12)
    raw_action(store, NACK, original.physical_offset, "0" * 32)  # wrong id for that offset
    fail(store, [original])
    assert route_retries(store) == 1
    info = raw_table(store, schemas.COMMIT_LOG).history(1)[0]
    skipped = json.loads(info[RETRY_SKIPPED_KEY])
    assert {s["physical_offset"] for s in skipped} == {10**12, original.physical_offset}
    assert routed_version(store) == store.version(schemas.ACTION_LOG)


# ----------------------------------------------------------------- exactly once
def test_route_retries_twice_routes_once(store: Store, topic: str) -> None:
    original = sent_message(store, topic)
    fail(store, [original])
    assert route_retries(store) == 1
    before = versions(store)
    assert route_retries(store) == 0
    assert versions(store) == before
    assert len(redeliver(store)) == 1


def test_a_replayed_batch_of_action_rows_routes_nothing(store: Store, topic: str) -> None:
    original = sent_message(store, topic)
    fail(store, [original])
    rows = read_versions(
        store.uri(schemas.ACTION_LOG), 0, store.version(schemas.ACTION_LOG), schemas.ACTION_LOG_SCHEMA
    )
    assert route_action_rows(store, rows) == 1
    assert route_action_rows(store, rows) == 0
    assert store.app_version(schemas.COMMIT_LOG, RETRY_APP) == store.version(schemas.ACTION_LOG)


def test_a_router_that_loses_its_race_routes_only_what_the_winner_left(store: Store, topic: str) -> None:
    producer = Producer(store)
    for i in range(4):
        producer.send(Message(topic, f"m{i}".encode()))
    messages = pull_all(store, topic)
    fail(store, messages[:2])
    first = store.version(schemas.ACTION_LOG)
    winner = RetryRouter(store)
    rows_first = read_versions(store.uri(schemas.ACTION_LOG), first, first, schemas.ACTION_LOG_SCHEMA)
    fail(store, messages[2:])
    loser = RetryRouter(Store.open(store.root))
    commit = loser._writer.append
    raced: list[int] = []

    def race(pending: Any, **kwargs: Any) -> Any:
        if not raced:  # the winner routes the first version between the loser's decision and commit
            raced.append(winner.route(rows_first))
        return commit(pending, **kwargs)

    loser._writer.append = race  # type: ignore[method-assign]
    assert route_retries(store, router=loser) == 2  # only the second version's failures
    assert raced == [2]
    scheduled = [r for r in commit_log_rows(store) if r["topic"] == protocol.SCHEDULE_TOPIC]
    assert sorted(str(r["uniq_key"]) for r in scheduled) == sorted(m.uniq_key for m in messages)


def test_two_routers_in_two_processes_route_each_failure_once(tmp_path: Path) -> None:
    path = tmp_path / "mqdata"
    first = Store.open(path)
    Admin(first).create_topic("T", 2)
    producer = Producer(first)
    for i in range(30):
        producer.send(Message("T", f"m{i}".encode()))
    messages = pull_all(first, "T")
    for i in range(0, 30, 3):  # ten action-log versions
        fail(first, messages[i : i + 3])
    stores = [first, Store.open(path)]
    counts = [0, 0]

    def route(k: int) -> None:
        router = RetryRouter(stores[k])
        for _ in range(3):
            counts[k] += route_retries(stores[k], max_versions=2 + k, router=router)

    assert run_in_threads(route) == []
    assert sum(counts) == 30
    scheduled = [r for r in commit_log_rows(first) if r["topic"] == protocol.SCHEDULE_TOPIC]
    assert sorted(str(r["uniq_key"]) for r in scheduled) == sorted(m.uniq_key for m in messages)


# ----------------------------------------------------------------- DLQ admin
def _dead(store: Store, topic: str) -> tuple[MessageExt, MessageExt]:
    original = sent_message(store, topic, properties={"user": "v"})
    fail(store, [original])
    route_retries(store, max_reconsume_times=0)
    [dead] = pull_all(store, DLQ)
    return original, dead


def test_dlq_messages_is_empty_for_a_group_without_dead_letters(admin: Admin) -> None:
    assert admin.dlq_messages("nobody") == []


def test_dlq_messages_pages_by_offset(store: Store, topic: str, admin: Admin) -> None:
    producer = Producer(store)
    for i in range(3):
        producer.send(Message(topic, f"m{i}".encode()))
    fail(store, pull_all(store, topic))
    route_retries(store, max_reconsume_times=0)
    dispatch_pending(store)
    assert len(admin.dlq_messages(GROUP)) == 3
    assert len(admin.dlq_messages(GROUP, max_num=2)) == 2
    assert [m.queue_offset for m in admin.dlq_messages(GROUP, start_offset=2)] == [2]


def test_resend_dlq_sends_a_fresh_copy_to_the_original_topic(store: Store, topic: str, admin: Admin) -> None:
    original, dead = _dead(store, topic)
    result = admin.resend_dlq(GROUP, dead.msg_id)
    assert result.topic == topic
    resent = next(m for m in pull_all(store, topic) if m.offset_msg_id == result.offset_msg_id)
    assert resent.body == b"payload" and resent.tags == "TagA" and resent.keys == ("k1",)
    assert resent.reconsume_times == 0
    assert resent.properties[protocol.PROPERTY_ORIGIN_MESSAGE_ID] == original.offset_msg_id
    assert resent.properties["user"] == "v"
    assert protocol.PROPERTY_RECONSUME_TIME not in resent.properties
    assert protocol.PROPERTY_RETRY_TOPIC not in resent.properties
    assert result.msg_id == resent.msg_id == original.msg_id  # a resend keeps the message's id
    by_offset_id = admin.resend_dlq(GROUP, dead.offset_msg_id)  # the store's id of the DLQ copy too
    assert by_offset_id.topic == topic and by_offset_id.msg_id == original.msg_id
    assert by_offset_id.offset_msg_id != result.offset_msg_id


@pytest.mark.parametrize("msg_id", ["0" * 32, "not-an-id", "ABC"])
def test_resend_dlq_of_a_message_not_in_that_dlq_is_a_typed_error(
    store: Store, topic: str, admin: Admin, msg_id: str
) -> None:
    original, _ = _dead(store, topic)
    before = versions(store)
    with pytest.raises(InvalidArgumentError, match="not in the dead-letter queue"):
        admin.resend_dlq(GROUP, msg_id)
    with pytest.raises(InvalidArgumentError, match="not in the dead-letter queue"):
        admin.resend_dlq(GROUP, original.offset_msg_id)  # stored, but in the topic, not the DLQ
    with pytest.raises(InvalidArgumentError, match="no dead-letter queue"):
        admin.resend_dlq("other", msg_id)
    assert versions(store) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a.dlq_messages(""),
        lambda a: a.dlq_messages(GROUP, max_num=0),
        lambda a: a.dlq_messages(GROUP, max_num=True),
        lambda a: a.dlq_messages(GROUP, start_offset=-1),
        lambda a: a.resend_dlq("bad group!", "x"),
        lambda a: a.resend_dlq(GROUP, ""),
        lambda a: a.resend_dlq(GROUP, 7),
    ],
)
def test_bad_dlq_arguments_are_typed_errors(store: Store, admin: Admin, call: Any) -> None:
    before = versions(store)
    with pytest.raises(InvalidArgumentError):
        call(admin)
    assert versions(store) == before


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_versions": 0},
        {"max_reconsume_times": -2},
        {"max_reconsume_times": "16"},
        {"max_reconsume_times": {"g": -2}},
        {"now_ms": -5},
    ],
)
def test_route_retries_rejects_bad_arguments_and_writes_nothing(
    store: Store, topic: str, kwargs: dict[str, Any]
) -> None:
    fail(store, [sent_message(store, topic)])
    before = versions(store)
    with pytest.raises(InvalidArgumentError):
        route_retries(store, **kwargs)
    assert versions(store) == before


def test_route_action_rows_needs_the_version_column(store: Store) -> None:
    rows = schemas.ACTION_LOG_SCHEMA.empty_table()
    with pytest.raises(InvalidArgumentError, match="_version"):
        route_action_rows(store, rows)


# ----------------------------------------------------------------- pure rules
def test_reconsume_limit_precedence_is_message_then_group_then_default() -> None:
    assert max_reconsume_times({}, "g", None, 16) == 16
    assert max_reconsume_times({}, "g", 3, 16) == 3
    assert max_reconsume_times({}, "g", {"g": 2}, 16) == 2
    assert max_reconsume_times({}, "h", {"g": 2}, 16) == 16
    assert max_reconsume_times({protocol.PROPERTY_MAX_RECONSUME_TIMES: "5"}, "g", {"g": 2}, 16) == 5
    assert max_reconsume_times({protocol.PROPERTY_MAX_RECONSUME_TIMES: "junk"}, "g", 4, 16) == 4


def test_route_message_chooses_retry_below_the_limit_and_dlq_past_it() -> None:
    row = {
        "topic": "T",
        "msg_id": "M",
        "uniq_key": "U",
        "body": b"b",
        "tags": None,
        "keys": [],
        "properties": [],
        "born_ts_ms": 1,
        "reconsume_times": 15,
    }
    retry = route_message(row, "g", 1_000, None, 16)
    assert (retry.topic, retry.queue_id, retry.reconsume_times) == (protocol.SCHEDULE_TOPIC, 17, 16)
    assert retry.deliver_at_ms == 1_000 + DELAY_LEVELS_MS[17]  # level 3 + 15 = 18, the last
    dead = route_message({**row, "reconsume_times": 16}, "g", 1_000, None, 16)
    assert (dead.topic, dead.queue_id, dead.reconsume_times) == (DLQ, 0, 17)


# ----------------------------------------------------------------- the Spark job
@pytest.mark.spark
def test_run_retry_once_routes_failures_and_a_second_run_routes_nothing(
    spark: Any, store: Store, topic: str
) -> None:
    from engine.spark.jobs.retry import RetryStats, run_retry

    original = sent_message(store, topic)
    fail(store, [original])
    stats = RetryStats()
    checkpoint = str(store.root) + "/_cp_retry"
    query = run_retry(spark, store, once=True, checkpoint=checkpoint, stats=stats)
    assert not query.isActive and stats.routed == 1
    run_retry(spark, store, once=True, checkpoint=str(store.root) + "/_cp_retry_fresh", stats=stats)
    assert stats.routed == 1  # a fresh checkpoint replays the log: still routed once
    dispatch_pending(store)
    deliver_due(store, FAR_FUTURE)
    assert [m.uniq_key for m in pull_all(store, RETRY)] == [original.uniq_key]
