"""Pulls of 32 messages from the big store, at random offsets and from the tail, before and after
compaction; the bare floor is a pruned pyarrow scan of the same rows, Redis reads with XREADGROUP."""

from __future__ import annotations

import random
import time
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable

from bench.stats import Measure, latency, timed_ms, unavailable
from bench.workloads import BARE, OURS, REDIS, Context
from bench.workloads.produce import REDIS_STREAM, TOPIC
from engine import Admin, PullConsumer, PullStatus, Store
from engine.broker.maintenance import compact
from engine.store import schemas

PULL = 32
GROUP = "bench"
# bare pulls after delta-rs's own optimize.compact read whole large row groups; cap their time
BARE_BUDGET_S = 30.0


def queue_bounds(store: Store) -> dict[int, tuple[int, int]]:
    return {s.queue_id: (s.min_offset, s.max_offset) for s in Admin(store).topic_stats(TOPIC)}


def positions(bounds: dict[int, tuple[int, int]], n: int, seed: int, tail: bool) -> list[tuple[int, int]]:
    """``n`` (queue, offset) pulls of 32: random offsets over every queue, or each queue's last 32."""
    queues = sorted(q for q, (lo, hi) in bounds.items() if hi - lo >= PULL)
    if not queues:
        raise RuntimeError(f"no queue of {TOPIC} holds {PULL} messages")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        q = queues[i % len(queues)] if tail else rng.choice(queues)
        lo, hi = bounds[q]
        out.append((q, hi - PULL if tail else rng.randrange(lo, hi - PULL + 1)))
    return out


def ours_pulls(store: Store, where: list[tuple[int, int]]) -> list[float]:
    consumer = PullConsumer(store, "BenchConsumer")

    def pull(i: int) -> None:
        qid, offset = where[i]
        result = consumer.pull(TOPIC, qid, offset, PULL)
        if result.status is not PullStatus.FOUND or len(result.messages) != PULL:
            raise RuntimeError(f"pull {qid}@{offset} returned {result.status} {len(result.messages)}")

    for q in sorted({q for q, _ in where}):  # the first touch of each queue is not what is measured
        consumer.pull(TOPIC, q, where[0][1] if where[0][0] == q else 0, PULL)
    return timed_ms(pull, len(where))


def bare_pulls(uri: str, where: list[tuple[int, int]]) -> list[float]:
    """The same 32 rows scanned from the bare table: file and row-group pruning on the statistics."""
    dataset = DeltaTable(uri).to_pyarrow_dataset()

    def scan(i: int) -> None:
        qid, offset = where[i]
        flt = (
            (pc.field("topic") == TOPIC)
            & (pc.field("queue_id") == qid)
            & (pc.field("queue_offset") >= offset)
            & (pc.field("queue_offset") < offset + PULL)
        )
        got = dataset.to_table(filter=flt).num_rows
        if got != PULL:
            raise RuntimeError(f"bare scan {qid}@{offset} returned {got} rows")

    scan(0)
    return timed_ms(scan, len(where), budget_s=BARE_BUDGET_S)


def redis_pulls(client: Any, total: int, n: int, seed: int, tail: bool) -> list[float]:
    """XREADGROUP COUNT 32 + XACK after moving the group to the wanted entry (the move is not timed)."""
    rng = random.Random(seed)
    firsts = [total - PULL + 1 if tail else rng.randrange(1, total - PULL + 2) for _ in range(n)]
    samples = []
    for first in firsts:
        client.xgroup_setid(REDIS_STREAM, GROUP, f"{first - 1}-0")
        began = time.perf_counter()
        got = client.xreadgroup(GROUP, "c1", {REDIS_STREAM: ">"}, count=PULL)
        ids = [entry_id for entry_id, _ in got[0][1]]
        client.xack(REDIS_STREAM, GROUP, *ids)
        samples.append((time.perf_counter() - began) * 1000)
        if len(ids) != PULL:
            raise RuntimeError(f"XREADGROUP returned {len(ids)} entries")
    return samples


def file_counts(store: Store) -> dict[str, int]:
    return {name: len(store.snapshot(name).paths()) for name in (schemas.COMMIT_LOG, schemas.CONSUME_QUEUE)}


