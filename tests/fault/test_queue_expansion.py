"""Queue expansion (扩容) while producers and push consumers run: ``Admin.update_topic`` grows a topic
from 2 to 4 queues in the middle of the traffic. Producer processes pick the new queues up at
their next route refresh, the dispatcher gives them offsets from 0, push consumers take them at
their next rebalance; the checker then proves nothing acknowledged is lost or stored twice, every
queue's offsets are dense from 0, and every acknowledged message was received."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from engine import Admin, ConsumeFrom, ConsumeResult, MessageExt, PushConsumer, Store
from engine.store import schemas
from engine.store.consume_queue import dispatched_version
from tests.fault.history import History, HistoryLog, body_id, check, record
from tests.fault.procs import event_lines, wait_until, worker

pytestmark = pytest.mark.fault

TOPIC = "Grow"
GROUP = "growers"
BEFORE, AFTER = 2, 4
PER_PRODUCER = 240


def _push_consumer(
    store: Store, log: HistoryLog, queues_seen: set[int], lock: threading.Lock
) -> PushConsumer:
    def listener(messages: Sequence[MessageExt]) -> ConsumeResult:
        with lock:
            queues_seen.update(m.queue_id for m in messages)
        log.received([body_id(m.body) for m in messages])
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        Store.open(store.root),
        GROUP,
        consume_from=ConsumeFrom.FIRST,
        rebalance_interval_ms=200,
        commit_interval_ms=200,
        pull_suspend_ms=200,
    )
    consumer.subscribe(TOPIC)
    consumer.register_listener(listener)
    consumer.start()
    return consumer


def test_growing_a_topic_under_traffic_loses_and_duplicates_nothing(
    tmp_path: Path, history_dir: Path
) -> None:
    logs = tmp_path / "logs"
    store = Store.open(str(tmp_path / "mq"))
    admin = Admin(store)
    admin.create_topic(TOPIC, BEFORE)
    dispatcher = worker("dispatcher", "dispatcher", logs, store=store.root, interval_ms=20)
    seen: set[int] = set()
    lock = threading.Lock()
    with HistoryLog(history_dir / "consumers.jsonl", process="push") as log:
        consumers = [_push_consumer(store, log, seen, lock) for _ in range(2)]
        try:
            producers = [
                worker(
                    f"producer-{i}",
                    "producer",
                    logs,
                    store=store.root,
                    topic=TOPIC,
                    history=history_dir / f"producer-{i}.jsonl",
                    prefix=f"p{i}",
                    count=PER_PRODUCER,
                    pause_ms=10,
                )
                for i in range(2)
            ]
            files = [history_dir / f"producer-{i}.jsonl" for i in range(2)]
            wait_until(lambda: sum(event_lines(f) for f in files) >= PER_PRODUCER // 2, 120, "first sends")
            grown = admin.update_topic(TOPIC, queues=AFTER)
            assert grown.queues == AFTER
            for producer in producers:
                producer.finish(timeout=240)
            committed = store.version(schemas.COMMIT_LOG)
            wait_until(lambda: dispatched_version(store) >= committed, 120, "dispatch of every send")
            acknowledged = History.load(files).acknowledged
            began = time.monotonic()
            wait_until(lambda: acknowledged <= set(log.history.received), 120, "every message received")
            drained_s = time.monotonic() - began
        finally:
            for consumer in consumers:
                consumer.shutdown()
            dispatcher.stop()
        history = History.load(history_dir)
    figures = check(store, history, topics=[TOPIC], dispatched=True, consumed=True)
    per_queue = {s.queue_id: s.max_offset for s in admin.topic_stats(TOPIC)}
    record(
        "queue expansion 2 -> 4 under 2 producers and 2 push consumers",
        figures,
        queues_after=AFTER,
        messages_in_new_queues=per_queue[2] + per_queue[3],
        drain_after_last_send_s=round(drained_s, 2),
    )
    figures.assert_ok()
    assert per_queue[2] > 0 and per_queue[3] > 0, per_queue  # producers used the new queues
    assert {2, 3} <= seen, seen  # and push consumers consumed them after a rebalance
