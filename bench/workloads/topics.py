"""Topics at scale and SYNC_FLUSH: what many topics and durable acknowledgements cost a send.

- ``topic_create``: ``Admin.create_topic`` one after another, against one synchronous send of the
  same run (target: within 3x), and ``create_topics`` for many at once.
- ``send_many_topics``: a synchronous send with 10,000 topics in the store (each send to another
  topic) against a store with one topic (target: within 1.5x).
- ``commit_metadata``: the commitInfo a send's commit carries with 300 topics x 4 queues in use
  (target: <= 4 KiB) and with every queue of 10,000 topics known.
- ``send_sync_flush``: a synchronous send with ``flush_disk_type = SYNC_FLUSH`` against
  ``ASYNC_FLUSH`` (target: within 2x).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from bench.stats import latency, timed_ms
from bench.workloads import OURS, Context
from engine import Admin, EngineConfig, Message, Producer, Store
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.stamping import PendingMessage

BODY = 1024
CREATE_BATCH = 2_000  # topics per create_topics call while building the many-topic store


def _open(path: Path, **config: Any) -> Store:
    return Store.open(str(path), config=EngineConfig(store=str(path), **config))


def _commit_info_bytes(store: Store, versions: range) -> list[int]:
    """Size of each version's commitInfo line (what a commit carries besides its actions)."""
    log = Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log"
    sizes = []
    for version in versions:
        for line in (log / f"{version:020d}.json").read_text().splitlines():
            if line.startswith('{"commitInfo"'):
                sizes.append(len(line.encode()))
    return sizes


def _interleaved_sends(stores: dict[str, tuple[Store, list[str]]], n: int) -> dict[str, list[float]]:
    """``n`` synchronous sends to each store, one to each in turn (both see the same load), each to
    a topic drawn at random among the store's."""
    body = os.urandom(BODY)
    rng = random.Random(7)
    samples: dict[str, list[float]] = {name: [] for name in stores}
    producers = {name: Producer(store, "BenchTopics") for name, (store, _) in stores.items()}
    try:
        for name, producer in producers.items():
            for topic in stores[name][1][:5]:  # warm-up
                producer.send(Message(topic, body))
        for _ in range(n):
            for name, producer in producers.items():
                message = Message(rng.choice(stores[name][1]), body)
                began = time.perf_counter()
                producer.send(message)
                samples[name].append((time.perf_counter() - began) * 1000)
    finally:
        for producer in producers.values():
            producer.close()
    return samples


