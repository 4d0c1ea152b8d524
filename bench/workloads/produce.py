"""Batched produce (which also builds the big store), single synchronous sends, async sends."""

from __future__ import annotations

import os
import time
from typing import Any

from deltalake import write_deltalake

from bench import peers
from bench.stats import Measure, latency, rate, timed_ms, unavailable
from bench.workloads import BARE, OURS, REDIS, Context
from engine import Admin, EngineConfig, Message, Producer, Store
from engine.broker.dispatch import dispatch_pending
from engine.store import schemas

TOPIC = "Bench"
QUEUES = 4
REDIS_STREAM = "bench"
# Dispatch after this many produce batches while building the store, so that the consume queue has
# the many small files a running dispatch job leaves (one commit per trigger) for compaction to fix.
DISPATCH_EVERY_BATCHES = 3


def open_store(path: os.PathLike[str] | str) -> Store:
    return Store.open(str(path), config=EngineConfig(store=str(path)))


def random_messages(topic: str, count: int, body_bytes: int) -> list[Message]:
    """``count`` distinct messages with random bodies (compression flatters no one), tags A/B."""
    return [Message(topic, os.urandom(body_bytes), tags=("TagA", "TagB")[i % 2]) for i in range(count)]


def batch_sizes(total: int, per_batch: int) -> list[int]:
    return [min(per_batch, total - done) for done in range(0, total, per_batch)]


