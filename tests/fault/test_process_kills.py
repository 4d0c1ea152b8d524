"""Process-level faults: producers, dispatchers and consumers SIGKILLed at random moments, eight
producers contending for the sequencer, compaction racing appends and pulls.

Every child is a real process (``tests/fault/workers.py``) that fsyncs each outcome to its own
history file before acting on it. After the faults, :func:`tests.fault.history.check` compares the
histories with the store; the figures go to FAULTS.md and the test asserts that no acknowledged
message was lost, nothing is in the logs twice, and every queue's offsets are dense and monotonic.

Random moments come from a seeded generator; the seed is in the record and in a failing test's
captured output, and ``MQ_FAULT_SEED=<seed>`` replays the same moments (as far as timing allows).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, Message, Producer, PullConsumer, PullStatus, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.config import STORAGE_ENV_PREFIX
from engine.protocol.actions import ACK
from engine.spark.jobs.streams import DELTA_SOURCE, checkpoint_location
from engine.store import schemas
from engine.store.action_log import read_actions
from engine.store.commit_log.hwm import read_hwm
from engine.store.commit_markers import MAINTENANCE_KEY
from engine.store.consume_queue import dispatched_version, queue_marks
from tests.fault.history import (
    Figures,
    History,
    HistoryLog,
    Storage,
    check,
    make_body,
    misreported_offsets,
    record,
)
from tests.fault.procs import Child, event_lines, kill_once_sending, spawn, wait_until, worker
from tests.fault.scenario import timed
from tests.raw_delta import raw_table, through_gaps

pytestmark = pytest.mark.fault

SEED = int(os.environ.get("MQ_FAULT_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)


@pytest.fixture
def rng() -> random.Random:
    print(f"random moments from MQ_FAULT_SEED={SEED}")  # shown with a failure: rerun with it
    return random.Random(SEED)


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """Where the children's stdout and stderr go."""
    return tmp_path / "logs"


def _backlog(store: Store) -> int:
    """Messages committed to the commit log and not yet in the consume queue (from both tables' marks).

    Not ``commit_log version - dispatched version``: compaction commits add versions with no new
    rows, which dispatch never marks.
    """
    written = read_hwm(store.snapshot(schemas.COMMIT_LOG))
    dispatched = queue_marks(store.snapshot(schemas.CONSUME_QUEUE))
    return sum(
        max(0, end - dispatched.max_offset(topic, queue_id))
        for topic, ends in written.queues.items()
        for queue_id, end in enumerate(ends)
    )


def _all_dispatched(store: Store) -> bool:
    return _backlog(store) == 0


def _producer(
    name: str,
    store: Store,
    topic: str,
    history_dir: Path,
    logs: Path,
    env: dict[str, str] | None = None,
    **options: object,
) -> Child:
    return worker(
        name,
        "producer",
        logs,
        env,
        store=store.root,
        topic=topic,
        history=history_dir / f"{name}.jsonl",
        prefix=name,
        **options,
    )


def _consumer(name: str, role: str, history_dir: Path, logs: Path, **options: Any) -> Child:
    return worker(name, role, logs, history=history_dir / f"{name}.jsonl", **options)


def _await_dispatch(store: Store, dispatcher: Child, timeout: float) -> float:
    """Wait until every committed message is in the consume queue; returns the seconds it took.

    Fails at once with the dispatcher's stderr if it dies, and with its counters if it is too slow.
    """
    began = time.monotonic()
    while not _all_dispatched(store):
        assert dispatcher.alive(), (
            f"{dispatcher.name} died ({dispatcher.popen.returncode}):\n{dispatcher.stderr()}"
        )
        if time.monotonic() - began > timeout:
            latest, done = store.version(schemas.COMMIT_LOG), dispatched_version(store)
            counters = dispatcher.stop() if dispatcher.name.startswith("dispatcher") else {}
            raise AssertionError(
                f"dispatch did not catch up in {timeout}s: commit_log version {latest}, dispatched "
                f"through {done}, consume_queue version {store.version(schemas.CONSUME_QUEUE)}; "
                f"{dispatcher.name}: {counters}\n{dispatcher.stderr()}"
            )
        time.sleep(0.05)
    return time.monotonic() - began


