"""The system jobs on a store of three commit-log shards: schedule, retry / DLQ and transactions
write each message into its queue's shard and keep exactly-once per shard, also when a pass dies
between two shards' commits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from engine import Admin, Message, Producer, Store, TransactionProducer
from engine.broker.dispatch import dispatch_pending
from engine.broker.retry import ADVANCE_EVERY, RetryRouter, route_retries, routed_version
from engine.broker.schedule import Scheduler
from engine.broker.schedule_state import handled_mask, home_shard, read_state, schedule_progress
from engine.broker.transactions import check_transactions, undecided_halves
from engine.config import load_config
from engine.errors import InvalidArgumentError, StoreError
from engine.protocol.actions import NACK
from engine.protocol.names import (
    PROPERTY_REAL_TOPIC,
    SCHEDULE_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    dlq_topic,
)
from engine.protocol.schedule import TIMER_QUEUE_ID
from engine.protocol.shards import shard_base, shard_of_offset, shard_of_queue
from engine.protocol.transactions import LocalTransactionState
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.shards import CommitLogs, shared_commit_logs
from engine.store.commit_log.stamping import PendingMessage
from engine.store.commit_markers import RETRY_APP, schedule_queue_app, transaction_app
from engine.store.consume_queue import QueueIndex
from engine.store.store import now_ms
from engine.store.transactions import decision_shard, end_transaction, is_decided, load_half

SHARDS = 3
FAR_FUTURE = 10**13
TOPIC = "T"  # 4 queues: queue q lives on shard QUEUE_SHARDS[q]
QUEUE_SHARDS = [shard_of_queue(TOPIC, q, SHARDS) for q in range(4)]
ON = {shard: QUEUE_SHARDS.index(shard) for shard in range(SHARDS)}  # a queue of T on each shard


@pytest.fixture
def sharded(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "mq", config=load_config(commit_log_shards=SHARDS))
    Admin(store).create_topic(TOPIC, 4)
    return store


def rows_of(store: Store, shard: int, topic: str | None = None) -> list[dict[str, Any]]:
    rows = store.read(schemas.commit_log_table(shard)).to_pylist()
    return sorted(
        (r for r in rows if topic is None or r["topic"] == topic), key=lambda r: int(r["physical_offset"])
    )


def delivered(store: Store) -> Counter[tuple[int, int, bytes]]:
    """(shard, queue, body) of every message of topic T in every shard."""
    return Counter(
        (shard, int(r["queue_id"]), bytes(r["body"]))
        for shard in range(SHARDS)
        for r in rows_of(store, shard, TOPIC)
    )


def test_the_layout_the_tests_rely_on_spreads_queues_over_every_shard() -> None:
    assert sorted(set(QUEUE_SHARDS)) == [0, 1, 2]
    # The level queues of delays 1 and 4 and the timer queue share shard 0 with the schedule's state.
    assert [shard_of_queue(SCHEDULE_TOPIC, q, SHARDS) for q in (0, 3, TIMER_QUEUE_ID)] == [0, 0, 0]
    assert shard_of_queue(TRANS_HALF_TOPIC, 0, SHARDS) == 0


def crash_once(writer: CommitLogWriter) -> None:
    """Make the writer's next commit fail as if the process died just before it."""
    commit = writer.append
    calls: list[int] = []

    def failing(messages: Any, **kwargs: Any) -> Any:
        calls.append(len(messages))
        if len(calls) == 1:
            raise StoreError("injected: the process died before this shard's commit")
        return commit(messages, **kwargs)

    writer.append = failing  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- schedule
def send_delayed(store: Store, kind: str) -> None:
    """One delayed message (delay level 1, or a timer) bound for a queue of T on each shard."""
    producer = Producer(store)  # the schedule topic's queues used here live on shard 0
    for shard in range(SHARDS):
        body = f"to shard {shard}".encode()
        if kind == "level":
            producer.send(Message(TOPIC, body), delay_level=1, queue_id=ON[shard])
        else:
            producer.send(Message(TOPIC, body, deliver_at_ms=now_ms() + 3_600_000), queue_id=ON[shard])
    producer.close()
    dispatch_pending(store)


