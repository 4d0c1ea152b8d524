"""Produce and pull benchmark: lakemq side by side with a bare delta-rs append and Redis Streams.

    python bench/produce_pull.py [--messages N]

Measures, on a store in a temporary directory (removed afterwards):

* batched produce of 1 KiB messages through ``Producer.send_batch`` (batches of ~4 MiB, one Delta
  commit each) against a bare ``deltalake.write_deltalake`` append of the same Arrow rows, in the
  same batch sizes, into a scratch table with the commit log's schema and table settings;
* dispatch (``dispatch_pending``: the dispatch job's logic without Spark);
* pull latency of 32-message pulls from random offsets and from the tail of a queue;
* single synchronous send latency, and async send throughput (``send_async`` with linger);
* the same operations on Redis Streams (XADD pipelined / single, XRANGE COUNT 32) when
  ``redis-server`` is installed: a real broker on loopback, without persistence.

Targets (DESIGN.md §6) are printed next to the numbers but never asserted: they depend on the
machine. Results go to ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make the engine importable without installing it
    sys.path.insert(0, str(ROOT))

import deltalake  # noqa: E402
import pyarrow as pa  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from engine import Admin, EngineConfig, Message, Producer, PullConsumer, PullStatus, Store  # noqa: E402
from engine.store import schemas  # noqa: E402
from engine.store.dispatch import dispatch_pending  # noqa: E402

TOPIC = "Bench"
QUEUES = 4
BODY_BYTES = 1024
PULL_SIZE = 32
DEFAULT_OUT = ROOT / "bench" / "results" / "latest.json"


# ----------------------------------------------------------------------------- helpers
def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank) of samples, in their unit."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def latencies_ms(fn: Callable[[int], Any], n: int) -> list[float]:
    samples = []
    for i in range(n):
        began = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - began) * 1000)
    return samples


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(samples, 50), 3),
        "p99_ms": round(percentile(samples, 99), 3),
        "mean_ms": round(statistics.fmean(samples), 3),
        "n": len(samples),
    }


def batch_messages(count: int) -> list[Message]:
    """``count`` distinct 1 KiB messages (random bodies, so compression flatters no one)."""
    return [Message(TOPIC, os.urandom(BODY_BYTES), tags=("TagA", "TagB")[i % 2]) for i in range(count)]


# ----------------------------------------------------------------------------- lakemq
def bench_produce(store: Store, total: int, per_batch: int) -> tuple[float, list[int]]:
    """Batched produce: returns msg/s and the size of every batch sent."""
    messages = batch_messages(per_batch)
    sizes = [min(per_batch, total - done) for done in range(0, total, per_batch)]
    with Producer(store, "BenchProducer") as producer:
        began = time.perf_counter()
        for size in sizes:
            producer.send_batch(messages[:size] if size < per_batch else messages)
        elapsed = time.perf_counter() - began
    return total / elapsed, sizes


def bench_bare_append(store: Store, scratch: str, sizes: Sequence[int]) -> float:
    """The same Arrow rows the producer committed, appended with bare ``write_deltalake``."""
    rows = store.read(schemas.COMMIT_LOG).sort_by("physical_offset")
    config = {"delta.dataSkippingNumIndexedCols": "8"}  # as the store's commit log
    dt = DeltaTable.create(scratch, schemas.COMMIT_LOG_SCHEMA, mode="error", configuration=config)
    slices, start = [], 0
    for size in sizes:
        slices.append(rows.slice(start, size))
        start += size
    began = time.perf_counter()
    for part in slices:
        write_deltalake(dt, part, mode="append")
    elapsed = time.perf_counter() - began
    return sum(sizes) / elapsed


def bench_pulls(store: Store, pulls: int) -> tuple[list[float], list[float]]:
    consumer = PullConsumer(store, "BenchConsumer")
    bounds = {s.queue_id: (s.min_offset, s.max_offset) for s in Admin(store).topic_stats(TOPIC)}
    queues = [q for q, (lo, hi) in bounds.items() if hi - lo >= PULL_SIZE]
    rng = random.Random(7)

    def pull_at(qid: int, offset: int) -> None:
        result = consumer.pull(TOPIC, qid, offset, PULL_SIZE)
        if result.status is not PullStatus.FOUND or len(result.messages) != PULL_SIZE:
            raise RuntimeError(f"pull {qid}@{offset} returned {result.status} {len(result.messages)}")

    for qid in queues:  # first touch of each queue's files is not what is measured
        pull_at(qid, bounds[qid][0])

    def random_pull(_: int) -> None:
        qid = rng.choice(queues)
        lo, hi = bounds[qid]
        pull_at(qid, rng.randrange(lo, hi - PULL_SIZE + 1))

    def tail_pull(i: int) -> None:
        qid = queues[i % len(queues)]
        pull_at(qid, bounds[qid][1] - PULL_SIZE)

    return latencies_ms(random_pull, pulls), latencies_ms(tail_pull, pulls)


def bench_sync_send(store: Store, n: int) -> list[float]:
    body = os.urandom(BODY_BYTES)
    with Producer(store, "BenchSync") as producer:
        producer.send(Message(TOPIC, body, tags="TagA"))  # warm-up
        return latencies_ms(lambda i: producer.send(Message(TOPIC, body, tags="TagA")), n)


def bench_async_send(store: Store, n: int) -> float:
    messages = batch_messages(min(n, 4096))
    with Producer(store, "BenchAsync") as producer:
        began = time.perf_counter()
        futures = [producer.send_async(messages[i % len(messages)]) for i in range(n)]
        producer.flush()
        elapsed = time.perf_counter() - began
    failed = sum(1 for f in futures if f.exception() is not None)
    if failed:
        raise RuntimeError(f"{failed} async sends failed")
    return n / elapsed


# ----------------------------------------------------------------------------- redis
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_redis(total: int, per_batch: int, pulls: int, sync_sends: int) -> dict[str, Any] | None:
    """Redis Streams on loopback (no persistence), or None when redis-server is not installed."""
    server = shutil.which("redis-server")
    if server is None:
        return None
    import redis

    port = _free_port()
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        bodies = [os.urandom(BODY_BYTES) for _ in range(per_batch)]
        stream, seq = "bench", 0
        began = time.perf_counter()
        for start in range(0, total, per_batch):
            pipe = client.pipeline(transaction=False)
            for i in range(min(per_batch, total - start)):
                seq += 1
                pipe.xadd(stream, {"tags": ("TagA", "TagB")[i % 2], "body": bodies[i]}, id=f"{seq}-0")
            pipe.execute()
        produce = total / (time.perf_counter() - began)
        rng = random.Random(7)

        def xrange_at(first: int) -> None:
            got = client.xrange(stream, min=f"{first}-0", max="+", count=PULL_SIZE)
            if len(got) != PULL_SIZE:
                raise RuntimeError(f"XRANGE returned {len(got)} entries")

        random_pulls = latencies_ms(lambda i: xrange_at(rng.randrange(1, seq - PULL_SIZE + 2)), pulls)
        tail_pulls = latencies_ms(lambda i: xrange_at(seq - PULL_SIZE + 1), pulls)
        body = bodies[0]
        sends = latencies_ms(lambda i: client.xadd(stream, {"tags": "TagA", "body": body}), sync_sends)
        return {
            "produce_msg_s": round(produce),
            "pull_random": summary(random_pulls),
            "pull_tail": summary(tail_pulls),
            "sync_send": summary(sends),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ----------------------------------------------------------------------------- report
def _ms(s: dict[str, float]) -> str:
    return f"p50 {s['p50_ms']:.2f} / p99 {s['p99_ms']:.2f} ms"


def report(results: dict[str, Any], console: Console) -> None:
    lake, bare, red = results["lakemq"], results["bare_delta_rs"], results.get("redis")
    table = Table(title=f"lakemq produce/pull benchmark ({results['params']['messages']:,} x 1 KiB messages)")
    table.add_column("measure")
    table.add_column("lakemq", justify="right")
    table.add_column("bare delta-rs", justify="right")
    table.add_column("Redis Streams", justify="right")
    table.add_column("target (DESIGN §6)")
    none = "-"
    table.add_row(
        "batched produce, msg/s",
        f"{lake['produce_msg_s']:,}",
        f"{bare['append_msg_s']:,} ({lake['produce_vs_bare']:.0%})",
        f"{red['produce_msg_s']:,}" if red else none,
        ">= 150k and >= 50% of bare",
    )
    table.add_row("dispatch (no Spark), msg/s", f"{lake['dispatch_msg_s']:,}", none, none, "")
    table.add_row(
        "pull 32, random offset",
        _ms(lake["pull_random"]),
        none,
        _ms(red["pull_random"]) if red else none,
        "p50 <= 10, p99 <= 50 ms",
    )
    table.add_row("pull 32, tail", _ms(lake["pull_tail"]), none, _ms(red["pull_tail"]) if red else none, "")
    table.add_row(
        "single sync send",
        _ms(lake["sync_send"]),
        none,
        _ms(red["sync_send"]) if red else none,
        "p50 <= 30 ms",
    )
    table.add_row("async send (linger), msg/s", f"{lake['async_send_msg_s']:,}", none, none, ">= 20k")
    console.print(table)
    if red is None:
        console.print("Redis Streams peer skipped: redis-server is not installed (or --no-redis).")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="lakemq produce/pull benchmark")
    parser.add_argument("--messages", type=int, default=200_000, help="messages produced (default 200000)")
    parser.add_argument("--batch-bytes", type=int, default=4 * 1024 * 1024, help="bytes of bodies per batch")
    parser.add_argument("--pulls", type=int, default=300, help="pulls timed per kind (default 300)")
    parser.add_argument("--sync-sends", type=int, default=200, help="single sends timed (default 200)")
    parser.add_argument("--async-messages", type=int, default=20_000, help="async sends (default 20000)")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis Streams peer")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON results")
    args = parser.parse_args(argv)
    if args.messages < QUEUES * PULL_SIZE * 2:
        parser.error(f"--messages must be at least {QUEUES * PULL_SIZE * 2}")
    per_batch = max(1, min(args.batch_bytes, EngineConfig().max_batch_bytes) // BODY_BYTES)
    # Piped output would squeeze the table to 80 columns.
    console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 130)
    workdir = Path(tempfile.mkdtemp(prefix="lakemq-bench-"))
    began = time.perf_counter()
    try:
        store = Store.open(workdir / "store", config=EngineConfig(store=str(workdir / "store")))
        Admin(store).create_topic(TOPIC, QUEUES)
        with console.status("batched produce (lakemq)"):
            produce, sizes = bench_produce(store, args.messages, per_batch)
        with console.status("batched append (bare write_deltalake)"):
            bare = bench_bare_append(store, str(workdir / "scratch"), sizes)
        with console.status("dispatch"):
            t = time.perf_counter()
            dispatched = dispatch_pending(store)
            dispatch = dispatched / (time.perf_counter() - t)
        with console.status("pulls"):
            random_pulls, tail_pulls = bench_pulls(store, args.pulls)
        with console.status("single synchronous sends"):
            sends = bench_sync_send(store, args.sync_sends)
        with console.status("async sends"):
            async_rate = bench_async_send(store, args.async_messages)
        with console.status("Redis Streams peer"):
            red = (
                None if args.no_redis else bench_redis(args.messages, per_batch, args.pulls, args.sync_sends)
            )
        results: dict[str, Any] = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "deltalake": deltalake.__version__,
                "pyarrow": pa.__version__,
            },
            "params": {
                "messages": args.messages,
                "body_bytes": BODY_BYTES,
                "batch_messages": per_batch,
                "batches": len(sizes),
                "pulls": args.pulls,
                "sync_sends": args.sync_sends,
                "async_messages": args.async_messages,
            },
            "lakemq": {
                "produce_msg_s": round(produce),
                "produce_vs_bare": round(produce / bare, 3),
                "dispatch_msg_s": round(dispatch),
                "pull_random": summary(random_pulls),
                "pull_tail": summary(tail_pulls),
                "sync_send": summary(sends),
                "async_send_msg_s": round(async_rate),
            },
            "bare_delta_rs": {"append_msg_s": round(bare)},
            "redis": red,
            "elapsed_s": round(time.perf_counter() - began, 1),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(results, console)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"wrote {args.out} ({results['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip finalization: pyarrow scan threads can abort a clean exit (delta-rs#2184)