def _dispatched_past(store: Store, version: int) -> bool:
    return dispatched_version(store) > version


def _any_received(history_files: list[Path]) -> bool:
    return any(event_lines(path, "received") for path in history_files)


def _leftovers(store: Store) -> dict[str, int]:
    """What killed writers left in the commit log's directory: data files no commit references, and
    files in ``_delta_log`` that are not commits or checkpoints (staged commits). Local stores only."""
    if not store.is_local:
        return {}
    table = Path(store.uri(schemas.COMMIT_LOG))
    live = {Path(uri).name for uri in raw_table(store, schemas.COMMIT_LOG).file_uris()}
    data = {p.name for p in table.glob("*.parquet")}
    log_files = [p.name for p in (table / "_delta_log").iterdir() if p.is_file()]
    stray = [n for n in log_files if not n.split(".", 1)[0].isdigit() and n != "_last_checkpoint"]
    return {
        "orphan_data_files": len(data - live),
        "stray_log_files": len(stray),
    }


def _checked(store: Store, history_dir: Path, topic: str, **flags: Any) -> tuple[History, Figures]:
    """Every process's history, and what :func:`check` finds comparing it with the store."""
    history = History.load(history_dir)
    return history, check(store, history, topics=[topic], **flags)


def _dispatched_and_checked(store: Store, history_dir: Path, topic: str) -> tuple[History, Figures, int]:
    """After the producers: dispatch everything (recovery: restart -> all dispatched), then the check and
    the number of acknowledged sends whose SendResult does not say where their message is stored."""
    _, recovery = timed(dispatch_pending, store)
    history, figures = _checked(store, history_dir, topic, dispatched=True, recovery_s=recovery)
    return history, figures, misreported_offsets(store, history_dir, topic)


def _stored_not_acknowledged(history: History, stored: int) -> int:
    return stored - len(history.acknowledged)


# --------------------------------------------------------------------------- producers killed
# The sequencer's host lock (flock) makes local writers take turns; without it they race on the
# Delta log alone. Both must hold every invariant.
LOCKS = {"host lock": {}, "no host lock": {"MQ_SEQUENCER_LOCK": "0"}}


# Where the killed producers' store is: a local disk with and without the host lock, and the S3
# server (no host lock there: writers on other hosts take turns on the Delta log alone).
KILL_STORES = [
    pytest.param(("local", "host lock"), id="host lock"),
    pytest.param(("local", "no host lock"), id="no host lock"),
    pytest.param(("s3", "s3://, no host lock"), marks=pytest.mark.s3, id="s3"),
]


@dataclass
class KillStore:
    """The killed producers' store, what their environment adds to reach it, and its label."""

    store: Store
    env: dict[str, str]
    label: str
    storage: Storage


@pytest.fixture(params=KILL_STORES)
def kill_store(request: pytest.FixtureRequest, tmp_path: Path) -> KillStore:
    where, label = request.param
    if where == "local":
        return KillStore(Store.open(tmp_path / "mqdata"), dict(LOCKS[label]), label, "local")
    options = request.getfixturevalue("s3_options")
    store = Store.open(request.getfixturevalue("s3_root"), storage_options=options)
    return KillStore(store, {STORAGE_ENV_PREFIX + k: v for k, v in options.items()}, label, "s3")