def expected() -> Counter[tuple[int, int, bytes]]:
    return Counter({(s, ON[s], f"to shard {s}".encode()): 1 for s in range(SHARDS)})


@pytest.mark.parametrize("kind", ["level", "timer"])
def test_a_due_message_is_delivered_once_into_its_real_queues_shard(sharded: Store, kind: str) -> None:
    send_delayed(sharded, kind)
    assert delivered(sharded) == Counter()
    scheduler = Scheduler(sharded)
    assert scheduler.deliver_due(FAR_FUTURE) == SHARDS
    assert delivered(sharded) == expected()
    assert scheduler.deliver_due(FAR_FUTURE) == 0
    assert Scheduler(Store.open(sharded.root)).deliver_due(FAR_FUTURE) == 0
    assert delivered(sharded) == expected()
    queue = 0 if kind == "level" else TIMER_QUEUE_ID
    assert schedule_progress(sharded)[queue] == SHARDS - 1
    # The other shards carry their own progress of the queue, in the same commit as the delivery:
    # the entry sent to shard k (offset k of the schedule queue) is covered there.
    for shard in (1, 2):
        state = read_state(sharded.snapshot(schemas.commit_log_table(shard)))
        if kind == "level":  # the end of the pass's range, which covers the entry
            assert (
                state.delivered[queue]
                == SHARDS - 1
                == sharded.app_version(schemas.commit_log_table(shard), schedule_queue_app(queue))
            )
        else:
            assert handled_mask(state.timer_prefix, state.timer_runs, np.array([shard])).tolist() == [True]


@pytest.mark.parametrize("kind", ["level", "timer"])
@pytest.mark.parametrize("failing", [2, 0])
def test_a_pass_that_dies_between_two_shards_commits_delivers_each_message_once(
    sharded: Store, kind: str, failing: int
) -> None:
    send_delayed(sharded, kind)
    assert home_shard(sharded) == 0
    scheduler = Scheduler(sharded)
    writer = scheduler._writers.writer(failing)
    crash_once(writer)
    with pytest.raises(StoreError, match="injected"):
        scheduler.deliver_due(FAR_FUTURE)
    # The shards committed before the failing one hold their deliveries already.
    before = delivered(sharded)
    assert sum(before.values()) == (1 if failing == 2 else 2)
    assert Scheduler(Store.open(sharded.root)).deliver_due(FAR_FUTURE) == SHARDS - sum(before.values())
    assert delivered(sharded) == expected()
    assert scheduler.deliver_due(FAR_FUTURE) == 0
    assert delivered(sharded) == expected()


