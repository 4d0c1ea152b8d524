"""Spark over a topic: batch replay, a topic-filtered SELECT over the ``messages`` view, and
``df.write.format("mq")``; the peer is native Delta on Spark over the same commit log (a plain
``format("delta")`` scan / query of the bare table), or the batched producer for the write; Redis:
XRANGE over as many stream entries.

The replayed topic lives in its own store (``Sizes.replay_messages`` messages, produced in 4 MiB
batches and dispatched), so that the bare reads scan exactly the same commit log.
"""

from __future__ import annotations

import statistics
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
from engine.spark.session import DELTA_READS, delta_enabled
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


def interleaved_rates(
    cases: dict[str, Callable[[], int | None]], messages: int, runs: int
) -> dict[str, Measure]:
    """Median rates of cases measured side by side: each case runs once untimed (warm: plans,
    Python workers, the OS page cache), then ``runs`` rounds run every case in turn, so load on the
    machine falls on all of them alike. Each measure also keeps its best run."""
    for run in cases.values():
        counted = run()
        if counted is not None and counted != messages:
            raise RuntimeError(f"read {counted} rows, expected {messages}")
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(max(1, runs)):
        for name, run in cases.items():
            began = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - began)
    out: dict[str, Measure] = {}
    for name, taken in seconds.items():
        measure = rate(messages, statistics.median(taken))
        measure["best_msg_s"] = round(messages / min(taken))
        measure["runs"] = len(taken)
        out[name] = measure
    return out


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
    extra: dict[str, Any] = {}
    select: dict[str, Measure] = {}
    write: dict[str, Measure] = {}
    try:
        spark.sparkContext.setLogLevel("ERROR")
        native = delta_enabled(spark)
        log_uri = store.uri(schemas.COMMIT_LOG)

        def ours() -> None:
            replay(spark, store, TOPIC).write.format("noop").mode("overwrite").save()

        def native_scan() -> None:
            spark.read.format("delta").load(log_uri).write.format("noop").mode("overwrite").save()

        def deltalog_scan() -> None:
            frame = spark.read.format(DELTALOG).option("path", log_uri).load()
            frame.write.format("noop").mode("overwrite").save()

        if native:
            # The same rows: the store holds this one topic, all dispatched.
            counts = (replay(spark, store, TOPIC).count(), spark.read.format("delta").load(log_uri).count())
            if counts != (n, n):
                raise RuntimeError(f"replay and the native scan read {counts} rows, expected {n} each")
            both = interleaved_rates({"ours": ours, "bare": native_scan}, n, runs)
            ours_rate, bare_rate = both["ours"], both["bare"]
            spark.conf.set(DELTA_READS, "false")
            extra["replay_mq_source"] = best_rate(ours, n, runs)
            spark.conf.set(DELTA_READS, "true")
        else:
            ours_rate = best_rate(ours, n, runs)
            bare_rate = unavailable("Delta on Spark is off: the Delta jars could not be fetched")
        ctx.log(f"replay ({'native Delta' if native else 'the mq source'}): {ours_rate['msg_s']:,} msg/s")
        extra["deltalog_scan"] = best_rate(deltalog_scan, n, runs)
        if native:
            select = _topic_select(spark, store, n, runs)
        write = _sink_write(spark, ctx, n, runs)
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
    extra["bare_pyarrow_scan"] = scan_rate
    results = [
        {
            "id": "replay",
            "title": f"Spark batch replay of {n:,} messages ({sizes.body_bytes} B bodies)",
            "kind": "rate",
            "systems": {OURS: ours_rate, BARE: bare_rate, REDIS: red},
            "notes": [
                "lakemq: `engine.spark.replay(spark, store, topic)` into Spark's `noop` sink: with Delta on "
                "Spark a native Delta scan of the commit log filtered to the topic and each queue's planned "
                f"offset range, and a projection (no Python on the path); local[{parallelism}]; median of "
                f"{runs} runs after one untimed warm-up run, alternating with the native scan.",
                "bare (native Delta on Spark): `spark.read.format('delta').load(commit_log)` of the same "
                "rows (counted equal before timing) into the `noop` sink, in the same rounds.",
                "replay through the `mq` source (the fallback without the Delta jars): "
                f"{_fmt(extra.get('replay_mq_source'))}; the same snapshot through the `deltalog` source: "
                f"{_fmt(extra.get('deltalog_scan'))}.",
                "bare delta-rs (pyarrow, no Spark): `DeltaTable.to_pyarrow_dataset().to_table()` of the "
                f"same commit log: {scan_rate['msg_s']:,} msg/s.",
                f"Redis: XRANGE over the first {n:,} entries of the stream, {XRANGE_PAGE:,} per call, into "
                "Python.",
            ],
            "extra": extra,
        }
    ]
    if select:
        results.append(
            {
                "id": "select_topic",
                "title": f"Topic-filtered SELECT over {n:,} messages (Spark SQL)",
                "kind": "rate",
                "systems": {OURS: select["ours"], BARE: select["bare"], REDIS: unavailable("no SQL")},
                "notes": [
                    f"lakemq: `{SELECT_SQL.format(source='messages', topic=TOPIC)}` over the `messages` "
                    "view (the commit log within each queue's consume-queue bounds); median of runs after a "
                    "warm-up, alternating with the bare query.",
                    "bare (native Delta on Spark): the same query over the commit log's bare Delta table.",
                ],
            }
        )
    if write:
        results.append(
            {
                "id": "spark_sink",
                "title": f"`df.write.format('mq')` of {write['n']:,} rows from 4 partitions",
                "kind": "rate",
                "systems": {OURS: write["ours"], BARE: write["producer"], REDIS: unavailable("not measured")},
                "notes": [
                    "lakemq: a 4-partition DataFrame of (topic, body) written with `format('mq')`: each "
                    "task checks and stages its rows, the driver commits them one partition (one "
                    "commit-log commit) at a time.",
                    "peer: the batched producer (`Producer.send_batch` in 4 MiB batches) of the same rows.",
                ],
            }
        )
    return results