def test_producers_killed_at_random_moments_lose_no_acknowledged_message(
    kill_store: KillStore, history_dir: Path, logs: Path, rng: random.Random
) -> None:
    store, env, lock = kill_store.store, kill_store.env, kill_store.label
    Admin(store).create_topic("KILLED", 4)
    rounds, kills = 3, 0
    for r in range(rounds):
        # Two sync and two batch senders racing each other, each killed at its own random moment
        # once it is sending.
        children = [
            _producer(f"sync{r}{i}", store, "KILLED", history_dir, logs, env, count=100_000, size=200)
            for i in range(2)
        ] + [
            _producer(
                f"batch{r}{i}",
                store,
                "KILLED",
                history_dir,
                logs,
                env,
                count=100_000,
                batch=25,
                size=200,
            )
            for i in range(2)
        ]
        kills += kill_once_sending(children, history_dir, rng, 60)
    # The store takes new writers at once after the kills, and stays dense.
    after = _producer("after", store, "KILLED", history_dir, logs, env, count=40).finish(timeout=300)
    assert after["acknowledged"] == 40

    history, figures, misreported = _dispatched_and_checked(store, history_dir, "KILLED")
    record(
        f"producers SIGKILLed while sending (4 at once: sync + batch; {lock})",
        figures,
        storage=kill_store.storage,
        rounds=rounds,
        kills=kills,
        stored_not_acked=_stored_not_acknowledged(history, figures.stored),
        misreported_offsets=misreported,
        **_leftovers(store),
        seed=SEED,
    )
    figures.assert_ok()
    assert misreported == 0, "a SendResult does not say where its message is stored"
    assert figures.acknowledged > 40


# --------------------------------------------------------------------------- eight producers
@pytest.mark.parametrize("lock", list(LOCKS))
def test_eight_producer_processes_at_once_store_every_acknowledged_message_once(
    store: Store, admin: Admin, history_dir: Path, logs: Path, lock: str
) -> None:
    admin.create_topic("EIGHT", 4)
    children = [
        _producer(f"p{i}", store, "EIGHT", history_dir, logs, LOCKS[lock], count=40, conflict_retries=2)
        for i in range(4)
    ] + [
        _producer(
            f"b{i}", store, "EIGHT", history_dir, logs, LOCKS[lock], count=200, batch=20, conflict_retries=2
        )
        for i in range(4)
    ]
    outputs = [child.finish(timeout=180) for child in children]

    history, figures, misreported = _dispatched_and_checked(store, history_dir, "EIGHT")
    record(
        f"eight producer processes at once ({lock})",
        figures,
        sequencer_conflicts=sum(o.get("sequencer_conflicts", 0) for o in outputs),
        conflict_errors=sum(o.get("conflict_errors", 0) for o in outputs),
        unknown=sum(o.get("unknown", 0) for o in outputs),
        misreported_offsets=misreported,
    )
    figures.assert_ok()
    assert misreported == 0, "a SendResult does not say where its message is stored"
    # Every send ended one way or the other; whatever was not acknowledged was given up.
    assert len(history.sent) == 4 * 40 + 4 * 200
    assert history.sent == history.acknowledged | history.gave_up


# --------------------------------------------------------------------------- dispatch killed
def test_dispatcher_killed_mid_batch_and_restarted_leaves_no_gap_and_no_duplicate(
    store: Store, admin: Admin, history_dir: Path, logs: Path, rng: random.Random
) -> None:
    admin.create_topic("DISPATCHED", 4)
    producer = _producer("writer", store, "DISPATCHED", history_dir, logs, count=10**6, batch=5, pause_ms=5)
    at_kills: list[int] = []
    for r in range(4):
        before = dispatched_version(store)
        # Two dispatchers at once (dispatch must also be safe against a concurrent dispatcher).
        dispatchers = [
            worker(f"dispatcher{r}{i}", "dispatcher", logs, store=store.root, interval_ms=1) for i in range(2)
        ]
        # Once they are dispatching (a first commit), kill each at a random moment of its loop.
        wait_until(functools.partial(_dispatched_past, store, before), 60, "the dispatchers to dispatch")
        for dispatcher in dispatchers:
            time.sleep(rng.uniform(0.0, 0.3))
            dispatcher.kill()
            at_kills.append(dispatched_version(store))
    time.sleep(1.0)  # the producer goes on: a backlog for the restarted dispatcher
    producer.stop()
    backlog = _backlog(store)

    # Restart after the last kill; recovery ends when every committed version is dispatched.
    last = worker("dispatcher-final", "dispatcher", logs, store=store.root, interval_ms=1)
    recovery = _await_dispatch(store, last, 120)
    last.stop()
    _, figures = _checked(store, history_dir, "DISPATCHED", dispatched=True, recovery_s=recovery)
    record(
        "dispatchers (dispatch_pending, two at once) SIGKILLed repeatedly while a producer writes",
        figures,
        kills=len(at_kills),
        dispatched_version_at_kills=at_kills,
        backlog_messages_at_restart=backlog,
        seed=SEED,
    )
    figures.assert_ok()
    assert backlog > 0


