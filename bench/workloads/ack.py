"""Per-message ack: SimpleConsumer receive + ack against Redis XREADGROUP + XACK.

* ``ack_4proc``: 4 consumer processes of one group share a topic of 1 KiB messages, receiving
  batches of 32 and acking each message, until every message is acked (acks flushed); maintenance
  (compaction, checkpoints) runs in the parent meanwhile, as in production. The rate of the first
  and the second half of the run shows whether throughput holds while the action log grows.
  Every message stored must be acked once by the group: the workload reports how many were
  delivered, how many twice, and how many never (then the run is reported failed, with its rate).
  Redis: 4 processes, ``XREADGROUP COUNT 32`` + ``XACK`` of the ids, on a stream of the same bodies.
* ``ack_single``: one consumer, ``receive(max_nums=1)`` + ``ack`` per message.

Bare delta-rs has no consumer-group semantics to compare with, so it has no column here.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from typing import Any

from bench.stats import Measure, rate, unavailable
from bench.workloads import OURS, REDIS, Context
from bench.workloads.produce import open_store
from engine import Admin, Message, Producer, SimpleConsumer
from engine.broker.dispatch import dispatch_pending

TOPIC = "AckBench"
QUEUES = 8
PROCESSES = 4
BATCH = 32
STREAM = "ackbench"
IDLE_S = 3.0  # a worker stops after this long without a message
MAINTENANCE_EVERY_S = 5.0


def _fill(ctx: Context, count: int) -> str:
    path = ctx.workdir / "ack"
    store = open_store(path)
    Admin(store).create_topic(TOPIC, QUEUES)
    body = ctx.sizes.body_bytes
    with Producer(store, "AckBenchProducer") as producer:
        for start in range(0, count, 4096):
            producer.send_batch([Message(TOPIC, os.urandom(body)) for _ in range(min(4096, count - start))])
    dispatch_pending(store)
    return str(path)


def _lakemq_worker(root: str, group: str, worker: int, ready: Any, start: Any, out: Any) -> None:
    store = open_store(root)
    consumer = SimpleConsumer(store, group, f"w{worker}")
    consumer.subscribe(TOPIC)
    times: list[float] = []
    acked: list[tuple[int, int]] = []  # (queue_id, queue_offset) of every message acked
    flushed = 0.0  # when the last acks were durable
    error = ""
    ready.put(worker)
    start.wait()
    idle_until = time.monotonic() + IDLE_S
    try:
        while time.monotonic() < idle_until:
            got = consumer.receive(max_nums=BATCH, invisible_ms=60_000)
            if got:
                idle_until = time.monotonic() + IDLE_S
            elif times and flushed < times[-1]:
                consumer.flush()
                flushed = time.time()
            for message in got:
                consumer.ack(message)
                times.append(time.time())
                acked.append((message.queue_id, message.queue_offset))
        consumer.close()
    except BaseException as exc:  # reported with what was consumed before it
        error = repr(exc)
    out.put((worker, times, flushed or time.time(), consumer.conflicts, error, acked))


def _maintenance_loop(root: str, stop: threading.Event) -> int:
    from engine.broker.maintenance import maintain

    store = open_store(root)
    passes = 0
    while not stop.wait(MAINTENANCE_EVERY_S):
        maintain(store, min_files=8)
        passes += 1
    return passes


def _stored(root: str) -> set[tuple[int, int]]:
    """(queue_id, queue_offset) of every message of the topic, as dispatched."""
    from engine.store.consume_queue import QueueIndex

    index = QueueIndex(open_store(root))
    index.refresh()
    out: set[tuple[int, int]] = set()
    for queue_id in range(QUEUES):
        low, high = index.bounds(TOPIC, queue_id)
        out.update((queue_id, offset) for offset in range(low, high))
    return out


def delivery(stored: set[tuple[int, int]], acked: list[tuple[int, int]]) -> dict[str, int]:
    """How the acked messages cover the stored ones: distinct messages delivered, messages acked
    more than once, and stored messages never acked."""
    distinct = set(acked)
    return {
        "delivered": len(distinct & stored),
        "duplicates": len(acked) - len(distinct),
        "undelivered": len(stored - distinct),
    }


def _lakemq_processes(root: str, total: int) -> tuple[Measure, Measure, Measure, dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_lakemq_worker, args=(root, "AckGroup", i, ready, start, out))
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    _wait_ready(ready)
    stop = threading.Event()
    passes: list[int] = []
    maint = threading.Thread(target=lambda: passes.append(_maintenance_loop(root, stop)), daemon=True)
    maint.start()
    began = time.time()
    start.set()
    results = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(60)
    stop.set()
    maint.join(120)
    errors = [r[4] for r in results if r[4]]
    stamps = sorted(t for r in results for t in r[1])
    finished = max(r[2] for r in results)
    consumed = len(stamps)
    half = stamps[consumed // 2] if stamps else began
    covered = delivery(_stored(root), [key for r in results for key in r[5]])
    if covered["undelivered"] or covered["duplicates"]:
        errors.append(
            f"{covered['undelivered']:,} of {total:,} messages never delivered, "
            f"{covered['duplicates']:,} acked twice"
        )
    info = {
        "consumed": consumed,
        "expected": total,
        **covered,
        "conflicts": sum(r[3] for r in results),
        "maintenance_passes": passes[0] if passes else 0,
        "errors": errors,
    }
    whole = {**rate(consumed, finished - began), **covered}
    if covered["undelivered"]:  # §7: every message delivered
        whole["missing"] = covered["undelivered"]
    first = rate(consumed // 2, half - began)
    second = rate(consumed - consumed // 2, stamps[-1] - half if stamps else 1.0)
    return whole, first, second, info


def _wait_ready(ready: Any) -> None:
    """Every worker process imported, connected and opened what it reads: the clock may start (a
    fixed pause was too short on a loaded machine, and a worker that came late counted its own
    start-up, or its idle second, as the peer's work time)."""
    for _ in range(PROCESSES):
        ready.get(timeout=600)
    time.sleep(0.5)


def _redis_worker(url: str, worker: int, ready: Any, start: Any, out: Any) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.ping()
    count = 0
    last = 0.0  # when this worker's last ack was answered
    ready.put(worker)
    start.wait()
    idle_until = time.monotonic() + 1.0
    while time.monotonic() < idle_until:
        got = client.xreadgroup("g", f"w{worker}", {STREAM: ">"}, count=BATCH)
        entries = got[0][1] if got else []
        if entries:
            idle_until = time.monotonic() + 1.0
            client.xack(STREAM, "g", *[entry_id for entry_id, _ in entries])
            count += len(entries)
            last = time.time()
    out.put((count, last))


def _redis_processes(ctx: Context, total: int) -> Measure:
    if ctx.redis is None:
        return unavailable(ctx.redis_why)
    client = ctx.redis
    client.delete(STREAM)
    body = os.urandom(ctx.sizes.body_bytes)
    for begin in range(0, total, 4096):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(4096, total - begin)):
            pipe.xadd(STREAM, {"body": body})
        pipe.execute()
    client.xgroup_create(STREAM, "g", id="0")
    kwargs = client.connection_pool.connection_kwargs
    url = f"redis://{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}/0"
    mp = multiprocessing.get_context("spawn")
    ready, start, out = mp.Queue(), mp.Event(), mp.Queue()
    procs = [mp.Process(target=_redis_worker, args=(url, i, ready, start, out)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    _wait_ready(ready)
    began = time.time()
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    consumed = sum(r[0] for r in results)
    # The last ack answered is when the work ended (the workers then idle a second).
    measure = rate(consumed, max(r[1] for r in results) - began)
    client.delete(STREAM)
    return measure


def _single(root: str, count: int) -> Measure:
    store = open_store(root)
    consumer = SimpleConsumer(store, "AckSingle", "one")
    consumer.subscribe(TOPIC)
    done = 0
    began = time.perf_counter()
    while done < count:
        got = consumer.receive(max_nums=1, invisible_ms=60_000)
        if not got:
            break
        consumer.ack(got[0])
        done += 1
    consumer.close()
    return rate(done, time.perf_counter() - began)


def acks(ctx: Context) -> list[dict[str, Any]]:
    """Both per-message-ack workloads (see the module docstring)."""
    total = ctx.sizes.ack_messages
    root = _fill(ctx, total)
    ctx.log(f"ack: {total:,} messages stored")
    whole, first, second, info = _lakemq_processes(root, total)
    ctx.log(f"ack: 4 processes {whole.get('msg_s', 0):,.0f} msg/s, {info}")
    red = _redis_processes(ctx, total)
    single = _single(root, ctx.sizes.ack_single)
    ctx.log(f"ack: max_nums=1 {single.get('msg_s', 0):,.0f} msg/s")
    halves = f"first half {first.get('msg_s', 0):,.0f} msg/s, second half {second.get('msg_s', 0):,.0f} msg/s"
    return [
        {
            "id": "ack_4proc",
            "title": f"SimpleConsumer receive {BATCH} + ack, {PROCESSES} processes, 1 KiB",
            "kind": "rate",
            "systems": {OURS: whole, REDIS: red},
            "notes": [
                f"lakemq: {PROCESSES} spawned processes of one group on a topic of {QUEUES} queues, "
                f"receive(max_nums={BATCH}) + ack each; {info['delivered']:,} of {info['expected']:,} "
                f"delivered and acked ({info['undelivered']:,} never, {info['duplicates']:,} twice); "
                f"{info['conflicts']} lease races lost; maintenance passes meanwhile: "
                f"{info['maintenance_passes']}; {halves}"
                + (f"; consumer errors: {'; '.join(info['errors'])}" if info["errors"] else "")
                + ".",
                f"Redis: {PROCESSES} processes, XREADGROUP COUNT {BATCH} + XACK of the ids.",
            ],
        },
        {
            "id": "ack_single",
            "title": "SimpleConsumer receive(max_nums=1) + ack, one consumer",
            "kind": "rate",
            "systems": {OURS: single},
            "notes": ["lakemq: one consumer in the benchmark process, a message at a time."],
        },
    ]