def _round(ctx: Context, phase: str, redis_random: Measure, redis_tail: Measure) -> list[dict[str, Any]]:
    assert ctx.big_store is not None
    sizes = ctx.sizes
    bounds = queue_bounds(ctx.big_store)
    results = []
    for tail in (False, True):
        where = positions(bounds, sizes.pulls, seed=7 + tail, tail=tail)
        kind = "tail" if tail else "random"
        results.append(
            {
                "id": f"pull_{kind}_{phase}",
                "title": f"Pull 32 from the {sizes.messages:,}-message store, "
                f"{'from the tail' if tail else 'random offsets'}, {phase} compaction",
                "kind": "latency",
                "systems": {
                    OURS: latency(ours_pulls(ctx.big_store, where)),
                    BARE: latency(bare_pulls(ctx.big_bare_uri, where)),
                    REDIS: redis_tail if tail else redis_random,
                },
                "notes": [],
            }
        )
    return results


def pulls(ctx: Context) -> list[dict[str, Any]]:
    """Pull latencies, then compaction (timed), then pull latencies again."""
    assert ctx.big_store is not None
    sizes, store = ctx.sizes, ctx.big_store
    if ctx.redis is None:
        red_random = red_tail = unavailable(ctx.redis_why)
    else:
        ctx.redis.xgroup_create(REDIS_STREAM, GROUP, id="0")
        red_random = latency(redis_pulls(ctx.redis, sizes.messages, sizes.pulls, 7, tail=False))
        red_tail = latency(redis_pulls(ctx.redis, sizes.messages, sizes.pulls, 8, tail=True))
    files_before = file_counts(store)
    before = _round(ctx, "before", red_random, red_tail)
    ctx.log(f"pulls before compaction done; files {files_before}")

    began = time.perf_counter()
    report = compact(store)
    ours_compact_s = time.perf_counter() - began
    files_after = file_counts(store)
    bare_dt = DeltaTable(ctx.big_bare_uri)
    bare_files_before = len(bare_dt.file_uris())
    began = time.perf_counter()
    bare_dt.optimize.compact()
    bare_compact_s = time.perf_counter() - began
    bare_files_after = len(DeltaTable(ctx.big_bare_uri).file_uris())
    ctx.log(
        f"compaction {ours_compact_s:.1f}s (bare optimize.compact {bare_compact_s:.1f}s); files {files_after}"
    )
    after = _round(ctx, "after", red_random, red_tail)

    compaction_note = (
        f"Compaction (`engine.broker.maintenance.compact`, every table) took {ours_compact_s:.1f} s: "
        f"commit_log {files_before[schemas.COMMIT_LOG]} -> {files_after[schemas.COMMIT_LOG]} files, "
        f"consume_queue {files_before[schemas.CONSUME_QUEUE]} -> {files_after[schemas.CONSUME_QUEUE]} files. "
        f"bare delta-rs: `DeltaTable.optimize.compact()` took {bare_compact_s:.1f} s, "
        f"{bare_files_before} -> {bare_files_after} files."
    )
    common = [
        f"{sizes.pulls} pulls of 32 messages ({sizes.body_bytes} B bodies) per row; lakemq: "
        "`PullConsumer.pull` (consume-queue lookup, then commit-log rows by physical offset, as "
        "`MessageExt` objects).",
        "bare delta-rs: one pyarrow scan of the same 32 rows from a table holding the same commit-log rows "
        "(`DeltaTable.to_pyarrow_dataset()` opened once, filter on topic, queue_id, queue_offset; "
        "no index, no Python objects). delta-rs prunes files by their statistics, but its writer puts a "
        "whole write (here 4096 rows, ~4 MiB) in one Parquet row group, and `optimize.compact()` one row "
        "group per output file, so each scan reads and decodes far more than 32 rows; lakemq's sequencer "
        "writes 256-row row groups, its compaction keeps them, and its pulls reuse cached file statistics "
        "and footers. So this naive scan is not a lower bound: lakemq beats it.",
        "Redis: one stream holding the same messages; XREADGROUP COUNT 32 + XACK, after XGROUP SETID "
        "to the wanted entry (not timed). Redis keeps everything in memory, so it has no compaction; "
        "the same Redis figures appear before and after.",
    ]
    for result in before:
        result["notes"] = common
    for result in after:
        result["notes"] = [*common, compaction_note]
    ctx.extra["compaction"] = {
        "seconds": round(ours_compact_s, 2),
        "files_before": files_before,
        "files_after": files_after,
        "bare_seconds": round(bare_compact_s, 2),
        "bare_files": [bare_files_before, bare_files_after],
        "report": {k: dict(v) for k, v in report.items()},
    }
    return before + after