@pytest.mark.spark
@pytest.mark.slow
def test_spark_dispatch_job_killed_mid_batch_resumes_from_its_checkpoint(
    store: Store, admin: Admin, history_dir: Path, logs: Path, rng: random.Random
) -> None:
    admin.create_topic("SPARKJOB", 4)
    producer = _producer("writer", store, "SPARKJOB", history_dir, logs, count=10**6, batch=10, pause_ms=50)
    job = spawn("dispatch-job", ["jobs/dispatch.py", "--store", store.root], logs)
    wait_until(lambda: dispatched_version(store) > 3, 180, "the dispatch job to make progress", poll=0.2)
    # Kill it inside a micro-batch: planned in the checkpoint's offsets/, not yet in commits/.
    checkpoint = Path(checkpoint_location(store, "dispatch"))
    wait_until(lambda: _batches_in_flight(checkpoint) > 0, 60, "a micro-batch in flight", poll=0.005)
    time.sleep(rng.uniform(0.0, 0.05))
    job.kill()  # the Python driver and its JVM, mid-batch: the producer is still writing
    killed_at, in_flight = dispatched_version(store), _batches_in_flight(checkpoint)
    time.sleep(0.5)  # the producer goes on: what it acknowledges from here on waits for the restart
    producer.stop()
    backlog = _backlog(store)

    restarted = spawn("dispatch-job-restarted", ["jobs/dispatch.py", "--store", store.root], logs)
    began = time.monotonic()
    wait_until(lambda: _backlog(store) < backlog, 180, "the restarted job's first micro-batch", poll=0.1)
    first_batch = time.monotonic() - began
    recovery = first_batch + _await_dispatch(store, restarted, 180)
    restarted.terminate(timeout=60)
    _, figures = _checked(store, history_dir, "SPARKJOB", dispatched=True, recovery_s=recovery)
    record(
        "Spark dispatch job (jobs/dispatch.py) SIGKILLed mid-batch, restarted on its checkpoint",
        figures,
        dispatched_version_at_kill=killed_at,
        backlog_messages_at_restart=backlog,
        batches_in_flight_at_kill=in_flight,
        restart_to_first_batch_s=round(first_batch, 2),
        note="recovery includes the restarted job's Spark start-up",
        seed=SEED,
    )
    figures.assert_ok()
    assert backlog > 0
    assert restarted.popen.returncode == 0, restarted.stderr()


def _batches_in_flight(checkpoint: Path) -> int:
    """Micro-batches a job's streaming checkpoint planned (``offsets/``) but never committed
    (``commits/``): in the checkpoint itself (the ``deltalog`` trigger) or in its ``delta/from-*``
    sub-directory (Delta's streaming source, where Delta on Spark is on)."""

    def in_flight(directory: Path) -> int:
        def last(sub: str) -> int:
            ids = [int(p.name) for p in (directory / sub).glob("*") if p.name.isdigit()]
            return max(ids, default=-1)

        return max(0, last("offsets") - last("commits"))

    return max(in_flight(d) for d in [checkpoint, *(checkpoint / DELTA_SOURCE).glob("from-*")])


# --------------------------------------------------------------------------- consumers killed
def _produce_in_process(store: Store, topic: str, history_dir: Path, n: int) -> None:
    with HistoryLog(history_dir / "producer.jsonl") as log, Producer(store) as producer:
        for start in range(0, n, 10):
            ids = [f"m{i}" for i in range(start, min(n, start + 10))]
            log.sent(ids)
            producer.send_batch([Message(topic, make_body(mid, 100)) for mid in ids])
            log.acknowledged(ids)
    dispatch_pending(store)


def _received_events(path: Path) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if e["e"] == "received"]


def _last_batch(path: Path) -> list[str]:
    """Ids of the last ``received`` event of a consumer's history file."""
    return [str(i) for i in _received_events(path)[-1]["ids"]]


