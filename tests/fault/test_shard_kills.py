"""Commit-log shards under concurrency and crashes: producer processes writing to every shard of a
store at once, and SIGKILLed at random moments, with and without the sequencer's host lock.

As the single-log scenarios of ``test_process_kills.py``: every child fsyncs its outcomes to its own
history file, then :func:`tests.fault.history.check` compares the histories with every shard of the
store (dense queue offsets, physical offsets unique and dense from each shard's base, nothing lost or
stored twice, everything dispatched once) and the figures go to FAULTS.md.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from engine import Admin, Store
from engine.broker.dispatch import dispatch_pending
from engine.config import load_config
from engine.protocol.shards import shard_of_offset, shard_of_queue
from engine.store import schemas
from tests.fault.history import Figures, History, check, misreported_offsets, record
from tests.fault.procs import Child, kill_once_sending, worker
from tests.fault.scenario import timed

pytestmark = pytest.mark.fault

SEED = int(os.environ.get("MQ_FAULT_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
SHARDS = 3
QUEUES = 6
LOCKS = {"host lock": {}, "no host lock": {"MQ_SEQUENCER_LOCK": "0"}}


@pytest.fixture
def sharded(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "mqdata", config=load_config(commit_log_shards=SHARDS))
    return store


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    return tmp_path / "logs"


def _topic(store: Store, name: str) -> str:
    Admin(store).create_topic(name, QUEUES)
    assert sorted({shard_of_queue(name, q, SHARDS) for q in range(QUEUES)}) == list(range(SHARDS))
    return name


def _producer(
    name: str, store: Store, topic: str, history_dir: Path, logs: Path, lock: str, **options: object
) -> Child:
    # Children open the store with the default config: the store's shard count is read from it.
    return worker(
        name,
        "producer",
        logs,
        LOCKS[lock],
        store=store.root,
        topic=topic,
        history=history_dir / f"{name}.jsonl",
        prefix=name,
        **options,
    )


def _rows_per_shard(store: Store, topic: str) -> list[int]:
    counts = []
    for shard, name in enumerate(store.commit_logs):
        offsets = store.read(name, columns=["physical_offset", "topic"]).to_pylist()
        assert all(shard_of_offset(r["physical_offset"]) == shard for r in offsets)
        counts.append(sum(1 for r in offsets if r["topic"] == topic))
    return counts


def _checked(store: Store, history_dir: Path, topic: str) -> tuple[History, Figures, int, float]:
    _, recovery = timed(dispatch_pending, store)
    history = History.load(history_dir)
    figures = check(store, history, topics=[topic], dispatched=True, recovery_s=recovery)
    return history, figures, misreported_offsets(store, history_dir, topic), recovery


@pytest.mark.parametrize("lock", list(LOCKS))
def test_producer_processes_on_every_shard_at_once_store_every_acknowledged_message_once(
    sharded: Store, history_dir: Path, logs: Path, lock: str
) -> None:
    topic = _topic(sharded, "SPREAD")
    # A producer keeps to one shard for a stint of 16 rounds of its queues (32 sends here), starting
    # on a random one (engine.protocol.queue_choice): with 36 sends each, three producers that all
    # started on shard 0 never reached shard 2 (about 1 run in 100; CI met it). 72 sends take each
    # single-send producer over all three shards.
    children = [
        _producer(f"p{i}", sharded, topic, history_dir, logs, lock, count=72, conflict_retries=2)
        for i in range(3)
    ] + [
        _producer(f"b{i}", sharded, topic, history_dir, logs, lock, count=120, batch=10, conflict_retries=2)
        for i in range(3)
    ]
    outputs = [child.finish(timeout=240) for child in children]
    history, figures, misreported, _ = _checked(sharded, history_dir, topic)
    per_shard = _rows_per_shard(sharded, topic)
    record(
        f"six producer processes on a {SHARDS}-shard store ({lock})",
        figures,
        rows_per_shard=per_shard,
        sequencer_conflicts=sum(o.get("sequencer_conflicts", 0) for o in outputs),
        conflict_errors=sum(o.get("conflict_errors", 0) for o in outputs),
        misreported_offsets=misreported,
    )
    figures.assert_ok()
    assert misreported == 0
    assert all(n > 0 for n in per_shard), per_shard
    assert len(history.sent) == 3 * 72 + 3 * 120
    assert history.sent == history.acknowledged | history.gave_up


@pytest.mark.parametrize("lock", list(LOCKS))
def test_producers_on_several_shards_killed_at_random_moments_lose_and_duplicate_nothing(
    sharded: Store, history_dir: Path, logs: Path, lock: str
) -> None:
    print(f"random moments from MQ_FAULT_SEED={SEED}")
    rng = random.Random(SEED)
    topic = _topic(sharded, "SHARDKILL")
    rounds, kills = 2, 0
    for r in range(rounds):
        children = [
            _producer(f"sync{r}{i}", sharded, topic, history_dir, logs, lock, count=100_000, size=200)
            for i in range(2)
        ] + [
            _producer(
                f"batch{r}{i}", sharded, topic, history_dir, logs, lock, count=100_000, batch=12, size=200
            )
            for i in range(2)
        ]
        kills += kill_once_sending(children, history_dir, rng, 90)
    after = _producer("after", sharded, topic, history_dir, logs, lock, count=30).finish(timeout=120)
    assert after["acknowledged"] == 30  # every shard takes new writers at once

    history, figures, misreported, _ = _checked(sharded, history_dir, topic)
    per_shard = _rows_per_shard(sharded, topic)
    record(
        f"producers SIGKILLed while sending to a {SHARDS}-shard store (4 at once: sync + batch; {lock})",
        figures,
        rounds=rounds,
        kills=kills,
        rows_per_shard=per_shard,
        stored_not_acked=figures.stored - len(history.acknowledged),
        misreported_offsets=misreported,
        seed=SEED,
    )
    figures.assert_ok()
    assert misreported == 0
    assert all(n > 0 for n in per_shard), per_shard
    entries = sharded.read(schemas.CONSUME_QUEUE, columns=["topic", "physical_offset"]).to_pylist()
    assert sum(1 for e in entries if e["topic"] == topic) == sum(per_shard)
