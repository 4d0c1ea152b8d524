"""RocketMQ's wire protocol: the same unmodified Java client against lakemq's ``mq serve`` and against
the real Apache RocketMQ broker, in the same run.

The client is the harness's ``bench`` scenario (``tests/java/harness``, rocketmq-client 4.9.8): sync
sends of 1 KiB from ``wire_threads`` threads (each send's latency), then batches of 32 from the same
threads, then one push consumer reading every message back. RocketMQ (name server and broker from
Maven, 512 MiB heap, async flush) runs first and is stopped before lakemq starts, so the two never
share the CPU; before each, what the page cache holds dirty is written back
(:func:`~bench.machine.settle_disk`), so neither pays for the other's writes.

* ``wire_sync``: latency of one synchronous send; ``wire_sync_rate``: those sends' throughput;
* ``wire_batch``: batched sends' throughput; ``wire_consume``: the push consumer's throughput.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.java_harness import HarnessError, harness_classpath, run_scenario
from bench.lakemq_server import LakemqServer
from bench.machine import settle_disk
from bench.rocketmq_peer import RocketMQPeer
from bench.stats import Measure, latency, rate, unavailable
from bench.workloads import OURS, ROCKETMQ, Context
from bench.workloads.produce import open_store
from engine import Admin

TOPIC = "WireBench"
GROUP = "WireBenchGroup"
QUEUES = 4
BATCH = 32
WORKLOADS = (
    ("wire_sync", "RocketMQ Java client: one synchronous send, 1 KiB", "latency"),
    ("wire_sync_rate", "RocketMQ Java client: synchronous sends from several threads", "rate"),
    ("wire_batch", f"RocketMQ Java client: batches of {BATCH} (1 KiB each)", "rate"),
    ("wire_consume", "RocketMQ Java client: DefaultMQPushConsumer reading everything back", "rate"),
)


def measures(events: list[dict[str, Any]]) -> dict[str, Measure]:
    """The four measures of one system from the bench scenario's ``phase`` events."""
    phases = {e["phase"]: e for e in events if e.get("event") == "phase"}
    out: dict[str, Measure] = {}
    sync, batch, consume = phases.get("sync"), phases.get("batch"), phases.get("consume")
    if sync is None or batch is None or consume is None:
        why = "the bench scenario did not report every phase"
        return {w[0]: unavailable(why) for w in WORKLOADS}
    failures = sync["failures"] + batch["failures"]
    out["wire_sync"] = latency(sync["latencies_ms"])
    out["wire_sync_rate"] = rate(sync["messages"], sync["seconds"])
    out["wire_batch"] = rate(batch["messages"], batch["seconds"])
    out["wire_consume"] = rate(consume["messages"], consume["seconds"])
    missing = consume["expected"] - consume["messages"]
    if missing > 0:
        out["wire_consume"]["missing"] = missing
    if failures:
        for key in ("wire_sync", "wire_sync_rate", "wire_batch"):
            out[key]["failures"] = failures
    return out


def _bench(ctx: Context, classpath: str, namesrv: str, log_dir: Path) -> dict[str, Measure]:
    s = ctx.sizes
    run = run_scenario(
        classpath, log_dir, "bench", timeout_s=1800, namesrv=namesrv, topic=TOPIC, group=GROUP,
        threads=s.wire_threads, sync_messages=s.wire_sync_messages, batch_messages=s.wire_batch_messages,
        batch_size=BATCH, body_bytes=s.body_bytes, consume_timeout_ms=600_000,
    )  # fmt: skip
    if run.returncode != 0:
        raise HarnessError(f"bench scenario exit code {run.returncode}: {run.stderr[-2000:]}")
    return measures(list(run.events))


def _rocketmq(ctx: Context, classpath: str) -> tuple[dict[str, Measure], str]:
    with RocketMQPeer(ctx.workdir / "rocketmq") as peer:
        if not peer.namesrv:
            return {w[0]: unavailable(f"RocketMQ did not start: {peer.why[:200]}") for w in WORKLOADS}, ""
        try:
            peer.create_topic(TOPIC, QUEUES)
            return _bench(ctx, classpath, peer.namesrv, ctx.workdir / "rocketmq-client"), peer.version
        except HarnessError as exc:
            return {
                w[0]: unavailable(f"RocketMQ run failed: {str(exc)[:200]}") for w in WORKLOADS
            }, peer.version


def _lakemq(ctx: Context, classpath: str) -> dict[str, Measure]:
    root = ctx.workdir / "wire-store"
    Admin(open_store(root)).create_topic(TOPIC, QUEUES)
    with LakemqServer(root, ctx.workdir / "wire-serve.log") as server:
        if not server.namesrv:
            raise HarnessError(server.why)
        return _bench(ctx, classpath, server.namesrv, ctx.workdir / "lakemq-client")


def wire(ctx: Context) -> list[dict[str, Any]]:
    """The four wire workloads, lakemq and the real RocketMQ side by side."""
    classpath = harness_classpath()
    ctx.log(f"disk settled before RocketMQ in {settle_disk():.1f} s")
    theirs, version = _rocketmq(ctx, classpath)
    ctx.log(f"RocketMQ {version}: {theirs}")
    ctx.log(f"disk settled before lakemq in {settle_disk():.1f} s")
    ours = _lakemq(ctx, classpath)
    ctx.log(f"lakemq mq serve: {ours}")
    ctx.extra["rocketmq_broker"] = version or "not available"
    s = ctx.sizes
    note = (
        "Apache RocketMQ's Java client (rocketmq-client 4.9.8, unmodified) in one JVM, "
        f"{s.wire_threads} sending threads, {s.wire_sync_messages:,} sync sends then "
        f"{s.wire_batch_messages:,} messages in batches of {BATCH}, {s.body_bytes} B bodies; lakemq is "
        "`mq serve` with its in-process broker loop over a local store; RocketMQ is the real name server "
        f"and broker {version or '(not available)'} started from Maven (512 MiB heap, async flush), not "
        "sharing the CPU with lakemq; the page cache's dirty pages are written back before each."
    )
    return [
        {
            "id": wid,
            "title": title,
            "kind": kind,
            "systems": {OURS: ours[wid], ROCKETMQ: theirs[wid]},
            "notes": [note],
        }
        for wid, title, kind in WORKLOADS
    ]