def _recovery(restart_wall: float, path: Path, ids: list[str]) -> float:
    """Restart -> the moment the restarted consumer had received every one of ``ids``."""
    wanted, last = set(ids), restart_wall
    for event in _received_events(path):
        got = wanted.intersection(event["ids"])
        if got:
            wanted -= got
            last = float(event["t"])
    assert not wanted, f"never received again: {sorted(wanted)[:10]}"
    return last - restart_wall


def _killed_after_receive_then_replaced(
    store: Store,
    history_dir: Path,
    logs: Path,
    role: str,
    topic: str,
    *,
    messages: int,
    die_after: int,
    idle_s: float,
    successor: str = "b",
    **options: Any,
) -> tuple[dict[str, Any], list[str], History, Figures]:
    """``messages`` produced to ``topic``; consumer ``a`` (16 messages a receive) is SIGKILLed after its
    ``die_after``-th receive, before it commits or acks; then consumer ``b`` consumes until idle
    for ``idle_s``. Returns b's output, the batch a never finished, the history and its check
    (recovery: b's start -> it has that batch)."""
    _produce_in_process(store, topic, history_dir, messages)
    options.update(store=store.root, topic=topic, max_nums=16)
    kind = role.split("-")[0]
    first = _consumer(
        f"{kind}-a", role, history_dir, logs, consumer_id="a", die_after_batches=die_after, **options
    )
    assert first.wait_killed() == -9
    restart = time.time()
    second = _consumer(f"{kind}-b", role, history_dir, logs, consumer_id=successor, idle_s=idle_s, **options)
    out = second.finish()
    lost_batch = _last_batch(history_dir / f"{kind}-a.jsonl")
    recovery = _recovery(restart, history_dir / f"{kind}-b.jsonl", lost_batch)
    history, figures = _checked(
        store, history_dir, topic, consumed=True, dispatched=True, recovery_s=recovery
    )
    return out, lost_batch, history, figures


def test_pull_consumer_killed_after_receive_before_commit_gets_its_batch_redelivered(
    store: Store, admin: Admin, history_dir: Path, logs: Path
) -> None:
    admin.create_topic("PULLED", 4)
    out, lost_batch, history, figures = _killed_after_receive_then_replaced(
        store, history_dir, logs, "pull-consumer", "PULLED", group="g", messages=300, die_after=5, idle_s=1.0
    )
    record(
        "pull consumer SIGKILLed after receive, before committing its offset",
        figures,
        killed_batch=len(lost_batch),
        note="recovery = restart of a consumer -> it has the killed consumer's batch",
    )
    figures.assert_ok()
    # At least once: the batch the killed consumer received but never committed comes again.
    assert all(history.received[mid] == 2 for mid in lost_batch)
    assert figures.redelivered == len(lost_batch)
    assert out["errors"] == []
    # And the group's progress ends at the end of every queue: nothing will come a third time.
    _assert_group_done(store, "PULLED", "g", "pull-consumer")


def test_simple_consumer_killed_after_receive_before_ack_gets_its_messages_after_the_invisible_time(
    store: Store, admin: Admin, history_dir: Path, logs: Path
) -> None:
    admin.create_topic("SIMPLE", 2)
    out, lost_batch, history, figures = _killed_after_receive_then_replaced(
        store,
        history_dir,
        logs,
        "simple-consumer",
        "SIMPLE",
        group="sg",
        messages=120,
        die_after=3,
        idle_s=4.0,
        invisible_ms=2000,
    )
    record(
        "SimpleConsumer SIGKILLed after receive, before ack (invisible time 2 s)",
        figures,
        killed_batch=len(lost_batch),
        redelivered_with_reconsume_times=out["reconsumed"],
        note="recovery = restart of a consumer -> it has the killed consumer's batch (bounded below by "
        "the invisible time)",
    )
    figures.assert_ok()
    assert all(history.received[mid] >= 2 for mid in lost_batch)
    assert out["reconsumed"] >= len(lost_batch)
    # Acks are durable: once the last claim's invisible time is over, nothing is visible again.
    _assert_group_done(store, "SIMPLE", "sg", "simple-consumer")