def test_waiting_timers_moved_between_deliveries_to_other_shards_are_delivered_once(sharded: Store) -> None:
    producer = Producer(sharded)
    # Far enough ahead that none is due when sent, however slow the machine (a due timer is sent
    # straight to its topic).
    soon, late = now_ms() + 3_600_000, now_ms() + 7_200_000
    bodies = []
    for i in range(12):  # due timers bound for shards 1 and 2 between waiting ones (holes)
        shard, due = (1 + i % 4 // 2, soon) if i % 2 == 0 else (0, late)
        body = f"t{i}".encode()
        bodies.append((shard, body))
        producer.send(Message(TOPIC, body, deliver_at_ms=due), queue_id=ON[shard])
    producer.close()
    dispatch_pending(sharded)
    scheduler = Scheduler(sharded, max_timer_runs=2)
    assert scheduler.deliver_due(soon) == 6
    assert scheduler.moved > 0  # the waiting timers of the smallest holes went to the tail
    dispatch_pending(sharded)
    assert scheduler.deliver_due(FAR_FUTURE) == 6
    dispatch_pending(sharded)
    assert Scheduler(Store.open(sharded.root)).deliver_due(FAR_FUTURE) == 0
    assert delivered(sharded) == Counter((shard, ON[shard], body) for shard, body in bodies)


def test_two_schedulers_racing_on_a_sharded_store_deliver_each_message_once(sharded: Store) -> None:
    send_delayed(sharded, "level")
    winner, loser = Scheduler(sharded), Scheduler(Store.open(sharded.root))
    writer = loser._writers.writer(1)
    commit = writer.append
    raced: list[int] = []

    def race(messages: Any, **kwargs: Any) -> Any:
        if not raced:  # the winner delivers everything between the loser's plan and its commit
            raced.append(winner.deliver_due(FAR_FUTURE))
        return commit(messages, **kwargs)

    writer.append = race  # type: ignore[method-assign]
    assert loser.deliver_due(FAR_FUTURE) == 0
    assert raced == [SHARDS] and loser.lost_races >= 1
    assert delivered(sharded) == expected()


# ----------------------------------------------------------------------------- retry and DLQ
def stored(store: Store, shard: int, body: bytes, **kwargs: Any) -> int:
    """A message written straight into the queue of T on ``shard``; its physical offset."""
    message = PendingMessage(TOPIC, ON[shard], body, uniq_key=f"u-{body.decode()}", **kwargs)
    [stamped] = CommitLogWriter(store, shard=shard).append([message])
    assert shard_of_offset(stamped.physical_offset) == shard
    return stamped.physical_offset


def nack(store: Store, group: str, physical_offset: int) -> None:
    row = {
        "group": group,
        "consumer_id": "c",
        "sequence": 0,
        "action": NACK,
        "topic": TOPIC,
        "queue_id": 0,
        "queue_offset": 0,
        "physical_offset": physical_offset,
        "msg_id": None,
        "reconsume_times": 0,
        "deadline_ms": None,
        "ts_ms": now_ms(),
    }
    store.append(schemas.ACTION_LOG, pa.Table.from_pylist([row], schema=schemas.ACTION_LOG_SCHEMA))


def routed(store: Store) -> dict[str, list[tuple[int, bytes]]]:
    """(shard, body) of every retry (schedule-topic copy) and dead letter, by kind."""
    out: dict[str, list[tuple[int, bytes]]] = {"retry": [], "dlq": []}
    for shard in range(SHARDS):
        for r in rows_of(store, shard):
            if r["topic"] == SCHEDULE_TOPIC and dict(r["properties"]).get(PROPERTY_REAL_TOPIC, "").startswith(
                "%RETRY%"
            ):
                out["retry"].append((shard, bytes(r["body"])))
            elif str(r["topic"]).startswith("%DLQ%"):
                out["dlq"].append((shard, bytes(r["body"])))
    return out


def test_a_failure_on_one_shard_is_retried_and_dead_lettered_on_others(sharded: Store) -> None:
    retry_shard = shard_of_queue(SCHEDULE_TOPIC, 2, SHARDS)  # delay level 3: the first retry
    dlq_shard = shard_of_queue(dlq_topic("gA"), 0, SHARDS)
    assert (retry_shard, dlq_shard) == (2, 0)
    po = stored(sharded, 1, b"m")
    nack(sharded, "gB", po)  # gB retries
    nack(sharded, "gA", po)  # gA gives up at once
    assert route_retries(sharded, max_reconsume_times={"gA": 0}) == 2
    assert routed(sharded) == {"retry": [(retry_shard, b"m")], "dlq": [(dlq_shard, b"m")]}
    covered = sharded.version(schemas.ACTION_LOG)
    for shard in (0, 2):  # each shard that took a re-put records the range in the same commit
        assert sharded.app_version(schemas.commit_log_table(shard), RETRY_APP) == covered
    # Shard 1 took nothing: it records its progress only every ADVANCE_EVERY versions, so routing
    # resumes from there and skips what shards 0 and 2 cover.
    assert routed_version(sharded) == -1
    assert route_retries(sharded, max_reconsume_times={"gA": 0}) == 0
    assert routed(sharded) == {"retry": [(retry_shard, b"m")], "dlq": [(dlq_shard, b"m")]}


def test_a_shard_that_takes_no_re_puts_records_its_progress_every_advance_every_versions(
    sharded: Store,
) -> None:
    po = stored(sharded, 1, b"m")
    nack(sharded, "gA", po)  # a dead letter, on shard 0: shards 1 and 2 take nothing
    for _ in range(ADVANCE_EVERY):
        nack(sharded, "gA", shard_base(SHARDS) + 1)  # names no shard of the store: skipped
    assert route_retries(sharded, max_reconsume_times={"gA": 0}, max_versions=10_000) == 1
    covered = sharded.version(schemas.ACTION_LOG)
    assert routed_version(sharded) == covered
    assert [sharded.app_version(t, RETRY_APP) for t in sharded.commit_logs] == [covered] * SHARDS
    assert routed(sharded) == {"retry": [], "dlq": [(0, b"m")]}


def test_a_routing_that_dies_between_two_shards_commits_routes_each_failure_once(sharded: Store) -> None:
    po = stored(sharded, 1, b"m")
    nack(sharded, "gB", po)
    nack(sharded, "gA", po)
    router = RetryRouter(sharded, max_reconsume_times={"gA": 0})
    writer = router._writers.writer(2)  # the retry's shard commits after the DLQ's (shard 0)
    crash_once(writer)
    with pytest.raises(StoreError, match="injected"):
        route_retries(sharded, router=router)
    assert routed(sharded) == {"retry": [], "dlq": [(0, b"m")]}
    assert routed_version(sharded) == -1  # shard 2 has routed nothing: resume from there
    assert sharded.app_version(schemas.COMMIT_LOG, RETRY_APP) == sharded.version(schemas.ACTION_LOG)
    assert route_retries(Store.open(sharded.root), max_reconsume_times={"gA": 0}) == 1
    assert routed(sharded) == {"retry": [(2, b"m")], "dlq": [(0, b"m")]}
    assert route_retries(sharded, router=router) == 0


def test_two_routers_racing_on_a_sharded_store_route_each_failure_once(sharded: Store) -> None:
    po = stored(sharded, 1, b"m")
    nack(sharded, "gB", po)
    nack(sharded, "gA", po)
    limits = {"gA": 0}
    winner = RetryRouter(sharded, max_reconsume_times=limits)
    loser = RetryRouter(Store.open(sharded.root), max_reconsume_times=limits)
    writer = loser._writers.writer(2)  # the loser has committed shard 0 when it gets here
    commit = writer.append
    raced: list[int] = []

    def race(messages: Any, **kwargs: Any) -> Any:
        if not raced:  # the winner routes the whole range between the loser's plan and this commit
            raced.append(route_retries(sharded, router=winner))
        return commit(messages, **kwargs)

    writer.append = race  # type: ignore[method-assign]
    assert route_retries(Store.open(sharded.root), router=loser) == 1  # its dead letter only
    assert raced == [1]  # the winner found the dead letter routed and routed the retry
    assert routed(sharded) == {"retry": [(2, b"m")], "dlq": [(0, b"m")]}


# ----------------------------------------------------------------------------- transactions
class Answer:
    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state

    def __call__(self, message: Any) -> LocalTransactionState:
        return self.state


@pytest.fixture
def tx(sharded: Store) -> Iterator[Callable[..., TransactionProducer]]:
    made: list[TransactionProducer] = []

    def make(answer: LocalTransactionState = LocalTransactionState.UNKNOWN) -> TransactionProducer:
        producer = TransactionProducer(sharded, Answer(answer), check_poll_ms=3_600_000)
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.close()


@pytest.mark.parametrize("target", [1, 2])
def test_a_commit_puts_the_message_and_its_guard_on_the_real_queues_shard(
    sharded: Store, tx: Any, target: int
) -> None:
    result = tx().send_in_transaction(
        Message(TOPIC, b"paid"), lambda m: LocalTransactionState.COMMIT, queue_id=ON[target]
    )
    half = load_half(sharded, _half_offset(sharded))
    assert half is not None and shard_of_offset(half.physical_offset) == 0
    assert shard_of_offset(result.physical_offset) == target == decision_shard(sharded, half)
    assert [bytes(r["body"]) for r in rows_of(sharded, target, TOPIC)] == [b"paid"]
    guard = transaction_app(half.physical_offset)
    assert sharded.app_version(schemas.commit_log_table(target), guard) == 0
    assert sharded.app_version(schemas.COMMIT_LOG, guard) == -1  # not on the half's shard
    assert is_decided(sharded, half.physical_offset)
    assert undecided_halves(sharded)[0] == []


def _half_offset(store: Store) -> int:
    [row] = rows_of(store, 0, TRANS_HALF_TOPIC)
    return int(row["physical_offset"])


def test_a_rollback_is_recorded_on_the_real_queues_shard_and_shows_nothing(sharded: Store, tx: Any) -> None:
    tx().send_in_transaction(
        Message(TOPIC, b"cancelled"), lambda m: LocalTransactionState.ROLLBACK, queue_id=ON[2]
    )
    po = _half_offset(sharded)
    assert delivered(sharded) == Counter()
    [op] = rows_of(sharded, 2, TRANS_OP_HALF_TOPIC)
    assert shard_of_queue(TRANS_OP_HALF_TOPIC, int(op["queue_id"]), SHARDS) == 2
    assert sharded.app_version(schemas.commit_log_table(2), transaction_app(po)) == 0
    assert is_decided(sharded, po)
    # A later COMMIT of the same half loses to the rollback: both race on shard 2's sequencer.
    half = load_half(sharded, po)
    assert half is not None
    decision = end_transaction(sharded, CommitLogs(sharded), half, LocalTransactionState.COMMIT)
    assert decision.state is LocalTransactionState.ROLLBACK and not decision.won
    assert delivered(sharded) == Counter()


def test_the_check_back_reads_the_half_from_its_shard_and_decides_on_the_real_queues(
    sharded: Store, tx: Any
) -> None:
    producer = tx(LocalTransactionState.COMMIT)
    producer.send_in_transaction(
        Message(TOPIC, b"late"), lambda m: LocalTransactionState.UNKNOWN, queue_id=ON[2]
    )
    po = _half_offset(sharded)
    assert not is_decided(sharded, po)
    assert check_transactions(sharded, now_ms=FAR_FUTURE) == 1  # a CHECK request
    assert producer.answer_checks() == 1
    assert delivered(sharded) == Counter({(2, ON[2], b"late"): 1})
    assert is_decided(sharded, po)
    assert check_transactions(sharded, now_ms=FAR_FUTURE) == 0


def test_a_half_whose_checks_ran_out_is_rolled_back_on_its_real_shard_and_copied_once(
    sharded: Store, tx: Any
) -> None:
    unknown = LocalTransactionState.UNKNOWN
    tx().send_in_transaction(Message(TOPIC, b"lost"), lambda m: unknown, queue_id=ON[2])
    po = _half_offset(sharded)
    assert check_transactions(sharded, now_ms=FAR_FUTURE, max_checks=0) == 1
    assert is_decided(sharded, po)
    assert [r["topic"] for r in rows_of(sharded, 2) if r["topic"] != TOPIC] == [TRANS_OP_HALF_TOPIC]
    copy_shard = shard_of_queue(TRANS_CHECK_MAX_TIME_TOPIC, 0, SHARDS)
    assert copy_shard != 2
    assert [bytes(r["body"]) for r in rows_of(sharded, copy_shard, TRANS_CHECK_MAX_TIME_TOPIC)] == [b"lost"]
    assert check_transactions(sharded, now_ms=FAR_FUTURE, max_checks=0) == 0
    assert len(rows_of(sharded, copy_shard, TRANS_CHECK_MAX_TIME_TOPIC)) == 1


# ----------------------------------------------------------------------------- shard I/O
@pytest.mark.parametrize("bad", [shard_base(1) + 10**9, shard_base(SHARDS) + 1])
def test_an_offset_with_no_row_or_no_shard_is_a_typed_error(sharded: Store, bad: int) -> None:
    good = stored(sharded, 1, b"a")
    with pytest.raises(StoreError) as caught:
        QueueIndex(sharded).messages([good, bad])
    assert caught.value.context["offsets"] == [bad]


def test_the_jobs_writers_make_one_writer_per_shard_and_refuse_other_shards(sharded: Store) -> None:
    writers = CommitLogs(sharded)
    assert writers.writer(1) is writers.writer(1)
    assert writers.writer(writers.shard_of(TOPIC, ON[2])).shard == 2
    assert shared_commit_logs(sharded) is shared_commit_logs(sharded)
    with pytest.raises(InvalidArgumentError):
        writers.writer(SHARDS)