def batched_produce(ctx: Context) -> list[dict[str, Any]]:
    """N messages through ``send_batch`` (4 MiB batches) into the big store; the same Arrow rows
    with bare ``write_deltalake`` in the same batch sizes; pipelined XADD of the same bodies."""
    sizes = ctx.sizes
    store = open_store(ctx.workdir / "big")
    Admin(store).create_topic(TOPIC, QUEUES)
    # A batch's limit counts each message's tag as RocketMQ does (TAGS\x01TagA\x02: 10 bytes).
    per_batch = max(1, EngineConfig().max_batch_bytes // (sizes.body_bytes + 10))
    plan = batch_sizes(sizes.messages, per_batch)
    messages = random_messages(TOPIC, per_batch, sizes.body_bytes)
    produce_s = dispatch_s = 0.0
    with Producer(store, "BenchProducer") as producer:
        for i, size in enumerate(plan):
            began = time.perf_counter()
            producer.send_batch(messages[:size] if size < per_batch else messages)
            produce_s += time.perf_counter() - began
            if (i + 1) % DISPATCH_EVERY_BATCHES == 0 or i == len(plan) - 1:
                began = time.perf_counter()
                dispatch_pending(store)
                dispatch_s += time.perf_counter() - began
    ctx.big_store, ctx.produce_sizes = store, plan
    ctx.log(f"produced {sizes.messages:,} in {produce_s:.1f}s, dispatched in {dispatch_s:.1f}s")

    rows = store.read(schemas.COMMIT_LOG).sort_by("physical_offset")
    ctx.big_bare_uri = str(ctx.workdir / "bare_commit_log")
    bare_dt = peers.create_commit_log_like(ctx.big_bare_uri)
    bare_s = peers.append_slices(bare_dt, peers.slices(rows, plan))
    del rows

    red: Measure
    if ctx.redis is None:
        red = unavailable(ctx.redis_why)
    else:
        bodies = [m.body for m in messages]
        seq = 0
        began = time.perf_counter()
        for size in plan:
            pipe = ctx.redis.pipeline(transaction=False)
            for i in range(size):
                seq += 1
                pipe.xadd(REDIS_STREAM, {"tags": ("TagA", "TagB")[i % 2], "body": bodies[i]}, id=f"{seq}-0")
            pipe.execute()
        red = rate(sizes.messages, time.perf_counter() - began)
    dispatch = rate(sizes.messages, dispatch_s)
    return [
        {
            "id": "produce_batched",
            "title": f"Batched produce, {sizes.body_bytes} B bodies, {per_batch}-message batches",
            "kind": "rate",
            "systems": {
                OURS: rate(sizes.messages, produce_s),
                BARE: rate(sizes.messages, bare_s),
                REDIS: red,
            },
            "notes": [
                f"{sizes.messages:,} messages in {len(plan)} batches of up to {per_batch} (4 MiB), one Delta "
                "commit each (`Producer.send_batch`).",
                "bare delta-rs: `write_deltalake(mode='append')` of the very Arrow rows the producer "
                "committed, in the same batch sizes, into a table with the commit log's schema and settings.",
                f"Redis: XADD pipelined {per_batch} per round trip (no MULTI), the same bodies.",
                f"Not timed here: dispatch of the same messages (`dispatch_pending` every "
                f"{DISPATCH_EVERY_BATCHES} batches) ran at {dispatch['msg_s']:,} msg/s.",
            ],
        }
    ]


def small_store(ctx: Context, name: str) -> Store:
    store = open_store(ctx.workdir / name)
    Admin(store).create_topic(TOPIC, QUEUES)
    return store


def sync_send(ctx: Context) -> list[dict[str, Any]]:
    """One message per call, waiting for its commit: ``send`` / one-row ``write_deltalake`` / XADD."""
    n, body_bytes = ctx.sizes.sync_sends, ctx.sizes.body_bytes
    store = small_store(ctx, "sync")
    body = os.urandom(body_bytes)
    with Producer(store, "BenchSync") as producer:
        for _ in range(5):  # warm-up: first touches of the tables
            producer.send(Message(TOPIC, body, tags="TagA"))
        ours = timed_ms(lambda i: producer.send(Message(TOPIC, body, tags="TagA")), n)
    one_row = store.read(schemas.COMMIT_LOG).slice(0, 1)
    dt = peers.create_commit_log_like(str(ctx.workdir / "bare_sync"))
    for _ in range(5):
        write_deltalake(dt, one_row, mode="append")
    bare = timed_ms(lambda i: write_deltalake(dt, one_row, mode="append"), n)
    red: Measure
    if ctx.redis is None:
        red = unavailable(ctx.redis_why)
    else:
        red = latency(timed_ms(lambda i: ctx.redis.xadd("sync", {"tags": "TagA", "body": body}), n))
        ctx.redis.delete("sync")
    return [
        {
            "id": "send_sync",
            "title": f"Single synchronous send, {body_bytes} B body",
            "kind": "latency",
            "systems": {OURS: latency(ours), BARE: latency(bare), REDIS: red},
            "notes": [
                f"{n} sends one after another, each returning once its commit landed (`Producer.send`).",
                "bare delta-rs: `write_deltalake` of one commit-log row per call (one commit each).",
                "Redis: one XADD per round trip.",
            ],
        }
    ]


def async_send(ctx: Context) -> list[dict[str, Any]]:
    """``send_async`` with the default linger; bare and Redis batch the same way (512 per commit)."""
    n, body_bytes = ctx.sizes.async_messages, ctx.sizes.body_bytes
    store = small_store(ctx, "async")
    messages = random_messages(TOPIC, min(n, 4096), body_bytes)
    with Producer(store, "BenchAsync") as producer:
        linger, per_commit = producer.linger_ms, producer.batch_size
        producer.send(messages[0])  # warm-up
        began = time.perf_counter()
        futures = [producer.send_async(messages[i % len(messages)]) for i in range(n)]
        producer.flush()
        ours_s = time.perf_counter() - began
    failed = sum(1 for f in futures if f.exception() is not None)
    if failed:
        raise RuntimeError(f"{failed} of {n} async sends failed")
    rows = store.read(schemas.COMMIT_LOG).sort_by("physical_offset").slice(1, n)
    plan = batch_sizes(n, per_commit)
    dt = peers.create_commit_log_like(str(ctx.workdir / "bare_async"))
    bare_s = peers.append_slices(dt, peers.slices(rows, plan))
    red: Measure
    if ctx.redis is None:
        red = unavailable(ctx.redis_why)
    else:
        began = time.perf_counter()
        done = 0
        for size in plan:
            pipe = ctx.redis.pipeline(transaction=False)
            for i in range(done, done + size):
                pipe.xadd("async", {"tags": "TagA", "body": messages[i % len(messages)].body})
            pipe.execute()
            done += size
        red = rate(n, time.perf_counter() - began)
        ctx.redis.delete("async")
    return [
        {
            "id": "send_async",
            "title": f"Async produce (`send_async`, linger {linger} ms, up to {per_commit} per commit)",
            "kind": "rate",
            "systems": {OURS: rate(n, ours_s), BARE: rate(n, bare_s), REDIS: red},
            "notes": [
                f"{n:,} messages of {body_bytes} B queued from one thread, then `flush()`; every future "
                "resolved without error.",
                f"bare delta-rs: the same rows appended {per_commit} per commit (the producer's largest "
                "micro-batch): the floor of an async producer on delta-rs.",
                f"Redis: XADD pipelined {per_commit} per round trip, as an async client batching the "
                "same way.",
            ],
        }
    ]