def test_simple_consumer_killed_holding_leases_and_restarted_with_its_id_gets_them_back_at_once(
    store: Store, admin: Admin, history_dir: Path, logs: Path
) -> None:
    admin.create_topic("RETURNING", 2)
    out, lost_batch, history, figures = _killed_after_receive_then_replaced(
        store,
        history_dir,
        logs,
        "simple-consumer",
        "RETURNING",
        group="rg",
        messages=120,
        die_after=3,
        idle_s=4.0,
        successor="a",
        invisible_ms=60_000,
    )
    record(
        "SimpleConsumer SIGKILLed holding leases, restarted with the same id (invisible time 60 s)",
        figures,
        killed_batch=len(lost_batch),
        redelivered_with_reconsume_times=out["reconsumed"],
        note="recovery = restart with the same consumer id -> it has its unacked messages back (QMQ: "
        "no wait for the invisible time, same delivery)",
    )
    figures.assert_ok()
    assert all(history.received[mid] == 2 for mid in lost_batch)
    # Handed back as the same delivery (not redelivered after expiry): reconsume_times stays 0.
    assert out["reconsumed"] == 0


def test_acks_racing_lease_expiry_ack_each_message_once_and_lose_none(
    store: Store, admin: Admin, history_dir: Path, logs: Path
) -> None:
    admin.create_topic("RACING", 2)
    _produce_in_process(store, "RACING", history_dir, 200)
    # Work takes 0..1.2 s against an invisible time of 0.6 s: about half the acks race the deadline.
    options: dict[str, Any] = {
        "store": store.root,
        "topic": "RACING",
        "group": "race",
        "invisible_ms": 600,
        "max_nums": 4,
        "work_ms": 0,
        "work_ms_max": 1200,
        "idle_s": 4.0,
    }
    children = [_consumer(n, "simple-consumer", history_dir, logs, consumer_id=n, **options) for n in "xy"]
    outs = [child.finish() for child in children]
    _, figures = _checked(store, history_dir, "RACING", consumed=True, dispatched=True)
    ackers: dict[tuple[int, int], set[str]] = {}
    for row in read_actions(store, "race", ACK):
        end = row["end_offset"] if row["end_offset"] is not None else row["queue_offset"] + 1
        for offset in range(row["queue_offset"], end):
            ackers.setdefault((row["queue_id"], offset), set()).add(row["consumer_id"])
    acked_twice = sum(1 for who in ackers.values() if len(who) > 1)
    refused = sum(o["refused"] for o in outs)
    record(
        "acks racing lease expiry: 2 SimpleConsumers, work 0-1.2 s, invisible time 0.6 s",
        figures,
        acks_refused=refused,
        acked_by_two_consumers=acked_twice,
        note="a late ack is refused (ReceiptHandleExpiredError); the message comes again",
    )
    figures.assert_ok()
    assert refused > 0  # the race happened
    assert acked_twice == 0
    assert sum(len(who) for who in ackers.values()) == len(ackers) == 200
    _assert_group_done(store, "RACING", "race", "simple-consumer")


