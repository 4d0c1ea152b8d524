"""Delayed and timer messages: the schedule delivers each due message to its real topic exactly once."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import (
    Admin,
    InvalidArgumentError,
    InvalidMessageError,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    Store,
)
from engine.broker.dispatch import dispatch_pending
from engine.broker.schedule import Scheduler, deliver_due
from engine.broker.schedule_state import add_handled, handled_mask, schedule_progress
from engine.protocol import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    SCHEDULE_TOPIC,
)
from engine.protocol.delays import DELAY_LEVELS_MS, MAX_DELAY_LEVEL
from engine.protocol.schedule import TIMER_QUEUE_ID
from engine.spark.jobs.schedule import _deliver_within
from engine.store import schemas
from engine.store.commit_markers import SCHEDULE_APP, schedule_queue_app
from engine.store.store import now_ms
from tests.helpers import commit_log_rows, run_in_threads, versions
from tests.raw_delta import raw_table

FAR_FUTURE = 10**13


def pull_all(store: Store, topic: str = "T") -> list[MessageExt]:
    """Every dispatched message of a topic, queue by queue."""
    dispatch_pending(store)
    consumer = PullConsumer(store, "checker")
    out: list[MessageExt] = []
    for qid in range(store.topic(topic).queues):
        offset = 0
        while True:
            result = consumer.pull(topic, qid, offset, max_nums=1024)
            out.extend(result.messages)
            if not result.messages:
                break
            offset = result.next_begin_offset
    return out


def deliver(store: Store, now: int | None = None, scheduler: Scheduler | None = None) -> int:
    dispatch_pending(store)
    return (scheduler or Scheduler(store)).deliver_due(now)


def uniq_counts(messages: list[MessageExt]) -> Counter[str]:
    return Counter(m.uniq_key for m in messages)


# ----------------------------------------------------------------- the schedule rows
def test_each_delay_level_stores_its_due_time_in_the_schedule_row(store: Store, topic: str) -> None:
    producer = Producer(store)
    for level in range(1, MAX_DELAY_LEVEL + 1):
        producer.send(Message(topic, f"level {level}".encode()), delay_level=level, queue_id=1)
    rows = [r for r in commit_log_rows(store) if r["topic"] == SCHEDULE_TOPIC]
    assert len(rows) == MAX_DELAY_LEVEL
    for row in rows:
        level = int(row["delay_level"])  # type: ignore[call-overload]
        props = dict(row["properties"])  # type: ignore[call-overload]
        assert row["queue_id"] == level - 1
        assert row["deliver_at_ms"] == int(row["born_ts_ms"]) + DELAY_LEVELS_MS[level - 1]  # type: ignore[call-overload]
        assert row["tags_code"] == row["deliver_at_ms"]
        assert props[PROPERTY_DELAY] == str(level)
        assert props[PROPERTY_REAL_TOPIC] == topic
        assert props[PROPERTY_REAL_QUEUE_ID] == "1"


def test_a_delayed_message_is_not_delivered_before_its_due_time(store: Store, topic: str) -> None:
    Producer(store).send(Message(topic, b"x"), delay_level=1)
    due = int(commit_log_rows(store)[0]["deliver_at_ms"])  # type: ignore[call-overload]
    assert deliver(store, due - 1) == 0
    assert pull_all(store) == []
    assert deliver(store, due) == 1
    assert [m.body for m in pull_all(store)] == [b"x"]


def test_a_delivered_message_keeps_its_identity_and_real_destination_but_not_its_delay(
    store: Store, topic: str
) -> None:
    sent = Producer(store).send(
        Message(topic, b"body", tags="TagA", keys=("k1", "k2"), properties={"user": "v"}),
        delay_level=2,
        queue_id=3,
    )
    scheduled = commit_log_rows(store)[0]
    assert deliver(store, FAR_FUTURE) == 1
    [message] = pull_all(store)
    assert (message.topic, message.queue_id) == (topic, 3)
    assert (message.body, message.tags, message.keys) == (b"body", "TagA", ("k1", "k2"))
    assert message.uniq_key == sent.uniq_key
    assert message.born_ts_ms == scheduled["born_ts_ms"]
    assert message.reconsume_times == 0
    assert message.properties["user"] == "v"
    assert PROPERTY_DELAY not in message.properties
    # RocketMQ's ScheduleMessageService clears only the delay: REAL_TOPIC / REAL_QID stay.
    assert (message.properties[PROPERTY_REAL_TOPIC], message.properties[PROPERTY_REAL_QUEUE_ID]) == (
        topic,
        "3",
    )


def test_a_delayed_send_result_names_the_real_topic_and_queue(store: Store, topic: str) -> None:
    sent = Producer(store).send(Message(topic, b"x"), delay_level=2, queue_id=3)
    assert (sent.topic, sent.queue_id) == (topic, 3)
    [row] = commit_log_rows(store)
    assert (row["topic"], sent.offset_msg_id, sent.msg_id) == (SCHEDULE_TOPIC, row["msg_id"], row["uniq_key"])


def test_a_delay_level_above_the_highest_is_clamped_to_it(store: Store, topic: str) -> None:
    sent = Producer(store).send(Message(topic, b"x"), delay_level=19)
    [row] = commit_log_rows(store)
    assert (row["queue_id"], row["delay_level"]) == (MAX_DELAY_LEVEL - 1, MAX_DELAY_LEVEL)
    assert sent.topic == topic


@pytest.mark.parametrize("level", [-1, True, "3", 2.0])
def test_a_bad_delay_level_is_refused_and_writes_nothing(store: Store, topic: str, level: object) -> None:
    before = versions(store)
    with pytest.raises(InvalidArgumentError):
        Producer(store).send(Message(topic, b"x"), delay_level=level)  # type: ignore[arg-type]
    assert versions(store) == before


def test_level_queues_deliver_in_offset_order_up_to_the_first_message_not_due(
    store: Store, topic: str
) -> None:
    producer = Producer(store)
    for i in range(3):
        producer.send(Message(topic, f"m{i}".encode()), delay_level=1, queue_id=0)
    dues = [int(r["deliver_at_ms"]) for r in commit_log_rows(store)]  # type: ignore[call-overload]
    assert deliver(store, dues[1]) == 2
    assert schedule_progress(store)[0] == 1
    assert deliver(store, FAR_FUTURE) == 1
    assert [m.body for m in pull_all(store)] == [b"m0", b"m1", b"m2"]


# ----------------------------------------------------------------- timers
@pytest.mark.parametrize(
    ("properties", "ahead_ms"),
    [
        ({"TIMER_DELAY_SEC": "90"}, 90_000),
        ({"TIMER_DELAY_MS": "4500"}, 4_500),
        ({"TIMER_DELIVER_MS": None}, 60_000),
    ],
)
def test_timer_properties_make_a_timer_message(
    store: Store, topic: str, properties: dict[str, str | None], ahead_ms: int
) -> None:
    before = now_ms()
    props = {k: (v if v is not None else str(before + ahead_ms)) for k, v in properties.items()}
    sent = Producer(store).send(Message(topic, b"t", properties=props), queue_id=1)
    after = now_ms()
    [row] = commit_log_rows(store)
    assert (row["topic"], row["queue_id"]) == (SCHEDULE_TOPIC, TIMER_QUEUE_ID)
    assert before + ahead_ms <= int(row["deliver_at_ms"]) <= after + ahead_ms  # type: ignore[call-overload]
    assert (sent.topic, sent.queue_id) == (topic, 1)
    assert deliver(store, int(row["deliver_at_ms"]) - 1) == 0  # type: ignore[call-overload]
    assert deliver(store, FAR_FUTURE) == 1
    [message] = pull_all(store)
    assert (message.queue_id, message.body) == (1, b"t")
    assert not {"TIMER_DELAY_SEC", "TIMER_DELAY_MS", PROPERTY_REAL_TOPIC} & set(message.properties)


@pytest.mark.parametrize(
    "message",
    [
        Message("T", b"t", properties={"TIMER_DELAY_SEC": str(3 * 86_400 + 60)}),
        Message("T", b"t", properties={"TIMER_DELAY_MS": "soon"}),
        Message("T", b"t", deliver_at_ms=10**13),
    ],
)
def test_a_timer_beyond_timer_max_delay_sec_or_malformed_is_refused(
    store: Store, topic: str, message: Message
) -> None:
    before = versions(store)
    with pytest.raises(InvalidMessageError, match="timer"):
        Producer(store).send(message)
    assert versions(store) == before


def test_timer_max_delay_sec_defaults_to_three_days_and_is_a_setting(store: Store, topic: str) -> None:
    assert store.config.timer_max_delay_sec == 3 * 86_400
    short = Store.open(store.root, config=store.config.replace(timer_max_delay_sec=10))
    with pytest.raises(InvalidMessageError, match="10 s"):
        Producer(short).send(Message(topic, b"t", properties={"TIMER_DELAY_SEC": "11"}))
    Producer(short).send(Message(topic, b"t", properties={"TIMER_DELAY_SEC": "10"}))


def test_timers_are_delivered_by_due_time_not_by_send_order(store: Store, topic: str) -> None:
    producer = Producer(store)
    base = now_ms()
    offsets_ms = [60_000, 1_000, 30_000, 2_000, 120_000]
    for i, ahead in enumerate(offsets_ms):
        producer.send(Message(topic, f"t{i}".encode(), deliver_at_ms=base + ahead), queue_id=0)
    row = commit_log_rows(store)[0]
    assert row["queue_id"] == TIMER_QUEUE_ID
    assert row["deliver_at_ms"] == row["tags_code"] == base + 60_000
    assert dict(row["properties"])[PROPERTY_TIMER_DELIVER_MS] == str(base + 60_000)  # type: ignore[call-overload]

    assert deliver(store, base + 2_000) == 2  # the 1 s and 2 s timers, behind a 60 s one
    assert [m.body for m in pull_all(store)] == [b"t1", b"t3"]
    assert schedule_progress(store)[TIMER_QUEUE_ID] == -1  # t0 still waits at offset 0
    assert deliver(store, base + 2_000) == 0
    assert deliver(store, base + 60_000) == 2
    assert deliver(store, FAR_FUTURE) == 1
    assert [m.body for m in pull_all(store)] == [b"t1", b"t3", b"t2", b"t0", b"t4"]
    assert schedule_progress(store)[TIMER_QUEUE_ID] == 4


def test_a_timer_already_due_is_stored_in_its_topic_at_once(store: Store, topic: str) -> None:
    Producer(store).send(Message(topic, b"t", properties={"TIMER_DELAY_SEC": "0"}))
    [row] = commit_log_rows(store)
    assert row["topic"] == topic


def test_a_timer_in_the_past_is_stored_in_its_topic_at_once(store: Store, topic: str) -> None:
    # RocketMQ's transformTimerMessage leaves a message due already in its real topic.
    Producer(store).send(Message(topic, b"late", deliver_at_ms=now_ms() - 5_000))
    assert deliver(store) == 0
    assert [m.body for m in pull_all(store)] == [b"late"]


def test_timer_runs_stay_bounded_by_moving_waiting_timers(store: Store, topic: str) -> None:
    producer = Producer(store)
    base = now_ms()
    # long, short, long, short, ...: every delivered short timer would leave a run of its own
    for i in range(20):
        ahead = 3_600_000 if i % 2 == 0 else 1_000
        producer.send(Message(topic, f"t{i}".encode(), deliver_at_ms=base + ahead), queue_id=0)
    scheduler = Scheduler(store, max_timer_runs=4)
    assert deliver(store, base + 1_000, scheduler) == 10
    assert scheduler.moved > 0
    state = scheduler._read_state(store.snapshot(schemas.COMMIT_LOG))
    assert len(state.timer_runs) <= 4
    moved_rows = [r for r in commit_log_rows(store) if r["topic"] == SCHEDULE_TOPIC]
    assert len(moved_rows) == 20 + scheduler.moved
    # a fresh scheduler (a restart) finds the same state and delivers the rest exactly once
    assert deliver(store, base + 1_000) == 0
    assert deliver(store, FAR_FUTURE) == 10
    counts = uniq_counts(pull_all(store))
    assert len(counts) == 20 and set(counts.values()) == {1}


def test_the_timer_state_is_found_after_many_later_commits_and_restated(store: Store, topic: str) -> None:
    producer = Producer(store)
    base = now_ms()
    producer.send(Message(topic, b"long", deliver_at_ms=base + 3_600_000), queue_id=0)
    producer.send(Message(topic, b"short", deliver_at_ms=base + 1_000), queue_id=0)
    assert deliver(store, base + 1_000) == 1
    for i in range(40):  # later commits push the state commit down the log
        producer.send(Message(topic, f"plain{i}".encode()))
    scheduler = Scheduler(store, refresh_versions=10)
    assert deliver(store, base + 1_000, scheduler) == 0  # found 40 commits back; restated
    info = raw_table(store, schemas.COMMIT_LOG).history(1)[0]
    assert SCHEDULE_APP in info
    assert deliver(store, FAR_FUTURE) == 1
    assert Counter(m.body for m in pull_all(store) if m.body in (b"long", b"short")) == {
        b"long": 1,
        b"short": 1,
    }


def test_the_timer_state_commit_is_found_by_its_own_version_on_a_handle_behind_the_log(
    store: Store, topic: str
) -> None:
    producer = Producer(store)
    base = now_ms()
    producer.send(Message(topic, b"long", deliver_at_ms=base + 3_600_000), queue_id=0)
    producer.send(Message(topic, b"short", deliver_at_ms=base + 1_000), queue_id=0)
    assert deliver(store, base + 1_000) == 1
    stale = store.snapshot(schemas.COMMIT_LOG)
    state_version = stale.version()  # the delivery commit holds the timer state
    for i in range(5):  # the log moves on; the handle stays behind
        producer.send(Message(topic, f"plain{i}".encode()))
    assert store.snapshot(schemas.COMMIT_LOG).version() == state_version + 5
    state = Scheduler(store)._read_state(stale)
    assert state.version == state_version and state.timer_runs


# ----------------------------------------------------------------- exactly once
def test_deliver_due_twice_delivers_once(store: Store, topic: str) -> None:
    producer = Producer(store)
    producer.send(Message(topic, b"d"), delay_level=1)
    producer.send(Message(topic, b"t", deliver_at_ms=now_ms() + 60_000))
    dispatch_pending(store)
    assert deliver_due(store, FAR_FUTURE) == 2
    assert deliver_due(store, FAR_FUTURE) == 0
    before = versions(store)
    assert deliver_due(store, FAR_FUTURE) == 0
    assert versions(store) == before  # nothing due: no commit
    assert sorted(m.body for m in pull_all(store)) == [b"d", b"t"]


def test_two_stores_delivering_concurrently_deliver_each_message_once(tmp_path: Path) -> None:
    path = tmp_path / "mqdata"
    first = Store.open(path)
    Admin(first).create_topic("T", 4)
    producer = Producer(first)
    base = now_ms()
    rng = np.random.default_rng(7)
    for i in range(60):
        if i % 3:
            producer.send(Message("T", f"d{i}".encode()), delay_level=int(rng.integers(1, 4)))
        else:
            ahead = int(rng.integers(60_000, 80_000))  # a timer due already would skip the schedule
            producer.send(Message("T", f"t{i}".encode(), deliver_at_ms=base + ahead))
    dispatch_pending(first)
    stores = [first, Store.open(path)]
    delivered = [0, 0]

    def deliver_from(k: int) -> None:
        scheduler = Scheduler(stores[k], max_messages_per_pass=7)
        for step in range(12):  # clocks advance differently in each instance
            delivered[k] += scheduler.deliver_due(base + 58_000 + 1_000 * (step + k) * 2)
        delivered[k] += scheduler.deliver_due(FAR_FUTURE)

    assert run_in_threads(deliver_from) == []
    assert sum(delivered) == 60
    counts = uniq_counts(pull_all(first))
    assert len(counts) == 60 and set(counts.values()) == {1}


def test_a_restart_mid_stream_loses_and_duplicates_nothing(store: Store, topic: str) -> None:
    producer = Producer(store)
    base = now_ms()
    for i in range(10):
        # Timers far enough ahead to be timers however slow the sends (a due one is stored at once).
        producer.send(Message(topic, f"a{i}".encode(), deliver_at_ms=base + 60_000 + (i % 4) * 1_000))
        producer.send(Message(topic, f"b{i}".encode()), delay_level=1 + i % 2)
    first = deliver(store, base + 61_500, Scheduler(store))
    assert 0 < first < 20
    for i in range(10):  # more arrive while the job is down
        producer.send(Message(topic, f"c{i}".encode(), deliver_at_ms=base + 60_000 + (i % 3) * 1_000))
    second = deliver(store, base + 62_500, Scheduler(store))  # the restarted job
    rest = deliver(store, FAR_FUTURE, Scheduler(store))
    assert first + second + rest == 30
    counts = uniq_counts(pull_all(store))
    assert len(counts) == 30 and set(counts.values()) == {1}
    assert schedule_progress(store)[TIMER_QUEUE_ID] == 19


def test_a_pass_that_loses_its_race_re_reads_and_delivers_nothing_twice(store: Store, topic: str) -> None:
    producer = Producer(store)
    for i in range(8):
        producer.send(Message(topic, f"m{i}".encode()), delay_level=1, queue_id=0)
    dispatch_pending(store)
    dues = [int(r["deliver_at_ms"]) for r in commit_log_rows(store)]  # type: ignore[call-overload]
    winner, loser = Scheduler(store), Scheduler(Store.open(store.root))
    commit = loser._writer.append
    raced: list[int] = []

    def race(messages: Any, **kwargs: Any) -> Any:
        if not raced:  # the winner commits 0..3 between the loser's decision (0..5) and its commit
            raced.append(winner.deliver_due(dues[3]))
        return commit(messages, **kwargs)

    loser._writer.append = race  # type: ignore[method-assign]
    assert loser.deliver_due(dues[5]) == 2  # 4 and 5, after reading the winner's commit
    assert raced == [4] and loser.lost_races == 1
    assert deliver_due(store, FAR_FUTURE) == 2
    assert [m.body for m in pull_all(store)] == [f"m{i}".encode() for i in range(8)]


def test_a_pass_larger_than_the_budget_takes_several_commits(store: Store, topic: str) -> None:
    producer = Producer(store)
    for i in range(9):
        producer.send(Message(topic, f"m{i}".encode()), delay_level=1)
    before = store.version(schemas.COMMIT_LOG)
    assert deliver(store, FAR_FUTURE, Scheduler(store, max_messages_per_pass=4)) == 9
    assert store.version(schemas.COMMIT_LOG) == before + 3
    assert store.app_version(schemas.COMMIT_LOG, schedule_queue_app(0)) == 8


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize("now", [-1, 1.5, True, "now"])
def test_deliver_due_rejects_a_bad_clock_and_writes_nothing(store: Store, topic: str, now: Any) -> None:
    Producer(store).send(Message(topic, b"x"), delay_level=1)
    dispatch_pending(store)
    before = versions(store)
    with pytest.raises(InvalidArgumentError):
        deliver_due(store, now)
    assert versions(store) == before


@pytest.mark.parametrize("setting", ["max_messages_per_pass", "max_timer_runs", "refresh_versions"])
def test_scheduler_rejects_bad_limits(store: Store, setting: str) -> None:
    with pytest.raises(InvalidArgumentError):
        Scheduler(store, **{setting: 0})


# ----------------------------------------------------------------- pure state rules
def test_add_handled_merges_runs_and_absorbs_them_into_the_prefix() -> None:
    assert add_handled(-1, (), [3, 4, 6]) == (-1, ((3, 4), (6, 6)))
    assert add_handled(-1, ((3, 4), (6, 6)), [5]) == (-1, ((3, 6),))
    assert add_handled(-1, ((3, 6),), [0, 1, 2]) == (6, ())
    assert add_handled(6, (), [2, 7, 9]) == (7, ((9, 9),))


def test_handled_mask_covers_the_prefix_and_the_runs() -> None:
    offsets = np.arange(0, 10, dtype=np.int64)
    mask = handled_mask(1, ((4, 5), (8, 8)), offsets)
    assert mask.tolist() == [True, True, False, False, True, True, False, False, True, False]


# ----------------------------------------------------------------- the Spark job
@pytest.mark.spark
def test_run_schedule_once_delivers_what_is_due_and_exits(spark: Any, store: Store, topic: str) -> None:
    from engine.spark.jobs.schedule import ScheduleStats, run_schedule

    producer = Producer(store)
    due = now_ms() + 200
    producer.send(Message(topic, b"due", deliver_at_ms=due))
    producer.send(Message(topic, b"later", deliver_at_ms=now_ms() + 3_600_000))
    while now_ms() <= due:  # a timer due already when sent would not wait in the schedule at all
        time.sleep(0.05)
    stats = ScheduleStats()
    query = run_schedule(spark, store, once=True, checkpoint=str(store.root) + "/_cp_schedule", stats=stats)
    assert not query.isActive
    assert stats.delivered == 1
    consumer = PullConsumer(store, "g")  # --once dispatched the delivery: pullable as is
    assert [m.body for q in range(4) for m in consumer.pull(topic, q, 0).messages] == [b"due"]
    run_schedule(spark, store, once=True, checkpoint=str(store.root) + "/_cp_schedule", stats=stats)
    assert stats.delivered == 1


@pytest.mark.spark
@pytest.mark.slow
def test_a_one_second_delay_through_the_running_jobs(spark: Any, store: Store, topic: str) -> None:
    from engine.spark.jobs.dispatch import run_dispatch
    from engine.spark.jobs.schedule import run_schedule

    dispatch = run_dispatch(spark, store, once=False, checkpoint=str(store.root) + "/_cp_dispatch")
    schedule = run_schedule(
        spark, store, once=False, checkpoint=str(store.root) + "/_cp_schedule", trigger_ms=200
    )
    try:
        sent = Producer(store).send(Message(topic, b"one second"), delay_level=1, queue_id=0)
        due = int(commit_log_rows(store)[0]["deliver_at_ms"])  # type: ignore[call-overload]
        consumer = PullConsumer(store, "g")
        found: list[MessageExt] = []
        deadline = time.monotonic() + 120  # a busy 2-core machine starts streaming queries slowly
        while not found and time.monotonic() < deadline:
            result = consumer.pull(topic, 0, 0)
            if result.messages:
                assert now_ms() >= due  # never visible before its due time
                found = result.messages
            else:
                time.sleep(0.05)
        # Lateness is a benchmark target (bench/), never asserted in a timed test.
        assert [m.uniq_key for m in found] == [sent.uniq_key]
        assert found[0].store_ts_ms >= due
        assert schedule.exception() is None and dispatch.exception() is None
    finally:
        schedule.stop()
        dispatch.stop()


def test_next_due_is_the_earliest_waiting_message_still_ahead(store: Store, topic: str) -> None:
    base = now_ms()
    with Producer(store) as producer:
        producer.send(Message(topic, b"timer", deliver_at_ms=base + 50_000), queue_id=0)
        producer.send(Message(topic, b"level"), delay_level=3, queue_id=0)  # 10 s
    dispatch_pending(store)  # a scheduler sees what dispatch committed
    scheduler = Scheduler(store)
    assert scheduler.next_due_ms() is None  # nothing seen before a pass
    assert scheduler.deliver_due(base) == 0
    level = next(r for r in commit_log_rows(store) if r["body"] == b"level")
    level_due = int(level["deliver_at_ms"])  # type: ignore[call-overload]
    assert scheduler.next_due_ms() == level_due
    assert scheduler.deliver_due(level_due) == 1
    assert scheduler.next_due_ms() == base + 50_000  # the timer is next
    assert scheduler.deliver_due(base + 50_000) == 1
    assert scheduler.next_due_ms() is None


class _Due:
    """A scheduler stand-in: one message due ``ahead_ms`` from now, then nothing."""

    def __init__(self, ahead_ms: int) -> None:
        self.due: int | None = now_ms() + ahead_ms
        self.calls: list[int] = []

    def next_due_ms(self) -> int | None:
        return self.due

    def deliver_due(self) -> int:
        self.calls.append(now_ms())
        if self.due is not None and now_ms() >= self.due:
            self.due = None
            return 1
        return 0


def test_a_running_schedule_job_delivers_at_the_due_time_within_its_tick_not_at_the_next() -> None:
    soon = _Due(30)
    due = soon.due
    assert due is not None
    assert _deliver_within(soon, trigger_ms=250) == 1  # type: ignore[arg-type]
    assert soon.calls[0] >= due  # it waited for the due time, then delivered, in this tick
    later = _Due(10_000)
    assert _deliver_within(later, trigger_ms=250) == 0 and later.calls == []  # a later tick's work


# ----------------------------------------------------------------- passes with nothing to do
def test_a_pass_with_nothing_new_and_nothing_due_reads_no_commit_log(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = Scheduler(store)
    caught_up: list[int] = []  # the passes that caught the commit log up to read the state
    real = scheduler._read_state
    monkeypatch.setattr(scheduler, "_read_state", lambda dt: caught_up.append(dt.version()) or real(dt))
    refreshed: list[int] = []  # the passes that caught the whole consume queue up
    index = scheduler._index
    real_refresh = index.refresh
    monkeypatch.setattr(index, "refresh", lambda **kw: refreshed.append(1) or real_refresh(**kw))
    producer = Producer(store)
    producer.send(Message(topic, b"level"), delay_level=1)
    producer.send(Message(topic, b"timer", deliver_at_ms=now_ms() + 3_600_000))
    level_due = min(int(r["deliver_at_ms"]) for r in commit_log_rows(store))  # type: ignore[call-overload]
    assert deliver(store, level_due - 1, scheduler) == 0 and len(caught_up) == 1  # the first pass reads
    assert deliver(store, level_due - 1, scheduler) == 0 and len(caught_up) == 1  # nothing new, nothing due
    assert len(refreshed) == 1
    producer.send(Message(topic, b"plain"))  # a commit, but no schedule entry
    assert deliver(store, level_due - 1, scheduler) == 0 and len(caught_up) == 1
    assert len(refreshed) == 1  # the newest consume-queue commit leaves the schedule topic as it was
    assert deliver(store, level_due, scheduler) == 1 and len(caught_up) == 2  # the level message is due
    producer.send(Message(topic, b"later"), delay_level=2)  # a new schedule entry: read again
    assert deliver(store, level_due, scheduler) == 0 and len(caught_up) == 3
    assert deliver(store, FAR_FUTURE, scheduler) == 2  # the second level message and the timer
    assert sorted(m.body for m in pull_all(store)) == [b"later", b"level", b"plain", b"timer"]
