"""Transactional messages: half messages, commit / rollback, check-back and its limits."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow.dataset as ds
import pytest

from engine import (
    Admin,
    InvalidArgumentError,
    InvalidMessageError,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    Store,
    SysFlag,
    TopicNotFoundError,
    TransactionError,
    TransactionProducer,
)
from engine.broker import transactions as transactions_module
from engine.broker.dispatch import dispatch_pending
from engine.broker.transactions import TransactionCheck, check_transactions, undecided_halves
from engine.protocol import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from engine.protocol.transactions import (
    EVENT_CHECK,
    EVENT_COMMIT,
    EVENT_ROLLBACK,
    PROPERTY_CHECK_IMMUNITY_TIME,
    PROPERTY_HALF_OFFSET,
    PROPERTY_PRODUCER_GROUP,
    REASON_MAX_CHECKS,
    next_check,
)
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.stamping import PendingMessage
from engine.store.commit_markers import transaction_app
from engine.store.transactions import end_transaction, is_decided, load_half
from tests.helpers import commit_log_rows, eventually, versions

COMMIT = LocalTransactionState.COMMIT
ROLLBACK = LocalTransactionState.ROLLBACK
UNKNOWN = LocalTransactionState.UNKNOWN
FUTURE = 10**13  # a clock far past every timeout


class Checker:
    """A checker that answers from a table and remembers what it was asked."""

    def __init__(self, answer: LocalTransactionState = UNKNOWN) -> None:
        self.answer = answer
        self.asked: list[MessageExt] = []

    def __call__(self, message: MessageExt) -> LocalTransactionState:
        self.asked.append(message)
        return self.answer


@pytest.fixture
def producers(store: Store) -> Iterator[Callable[..., TransactionProducer]]:
    made: list[TransactionProducer] = []

    def make(checker: Any = None, **kwargs: Any) -> TransactionProducer:
        kwargs.setdefault("check_poll_ms", 50)
        producer = TransactionProducer(store, checker or Checker(), **kwargs)
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.close()


def pull_all(store: Store, topic: str, queues: int = 4) -> list[MessageExt]:
    dispatch_pending(store)
    consumer = PullConsumer(store, "reader")
    found: list[MessageExt] = []
    for q in range(queues):
        result = consumer.pull(topic, q, 0, 32)
        if result.status is PullStatus.FOUND:
            found.extend(result.messages)
    return found


def transactions(store: Store, event: str | None = None) -> list[dict[str, Any]]:
    rows = store.read(schemas.TRANSACTIONS).to_pylist()
    return sorted((r for r in rows if event is None or r["event"] == event), key=lambda r: r["ts_ms"])


# ----------------------------------------------------------------------------- local decisions
def test_commit_makes_the_message_visible_in_its_real_queue(store: Store, topic: str, producers: Any) -> None:
    producer = producers(group="TXG")
    result = producer.send_in_transaction(
        Message(topic, b"order-1", tags="A", keys=("o1",)), lambda m: COMMIT
    )
    assert result.local_state is COMMIT and result.topic == topic and result.queue_offset == 0
    [message] = pull_all(store, topic)
    assert (message.body, message.tags, message.offset_msg_id) == (b"order-1", "A", result.offset_msg_id)
    assert message.sys_flag == SysFlag.COMMIT and message.uniq_key == result.uniq_key
    assert PROPERTY_REAL_TOPIC not in message.properties
    assert PROPERTY_TRANSACTION_PREPARED not in message.properties
    assert message.properties[PROPERTY_PRODUCER_GROUP] == "TXG"
    half = load_half(store, int(message.properties[PROPERTY_HALF_OFFSET]))
    assert half is not None and half.msg_id == result.transaction_id and half.topic == topic
    [row] = transactions(store, EVENT_COMMIT)
    assert (row["physical_offset"], row["reason"]) == (result.physical_offset, "LOCAL")


def test_rollback_never_becomes_visible(store: Store, topic: str, producers: Any) -> None:
    producer = producers()
    result = producer.send_in_transaction(Message(topic, b"x"), lambda m: ROLLBACK)
    assert result.local_state is ROLLBACK and result.topic == TRANS_HALF_TOPIC
    assert pull_all(store, topic) == []
    assert is_decided(store, result.physical_offset)
    ops = [r for r in commit_log_rows(store) if r["topic"] == TRANS_OP_HALF_TOPIC]
    assert len(ops) == 1 and ops[0]["sys_flag"] == SysFlag.ROLLBACK
    assert check_transactions(store, now_ms=FUTURE) == 0  # decided: never checked
    assert len(transactions(store, EVENT_ROLLBACK)) == 1


def test_half_messages_are_never_dispatched(store: Store, topic: str, producers: Any) -> None:
    producer = producers()
    producer.send_in_transaction(Message(topic, b"a"), lambda m: UNKNOWN)
    producer.send_in_transaction(Message(topic, b"b"), lambda m: ROLLBACK)
    producer.send_in_transaction(Message(topic, b"c"), lambda m: COMMIT)
    dispatch_pending(store)
    entries = store.read(schemas.CONSUME_QUEUE).to_pylist()
    assert [e["topic"] for e in entries] == [topic]
    halves = [r for r in commit_log_rows(store) if r["topic"] == TRANS_HALF_TOPIC]
    assert len(halves) == 3
    assert all(h["sys_flag"] == SysFlag.PREPARED and h["queue_offset"] == -1 for h in halves)
    props = dict(halves[0]["properties"])
    assert props[PROPERTY_REAL_TOPIC] == topic and props[PROPERTY_TRANSACTION_PREPARED] == "true"
    assert PROPERTY_REAL_QUEUE_ID in props and PROPERTY_PRODUCER_GROUP in props


def test_execute_raising_counts_as_unknown(store: Store, topic: str, producers: Any) -> None:
    producer = producers()

    def boom(message: Message) -> LocalTransactionState:
        raise RuntimeError("db down")

    result = producer.send_in_transaction(Message(topic, b"x"), boom)
    assert result.local_state is UNKNOWN and result.topic == TRANS_HALF_TOPIC and result.queue_offset == -1
    assert not is_decided(store, result.physical_offset)
    assert pull_all(store, topic) == []


# ----------------------------------------------------------------------------- check-back
@pytest.mark.parametrize("answer", [COMMIT, ROLLBACK])
def test_unknown_is_resolved_by_the_checker(store: Store, topic: str, producers: Any, answer: Any) -> None:
    checker = Checker(answer)
    producer = producers(checker, group="TXG")
    result = producer.send_in_transaction(Message(topic, b"late", keys=("k1",)), lambda m: UNKNOWN)
    assert check_transactions(store, now_ms=FUTURE) == 1
    assert eventually(lambda: is_decided(store, result.physical_offset))
    [asked] = checker.asked
    assert (asked.topic, asked.body, asked.msg_id) == (topic, b"late", result.msg_id)
    visible = pull_all(store, topic)
    assert [m.body for m in visible] == ([b"late"] if answer is COMMIT else [])
    [decision] = transactions(store, EVENT_COMMIT if answer is COMMIT else EVENT_ROLLBACK)
    assert (decision["reason"], decision["check_times"]) == ("CHECK", 1)


def test_checker_unknown_is_asked_again_then_rolled_back(store: Store, topic: str, producers: Any) -> None:
    checker = Checker(UNKNOWN)
    producer = producers(checker)
    result = producer.send_in_transaction(Message(topic, b"x"), lambda m: UNKNOWN)
    now = FUTURE
    for expected in (1, 2):
        assert check_transactions(store, now_ms=now, max_checks=2, check_interval_ms=1000) == 1
        assert check_transactions(store, now_ms=now, max_checks=2, check_interval_ms=1000) == 0  # too soon
        assert eventually(lambda n=expected: len(checker.asked) == n)  # type: ignore[misc]
        now += 1000
    assert check_transactions(store, now_ms=now, max_checks=2, check_interval_ms=1000) == 1  # gives up
    assert is_decided(store, result.physical_offset)
    [rollback] = transactions(store, EVENT_ROLLBACK)
    assert (rollback["reason"], rollback["check_times"]) == (REASON_MAX_CHECKS, 2)
    assert [r["check_times"] for r in transactions(store, EVENT_CHECK)] == [1, 2]
    assert pull_all(store, topic) == []
    assert check_transactions(store, now_ms=now + 10**6, max_checks=2, check_interval_ms=1000) == 0


def test_a_half_whose_checks_ran_out_is_kept_in_trans_check_max_time_topic(
    store: Store, topic: str, producers: Any
) -> None:
    producer = producers(Checker(UNKNOWN))
    result = producer.send_in_transaction(
        Message(topic, b"stuck", tags="T1", keys=("k1",), properties={"user": "v"}), lambda m: UNKNOWN
    )
    assert check_transactions(store, now_ms=FUTURE, max_checks=0) == 1  # gives up at once
    assert pull_all(store, topic) == []  # never delivered
    [kept] = pull_all(store, TRANS_CHECK_MAX_TIME_TOPIC, queues=1)
    assert (kept.body, kept.tags, kept.keys, kept.uniq_key) == (b"stuck", "T1", ("k1",), result.msg_id)
    assert kept.properties["user"] == "v"
    assert (kept.properties[PROPERTY_REAL_TOPIC], kept.properties[PROPERTY_HALF_OFFSET]) == (
        topic,
        str(result.physical_offset),
    )
    assert check_transactions(store, now_ms=FUTURE, max_checks=0) == 0  # decided: kept once


def test_check_immunity_time_replaces_the_timeout_of_its_half(
    store: Store, topic: str, producers: Any
) -> None:
    producer = producers()
    slow = producer.send_in_transaction(
        Message(topic, b"slow", properties={PROPERTY_CHECK_IMMUNITY_TIME: "60"}), lambda m: UNKNOWN
    )
    plain = producer.send_in_transaction(Message(topic, b"plain"), lambda m: UNKNOWN)
    born = int(load_half(store, slow.physical_offset).store_ts_ms)  # type: ignore[union-attr]
    assert check_transactions(store, now_ms=born + 30_000, check_interval_ms=10**9) == 1
    checked = [r["half_physical_offset"] for r in transactions(store, EVENT_CHECK)]
    assert checked == [plain.physical_offset]  # the plain half only (6 s timeout)
    assert check_transactions(store, now_ms=born + 61_000, check_interval_ms=10**9) == 1
    checked = [r["half_physical_offset"] for r in transactions(store, EVENT_CHECK)]
    assert sorted(checked) == sorted([plain.physical_offset, slow.physical_offset])


def test_young_halves_are_not_checked(store: Store, topic: str, producers: Any) -> None:
    producer = producers()
    producer.send_in_transaction(Message(topic, b"x"), lambda m: UNKNOWN)
    assert check_transactions(store, timeout_ms=3_600_000) == 0
    assert transactions(store) == []


def test_an_orphan_half_is_checked_by_another_producer_of_the_group(
    store: Store, topic: str, producers: Any
) -> None:
    dead = producers(Checker(UNKNOWN), group="TXG")
    result = dead.send_in_transaction(Message(topic, b"orphan"), lambda m: UNKNOWN)
    dead.close()  # dies before deciding
    heir = producers(Checker(COMMIT), group="TXG", check_poll_ms=10_000)
    check_transactions(store, now_ms=FUTURE)
    assert heir.answer_checks() == 1
    assert is_decided(store, result.physical_offset)
    assert [m.body for m in pull_all(store, topic)] == [b"orphan"]
    assert heir.answer_checks() == 0  # each request answered once


def test_racing_decisions_commit_once(store: Store, topic: str, producers: Any) -> None:
    producer = producers()
    result = producer.send_in_transaction(Message(topic, b"x"), lambda m: UNKNOWN)
    half = load_half(store, result.physical_offset)
    assert half is not None
    outcomes: list[Any] = []

    def decide() -> None:
        outcomes.append(end_transaction(store, CommitLogWriter(store), half, COMMIT))

    threads = [threading.Thread(target=decide) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(d.won for d in outcomes) == [False, False, True]
    assert all(d.state is COMMIT and d.committed is not None for d in outcomes)
    assert len({d.committed.physical_offset for d in outcomes}) == 1
    assert [m.body for m in pull_all(store, topic)] == [b"x"]
    later = end_transaction(store, CommitLogWriter(store), half, ROLLBACK)
    assert (later.won, later.state) == (False, COMMIT)


def test_local_decision_after_a_contrary_check_back_raises(store: Store, topic: str, producers: Any) -> None:
    checker = Checker(ROLLBACK)
    producer = producers(checker, check_poll_ms=10_000)

    def slow_commit(message: Message) -> LocalTransactionState:
        # Meanwhile the check job asks and the checker says ROLLBACK.
        check_transactions(store, now_ms=FUTURE)
        producer.answer_checks()
        return COMMIT

    with pytest.raises(TransactionError):
        producer.send_in_transaction(Message(topic, b"x"), slow_commit)
    assert pull_all(store, topic) == []


def test_undecided_halves_and_the_floor(store: Store, topic: str, producers: Any) -> None:
    producer = producers()
    first = producer.send_in_transaction(Message(topic, b"1"), lambda m: COMMIT)
    second = producer.send_in_transaction(Message(topic, b"2"), lambda m: UNKNOWN)
    halves, floor = undecided_halves(store, floor=0)
    assert [h.physical_offset for h in halves] == [second.physical_offset]
    assert floor == second.physical_offset > first.physical_offset
    check_transactions(store, now_ms=FUTURE, max_checks=0)  # rolls back the second at once
    halves, floor = undecided_halves(store)
    assert halves == [] and floor > second.physical_offset


def test_next_check_rules() -> None:
    assert next_check(0, None, 100, 15, 30) == EVENT_CHECK
    assert next_check(1, 90, 100, 15, 30) is None
    assert next_check(1, 70, 100, 15, 30) == EVENT_CHECK
    assert next_check(15, 70, 100, 15, 30) == EVENT_ROLLBACK
    assert next_check(15, 80, 100, 15, 30) is None


# ----------------------------------------------------------------------------- the Spark job
@pytest.mark.spark
def test_transaction_check_job_drives_the_check_back(
    spark: Any, store: Store, topic: str, producers: Any
) -> None:
    from engine.spark.jobs.transaction_check import CheckStats, run_transaction_check

    checker = Checker(COMMIT)
    producer = producers(checker, group="TXG")
    result = producer.send_in_transaction(Message(topic, b"checked"), lambda m: UNKNOWN)
    stats = CheckStats()
    query = run_transaction_check(spark, store, once=True, stats=stats, now_ms=FUTURE)
    assert not query.isActive and query.exception() is None
    assert (stats.passes, stats.acted) == (1, 1)
    assert eventually(lambda: is_decided(store, result.physical_offset))
    assert [m.body for m in pull_all(store, topic)] == [b"checked"]
    with pytest.raises(InvalidArgumentError):
        run_transaction_check(spark, store, once=True, max_checks=-1)


# ----------------------------------------------------------------------------- bad input
def test_bad_input_raises_typed_errors_and_writes_nothing(
    store: Store, topic: str, producers: Any, admin: Admin
) -> None:
    producer = producers()
    before = versions(store)
    with pytest.raises(InvalidArgumentError):
        TransactionProducer(store, "not callable")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        TransactionProducer(store, Checker(), check_poll_ms=0)
    with pytest.raises(InvalidArgumentError):
        producer.send_in_transaction(Message(topic, b"x"), None)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError):
        producer.send_in_transaction(Message(topic, b""), lambda m: COMMIT)
    with pytest.raises(InvalidMessageError):
        producer.send_in_transaction(Message(topic, b"x", deliver_at_ms=FUTURE), lambda m: COMMIT)
    with pytest.raises(InvalidMessageError):
        producer.send_in_transaction(Message(TRANS_HALF_TOPIC, b"x"), lambda m: COMMIT)
    with pytest.raises(InvalidMessageError):
        producer.send_in_transaction("not a message", lambda m: COMMIT)  # type: ignore[arg-type]
    with pytest.raises(TopicNotFoundError):
        producer.send_in_transaction(Message("Nope", b"x"), lambda m: COMMIT)
    with pytest.raises(InvalidArgumentError):
        producer.send_in_transaction(Message(topic, b"x"), lambda m: COMMIT, queue_id=99)
    for bad in ({"now_ms": -1}, {"timeout_ms": -5}, {"max_checks": "3"}, {"check_interval_ms": 1.5}):
        with pytest.raises(InvalidArgumentError):
            check_transactions(store, **bad)
    assert versions(store) == before
    assert store.read(schemas.COMMIT_LOG, filter=ds.field("topic") == TRANS_HALF_TOPIC).num_rows == 0


def test_a_decision_older_than_its_guard_is_found_by_content_and_never_taken_twice(
    store: Store, topic: str, producers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.store.commit_log import writer as commit_log

    eight_days_ago = commit_log.now_ms() - 8 * 24 * 3600 * 1000
    producer = producers(check_poll_ms=60_000)
    with monkeypatch.context() as m:  # everything below was stored and decided 8 days ago
        m.setattr(commit_log, "now_ms", lambda: eight_days_ago)
        producer.send_in_transaction(Message(topic, b"old commit"), lambda m: COMMIT)
        producer.send_in_transaction(Message(topic, b"old rollback"), lambda m: ROLLBACK)
        producer.send_in_transaction(Message(topic, b"old, undecided"), lambda m: UNKNOWN)
    committed, rolled, pending = sorted(
        r["physical_offset"] for r in commit_log_rows(store) if r["topic"] == TRANS_HALF_TOPIC
    )
    assert store.app_version(schemas.COMMIT_LOG, transaction_app(committed)) == -1  # the guard expired

    assert is_decided(store, committed) and is_decided(store, rolled)
    assert not is_decided(store, pending)
    halves, _ = undecided_halves(store, floor=0)
    assert [h.physical_offset for h in halves] == [pending]
    assert check_transactions(store, now_ms=FUTURE) == 1  # a CHECK for the undecided half only
    assert {r["half_physical_offset"] for r in transactions(store, EVENT_CHECK)} == {pending}

    writer = CommitLogWriter(store)
    for result, state in ((committed, COMMIT), (rolled, ROLLBACK)):
        half = load_half(store, result)
        assert half is not None
        again = end_transaction(store, writer, half, COMMIT)
        assert (again.won, again.state) == (False, state)
    assert [m.body for m in pull_all(store, topic)] == [b"old commit"]
    # A half undecided past the guard's lifetime is decided once, under a fresh guard.
    late = load_half(store, pending)
    assert late is not None
    assert end_transaction(store, writer, late, COMMIT).won
    assert not end_transaction(store, CommitLogWriter(store), late, COMMIT).won
    assert sorted(m.body for m in pull_all(store, topic)) == [b"old commit", b"old, undecided"]


@pytest.mark.parametrize("timer", [{"TIMER_DELAY_SEC": "30"}, {"TIMER_DELIVER_MS": str(FUTURE)}])
def test_a_transactional_message_with_timer_properties_is_refused(
    store: Store, topic: str, producers: Any, timer: dict[str, str]
) -> None:
    before = versions(store)
    with pytest.raises(InvalidMessageError, match="cannot be delayed"):
        producers().send_in_transaction(Message(topic, b"x", properties=timer), lambda m: COMMIT)
    assert versions(store) == before


# ----------------------------------------------------------------------------- the loop's check
def test_the_loops_check_reads_the_commit_log_only_while_a_half_may_be_undecided(
    store: Store, topic: str, producers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole: list[int] = []
    real = transactions_module._check
    monkeypatch.setattr(transactions_module, "_check", lambda *a, **k: whole.append(1) or real(*a, **k))
    check = TransactionCheck(store)
    assert check(FUTURE) == 0 and len(whole) == 1  # the first pass reads: it knows nothing yet
    with Producer(store) as plain:
        plain.send(Message(topic, b"plain"))
    assert check(FUTURE) == 0 and len(whole) == 1  # the new version holds no half: nothing read
    producer = producers(Checker(COMMIT), group="TXG")
    result = producer.send_in_transaction(Message(topic, b"tx"), lambda m: UNKNOWN)
    assert check(FUTURE) == 1 and len(whole) == 2  # a new half: read, and checked back
    assert eventually(lambda: is_decided(store, result.physical_offset))
    check(FUTURE)  # undecided at its last look: read again, and found decided
    assert len(whole) == 3
    assert check(FUTURE) == 0 and len(whole) == 3  # nothing undecided, nothing new
    # one file spanning the half topic (a group commit of sends to two topics)
    CommitLogWriter(store).append([PendingMessage("A", 0, b"a", "U-A"), PendingMessage("Z", 0, b"z", "U-Z")])
    check(FUTURE)
    assert len(whole) == 4  # its statistics cannot rule a half out


@pytest.mark.parametrize(
    ("stats", "may"),
    [
        (None, True),
        ("not json", True),
        ('{"numRecords":1}', True),
        ('{"minValues":{"topic":"A"},"maxValues":{"topic":"B"}}', False),
        ('{"minValues":{"topic":"A"},"maxValues":{"topic":"Z"}}', True),
        (
            '{"minValues":{"topic":"RMQ_SYS_TRANS_HALF_TOPIC"},"maxValues":{"topic":"RMQ_SYS_TRANS_HALF_TOPIC"}}',
            True,
        ),
        ('{"minValues":{"topic":"A"},"maxValues":{"topic":"B' + "b" * 40 + '"}}', True),  # maybe cut short
    ],
)
def test_a_file_may_hold_a_half_unless_its_topic_statistics_rule_it_out(stats: str | None, may: bool) -> None:
    assert transactions_module._may_hold(stats, TRANS_HALF_TOPIC) is may
