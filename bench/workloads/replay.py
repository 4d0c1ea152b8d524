"""Spark batch replay of a topic; bare: Spark over the same Delta data through the project's
``deltalog`` source, and a pyarrow scan; Redis: XRANGE over as many stream entries.

The replayed topic lives in its own store (``Sizes.replay_messages`` messages, produced in 4 MiB
batches and dispatched), so that the bare reads scan exactly the same commit log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from deltalake import DeltaTable

from bench.stats import Measure, rate, unavailable
from bench.workloads import BARE, OURS, REDIS, Context
from bench.workloads.produce import QUEUES, REDIS_STREAM, TOPIC, batch_sizes, open_store, random_messages
from engine import Admin, EngineConfig, Producer
from engine.broker.dispatch import dispatch_pending
from engine.spark.deltalog import SHORT_NAME as DELTALOG
from engine.store import schemas

XRANGE_PAGE = 10_000


def best_rate(run: Callable[[], int | None], messages: int, runs: int) -> Measure:
    """The best of ``runs`` timed runs (the first also warms Spark's plan and Python workers up)."""
    best = float("inf")
    for _ in range(runs):
        began = time.perf_counter()
        counted = run()
        best = min(best, time.perf_counter() - began)
        if counted is not None and counted != messages:
            raise RuntimeError(f"read {counted} rows, expected {messages}")
    return rate(messages, best)


def replay_throughput(ctx: Context) -> list[dict[str, Any]]:
    from engine.spark.replay import replay
    from engine.spark.session import session

    sizes = ctx.sizes
    n, runs = sizes.replay_messages, sizes.replay_runs
    store = open_store(ctx.workdir / "replay")
    Admin(store).create_topic(TOPIC, QUEUES)
    # A batch's limit counts each message's tag as RocketMQ does (TAGS\x01TagA\x02: 10 bytes).
    per_batch = max(1, EngineConfig().max_batch_bytes // (sizes.body_bytes + 10))
    messages = random_messages(TOPIC, per_batch, sizes.body_bytes)
    with Producer(store, "BenchReplay") as producer:
        for size in batch_sizes(n, per_batch):
            producer.send_batch(messages[:size])
    dispatch_pending(store)

    spark = session("lakemq-bench-replay")
    try:
        spark.sparkContext.setLogLevel("ERROR")

        def ours() -> None:
            replay(spark, store, TOPIC).write.format("noop").mode("overwrite").save()

        def bare_spark() -> None:
            frame = spark.read.format(DELTALOG).option("path", store.uri(schemas.COMMIT_LOG)).load()
            frame.write.format("noop").mode("overwrite").save()

        ours_rate = best_rate(ours, n, runs)
        ctx.log(f"replay through the mq source: {ours_rate['msg_s']:,} msg/s")
        bare_rate = best_rate(bare_spark, n, runs)
        parallelism = spark.sparkContext.defaultParallelism
    finally:
        spark.stop()

    def arrow_scan() -> int:
        return int(DeltaTable(store.uri(schemas.COMMIT_LOG)).to_pyarrow_dataset().to_table().num_rows)

    scan_rate = best_rate(arrow_scan, n, runs)

    red: Measure
    stream_len = 0 if ctx.redis is None else int(ctx.redis.xlen(REDIS_STREAM))
    if ctx.redis is None:
        red = unavailable(ctx.redis_why)
    elif stream_len < n:
        red = unavailable(f"the stream holds {stream_len} entries, fewer than {n}")
    else:

        def xrange_n() -> int:
            seen, after = 0, "-"
            while seen < n:
                page = ctx.redis.xrange(REDIS_STREAM, min=after, max="+", count=min(XRANGE_PAGE, n - seen))
                if not page:
                    break
                seen += len(page)
                after = "(" + page[-1][0].decode()
            return seen

        red = best_rate(xrange_n, n, runs)
    return [
        {
            "id": "replay",
            "title": f"Spark batch replay of {n:,} messages ({sizes.body_bytes} B bodies)",
            "kind": "rate",
            "systems": {OURS: ours_rate, BARE: bare_rate, REDIS: red},
            "notes": [
                "lakemq: `engine.spark.replay.replay(spark, store, topic)` (the `mq` batch source: consume "
                "queue ranges per Spark task, then commit-log rows by physical offset) into Spark's `noop` "
                f"sink; local[{parallelism}]; best of {runs} run(s), the first one also warming Spark up.",
                "bare delta-rs (Spark): the same commit log read as a snapshot through the project's "
                "`deltalog` source (no Delta JVM jars here) into the `noop` sink.",
                "bare delta-rs (pyarrow, no Spark): `DeltaTable.to_pyarrow_dataset().to_table()` of the "
                f"same commit log: {scan_rate['msg_s']:,} msg/s.",
                f"Redis: XRANGE over the first {n:,} entries of the stream, {XRANGE_PAGE:,} per call, into "
                "Python.",
            ],
            "extra": {"bare_pyarrow_scan": scan_rate},
        }
    ]