@pytest.mark.parametrize("role", ["pull-consumer", "simple-consumer"])
def test_consumers_killed_at_random_moments_miss_no_message(
    store: Store, admin: Admin, history_dir: Path, logs: Path, rng: random.Random, role: str
) -> None:
    topic = "RANDOMPULL" if role == "pull-consumer" else "RANDOMSIMPLE"
    admin.create_topic(topic, 2)
    _produce_in_process(store, topic, history_dir, 1000)
    # Slow consumers (4 messages per receive, 50 ms of work before the ack): the kills find them busy.
    options: dict[str, object] = {"store": store.root, "topic": topic, "group": "rg"}
    slow = {"max_nums": 4, "work_ms": 50}
    if role == "simple-consumer":
        options["invisible_ms"] = 1500
    kills = 0
    # SimpleConsumers share queues message by message: two of them run at once in each round.
    per_round = 2 if role == "simple-consumer" else 1
    for r in range(4):
        names = [f"c{r}{chr(97 + i)}" for i in range(per_round)]
        children = [
            _consumer(n, role, history_dir, logs, consumer_id=n, idle_s=30, **options, **slow) for n in names
        ]
        logs_of_round = [history_dir / f"{n}.jsonl" for n in names]
        wait_until(functools.partial(_any_received, logs_of_round), 60, f"round {r} to receive")
        for child in children:
            time.sleep(rng.uniform(0.0, 0.5))
            assert child.alive(), f"{child.name} ended before it was killed:\n{child.stderr()}"
            child.kill()
            kills += 1
    restart = time.time()
    last = _consumer(
        "final", role, history_dir, logs, consumer_id="final", idle_s=3.0, max_nums=32, **options
    )
    out = last.finish()
    history = History.load(history_dir)
    final_events = _received_events(history_dir / "final.jsonl")
    assert final_events, "the killed consumers had consumed everything: nothing was left to recover"
    finished = max(float(e["t"]) for e in final_events)
    figures = check(
        store, history, topics=[topic], consumed=True, dispatched=True, recovery_s=finished - restart
    )
    overlapping = _overlapping_claims(history_dir) if role == "simple-consumer" else None
    record(
        f"{'pull consumers' if role == 'pull-consumer' else 'SimpleConsumers (2 at once)'} "
        "SIGKILLed at random moments",
        figures,
        kills=kills,
        final_consumer_batches=out["batches"],
        overlapping_claims=overlapping,
        note="recovery = restart -> the last message received",
        seed=SEED,
    )
    figures.assert_ok()
    assert kills >= 3 * per_round
    assert not overlapping, "a message was delivered again while an earlier claim was still invisible"
    _assert_group_done(store, topic, "rg", role)


def _assert_group_done(store: Store, topic: str, group: str, role: str) -> None:
    """After the last consumer's acks: nothing is left for the group, now or after the invisible time."""
    queues = store.topic(topic).queues
    if role == "pull-consumer":
        pull = PullConsumer(store, group)
        committed = [pull.committed_offset(topic, q) for q in range(queues)]
        assert committed == [pull.max_offset(topic, q) for q in range(queues)]
        return
    time.sleep(2.0)  # past every claim's invisible time
    late = SimpleConsumer(store, group, consumer_id="late")
    late.subscribe(topic)
    try:
        assert late.receive(max_nums=32) == []
    finally:
        late.close()


def _overlapping_claims(history_dir: Path) -> int:
    """Deliveries of a message that began before the previous delivery's invisible time ended.

    A delivery is logged after its claim committed, and a claim is valid only at or after the
    previous claim's deadline, so a logged time before that deadline is a double claim.
    """
    deliveries: dict[str, list[tuple[float, int]]] = {}
    for path in history_dir.glob("*.jsonl"):
        for event in _received_events(path):
            for mid, until in zip(event["ids"], event.get("until") or [], strict=False):
                deliveries.setdefault(mid, []).append((float(event["t"]) * 1000, int(until)))
    overlapping = 0
    for seen in deliveries.values():
        seen.sort()
        overlapping += sum(1 for (_, until), (at, _) in itertools.pairwise(seen) if at < until)
    return overlapping


# --------------------------------------------------------------------------- compaction
DOCUMENTED_PULL_STATUSES = {s.value for s in PullStatus}


def _wind_down(
    store: Store, history_dir: Path, topic: str, dispatcher: Child, consumer: Child, maintainer: Child
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], Figures]:
    """Once the writers are done: dispatch catches up, the consumer drains what is left and ends, the
    maintainer stops. Returns the three workers' counters and the check of ``topic``."""
    _await_dispatch(store, dispatcher, 120)
    dispatched = dispatcher.stop()
    pulled = consumer.stop(timeout=180)  # drains what is left, then ends
    maintained = maintainer.stop()
    _, figures = _checked(store, history_dir, topic, consumed=True, dispatched=True)
    return dispatched, pulled, maintained, figures