def topics(ctx: Context) -> list[dict[str, Any]]:
    """Topic creation, sends among many topics, and commit metadata size."""
    n, many, creates = ctx.sizes.sync_sends, ctx.sizes.topics_many, ctx.sizes.topic_creates
    one = _open(ctx.workdir / "topics_one")
    admin = Admin(one)
    admin.create_topic("One", 4)

    big = _open(ctx.workdir / "topics_many")
    names = [f"topic-{i:05d}" for i in range(many)]
    began = time.perf_counter()
    for start in range(0, many, CREATE_BATCH):
        Admin(big).create_topics(names[start : start + CREATE_BATCH], 4)
    bulk_s = time.perf_counter() - began
    sends = _interleaved_sends({"one": (one, ["One"]), "many": (big, names)}, n)
    one_send, many_send = sends["one"], sends["many"]
    create = timed_ms(lambda i: admin.create_topic(f"created-{i:05d}", 4), creates)
    first = big.version(schemas.COMMIT_LOG) - n + 1
    many_meta = _commit_info_bytes(big, range(first, big.version(schemas.COMMIT_LOG) + 1))

    # 300 topics x 4 queues in use: one batch writes every queue, then single sends.
    mid = _open(ctx.workdir / "topics_300")
    writer = CommitLogWriter(mid)
    writer.append([PendingMessage(f"t{t:03d}", q, b"x", f"u{t}-{q}") for t in range(300) for q in range(4)])
    for i in range(50):
        writer.append([PendingMessage(f"t{i * 7 % 300:03d}", i % 4, os.urandom(BODY), f"s{i}")])
    latest = mid.version(schemas.COMMIT_LOG)
    mid_meta = _commit_info_bytes(mid, range(latest - 49, latest + 1))

    one_p50 = latency(one_send)["p50_ms"]
    created = latency(create)
    created["x_send"] = round(created["p50_ms"] / one_p50, 2)
    sent_many = latency(many_send)
    sent_many["x_one_topic"] = round(sent_many["p50_ms"] / one_p50, 2)
    return [
        {
            "id": "topic_create",
            "title": "Creating a topic",
            "kind": "latency",
            "systems": {OURS: created},
            "notes": [
                f"{creates} `Admin.create_topic` calls one after another (4 queues each): p50 "
                f"{created['p50_ms']:.1f} ms, {created['x_send']:.2f}x one synchronous send of the same run "
                f"(p50 {one_p50:.1f} ms, {BODY} B body, a store with one topic).",
                f"`Admin.create_topics` of {many:,} topics in batches of {CREATE_BATCH:,} (one commit each): "
                f"{bulk_s * 1000:,.0f} ms in all.",
            ],
        },
        {
            "id": "send_many_topics",
            "title": f"Synchronous send with {many:,} topics in the store",
            "kind": "latency",
            "systems": {OURS: sent_many},
            "notes": [
                f"{n} sends, each to a topic drawn at random among {many:,} (4 queues each): p50 "
                f"{sent_many['p50_ms']:.1f} ms, {sent_many['x_one_topic']:.2f}x the p50 of as many sends "
                f"to a store with one topic ({one_p50:.1f} ms), one to each store in turn.",
            ],
        },
        {
            "id": "commit_metadata",
            "title": "Commit metadata per send",
            "kind": "latency",
            "systems": {OURS: {"commit_bytes": max(mid_meta), "n": len(mid_meta)}},
            "notes": [
                f"commitInfo of a one-message commit with 300 topics x 4 queues in use: at most "
                f"{max(mid_meta):,} B, mean {sum(mid_meta) / len(mid_meta):,.0f} B over {len(mid_meta)} "
                "commits (each names the queue it wrote plus a rolling slice of the others, `mq.marks`).",
                f"with {many:,} topics x 4 queues: at most {max(many_meta):,} B, mean "
                f"{sum(many_meta) / len(many_meta):,.0f} B over the {len(many_meta)} sends above.",
                "Before compact marks every commit carried every queue's next offset (`mq.hwm`): "
                "~15.5 KiB per commit at 500 topics x 8 queues (issue 13).",
            ],
        },
    ]


def sync_flush(ctx: Context) -> list[dict[str, Any]]:
    """Synchronous sends with SYNC_FLUSH against ASYNC_FLUSH, interleaved in the same run."""
    n = ctx.sizes.sync_sends
    stores = {
        flush: _open(ctx.workdir / f"flush_{flush.lower()}", flush_disk_type=flush)
        for flush in ("ASYNC_FLUSH", "SYNC_FLUSH")
    }
    samples: dict[str, list[float]] = {flush: [] for flush in stores}
    body = os.urandom(BODY)
    producers = {}
    for flush, store in stores.items():
        Admin(store).create_topic("Flush", 4)
        producers[flush] = Producer(store, f"Bench{flush}")
    try:
        for producer in producers.values():
            for _ in range(5):
                producer.send(Message("Flush", body))
        for _ in range(n):  # interleaved: both see the same load
            for flush, producer in producers.items():
                began = time.perf_counter()
                producer.send(Message("Flush", body))
                samples[flush].append((time.perf_counter() - began) * 1000)
    finally:
        for producer in producers.values():
            producer.close()
    sync, plain = latency(samples["SYNC_FLUSH"]), latency(samples["ASYNC_FLUSH"])
    sync["x_async_flush"] = round(sync["p50_ms"] / plain["p50_ms"], 2)
    return [
        {
            "id": "send_sync_flush",
            "title": "Synchronous send with SYNC_FLUSH",
            "kind": "latency",
            "systems": {OURS: sync},
            "notes": [
                f"{n} sends each with `flush_disk_type = SYNC_FLUSH` (acknowledged after fsync of the data "
                "file, the commit file and their two directories) and `ASYNC_FLUSH`, interleaved.",
                f"SYNC_FLUSH p50 {sync['p50_ms']:.1f} ms / p99 {sync['p99_ms']:.1f} ms against ASYNC_FLUSH "
                f"p50 {plain['p50_ms']:.1f} ms / p99 {plain['p99_ms']:.1f} ms: {sync['x_async_flush']:.2f}x, "
                f"the fsyncs cost {sync['p50_ms'] - plain['p50_ms']:.1f} ms at the median on this disk.",
            ],
        }
    ]