SELECT_SQL = (
    "SELECT queue_id, count(*) AS n, sum(length(body)) AS bytes FROM {source} "
    "WHERE topic = '{topic}' GROUP BY queue_id"
)


def _fmt(measure: Measure | None) -> str:
    return "not measured" if not measure or "msg_s" not in measure else f"{measure['msg_s']:,} msg/s"


def _topic_select(spark: Any, store: Any, n: int, runs: int) -> dict[str, Measure]:
    """The topic-filtered query over the messages view and over the bare commit-log table."""
    from engine.spark import register_views

    register_views(spark, store, ["messages"])
    spark.read.format("delta").load(store.uri(schemas.COMMIT_LOG)).createOrReplaceTempView("bare_log")

    def query(source: str) -> Callable[[], int]:
        def run() -> int:
            rows = spark.sql(SELECT_SQL.format(source=source, topic=TOPIC)).collect()
            return sum(int(r.n) for r in rows)

        return run

    return interleaved_rates({"ours": query("messages"), "bare": query("bare_log")}, n, runs)


def _sink_write(spark: Any, ctx: Context, n: int, runs: int) -> dict[str, Any]:
    """``df.write.format("mq")`` of ``n`` rows in 4 partitions vs the batched producer, fresh stores."""
    body = b"x" * ctx.sizes.body_bytes
    frame = spark.range(n, numPartitions=4).selectExpr(f"'{TOPIC}' AS topic", f"X'{body.hex()}' AS body")
    frame = frame.cache()
    frame.count()
    best: dict[str, float] = {"ours": float("inf"), "producer": float("inf")}
    # A batch's limit counts each message's tag as RocketMQ does (TAGS\x01TagA\x02: 10 bytes).
    per_batch = max(1, EngineConfig().max_batch_bytes // (ctx.sizes.body_bytes + 10))
    for run in range(runs):
        target = open_store(ctx.workdir / f"sink-{run}")
        Admin(target).create_topic(TOPIC, QUEUES)
        began = time.perf_counter()
        frame.write.format("mq").option("store", target.root).mode("append").save()
        best["ours"] = min(best["ours"], time.perf_counter() - began)
        other = open_store(ctx.workdir / f"producer-{run}")
        Admin(other).create_topic(TOPIC, QUEUES)
        messages = random_messages(TOPIC, per_batch, ctx.sizes.body_bytes)
        began = time.perf_counter()
        with Producer(other, "BenchSink") as producer:
            for size in batch_sizes(n, per_batch):
                producer.send_batch(messages[:size])
        best["producer"] = min(best["producer"], time.perf_counter() - began)
    frame.unpersist()
    return {"n": n, "ours": rate(n, best["ours"]), "producer": rate(n, best["producer"])}