def test_compaction_in_a_loop_during_appends_and_pulls_changes_nothing_consumers_see(
    store: Store, admin: Admin, history_dir: Path, logs: Path
) -> None:
    admin.create_topic("COMPACTED", 2)
    producers = [
        _producer(f"w{i}", store, "COMPACTED", history_dir, logs, count=600, batch=4, pause_ms=5)
        for i in range(2)
    ]
    dispatcher = worker("dispatcher", "dispatcher", logs, store=store.root, interval_ms=20)
    maintainer = worker("maintainer", "maintainer", logs, store=store.root, interval_ms=50)
    consumer = worker(
        "consumer",
        "pull-consumer",
        logs,
        store=store.root,
        topic="COMPACTED",
        group="cg",
        history=history_dir / "consumer.jsonl",
        consumer_id="c",
        max_nums=32,
        idle_s=1.0,
        until_stopped=True,
    )
    for p in producers:
        p.finish(timeout=180)
    dispatched, pulled, maintained, figures = _wind_down(
        store, history_dir, "COMPACTED", dispatcher, consumer, maintainer
    )
    record(
        "compaction in a loop during appends, dispatch and pulls",
        figures,
        compactions=maintained.get("compactions"),
        files_removed=maintained.get("files_removed"),
        maintenance_errors=maintained.get("errors"),
        dispatch_passes=dispatched.get("passes"),
        dispatch_conflict_errors=dispatched.get("conflicts"),
        pull_statuses=pulled["statuses"],
        pull_errors=len(pulled["errors"]),
    )
    figures.assert_ok()
    assert pulled["errors"] == []
    assert set(pulled["statuses"]) <= DOCUMENTED_PULL_STATUSES
    assert maintained["compactions"] > 0, "compaction never ran: the scenario tested nothing"
    assert figures.redelivered == 0


def _maintenance_commits(store: Store) -> int:
    """Commits made by maintenance (compaction rewrites) on the commit log and the consume queue."""
    return sum(
        1
        for name in (schemas.COMMIT_LOG, schemas.CONSUME_QUEUE)
        for info in through_gaps(lambda name=name: raw_table(store, name).history())
        if MAINTENANCE_KEY in info
    )


def _compacted_past(store: Store, commits: int) -> bool:
    return _maintenance_commits(store) > commits


def test_maintenance_killed_mid_compaction_and_restarted_loses_and_duplicates_nothing(
    store: Store, admin: Admin, history_dir: Path, logs: Path, rng: random.Random
) -> None:
    admin.create_topic("MAINTAINED", 2)
    producer = _producer("w", store, "MAINTAINED", history_dir, logs, count=10**6, batch=4, pause_ms=5)
    dispatcher = worker("dispatcher", "dispatcher", logs, store=store.root, interval_ms=20)
    consumer = _consumer(
        "consumer",
        "pull-consumer",
        history_dir,
        logs,
        store=store.root,
        topic="MAINTAINED",
        group="mg",
        consumer_id="c",
        max_nums=32,
        idle_s=1.0,
        until_stopped=True,
    )
    kills = 0
    for k in range(5):
        before = _maintenance_commits(store)
        maintainer = worker(f"maintainer{k}", "maintainer", logs, store=store.root, interval_ms=1)
        wait_until(functools.partial(_compacted_past, store, before), 60, "a compaction", poll=0.1)
        time.sleep(rng.uniform(0.0, 0.4))  # into the next passes: planning, rewriting or committing
        maintainer.kill()
        kills += 1
    producer.stop()
    last = worker("maintainer-final", "maintainer", logs, store=store.root, interval_ms=20)
    dispatched, pulled, maintained, figures = _wind_down(
        store, history_dir, "MAINTAINED", dispatcher, consumer, last
    )
    record(
        "maintenance (compaction) SIGKILLed mid-pass during appends and pulls, restarted",
        figures,
        kills=kills,
        maintenance_commits=_maintenance_commits(store),
        dispatch_conflict_errors=dispatched.get("conflicts"),
        final_pass_errors=maintained.get("errors"),
        pull_statuses=pulled["statuses"],
        pull_errors=len(pulled["errors"]),
        seed=SEED,
    )
    figures.assert_ok()
    assert pulled["errors"] == []
    assert maintained["errors"] == {}
