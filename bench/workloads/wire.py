"""RocketMQ's wire protocol: the same unmodified Java client against lakemq's ``mq serve`` and against
the real Apache RocketMQ broker, in the same run.

The client is the harness's ``bench`` scenario (``tests/java/harness``, rocketmq-client 4.9.8): sync
sends of 1 KiB from ``wire_threads`` threads (each send's latency), then batches of 32 from the same
threads, then one push consumer reading every message back. RocketMQ (name server and broker from
Maven, 512 MiB heap, async flush) runs first and is stopped before lakemq starts, so the two never
share the CPU; before each, what the page cache holds dirty is written back and the caches are
dropped (:func:`~bench.machine.settle_disk`), so neither pays for the other's writes nor for the
memory state earlier steps left, and what a new file costs the CPU then is read
(:func:`~bench.machine.file_create_us`: on the bench machine it varies thirtyfold with that state).
The pair runs ``wire_rounds`` times in turn (3 in the full run) and each figure is the median of
its runs (:func:`~bench.stats.median_measure`): on the bench machine, runs of lakemq's side alone
minutes apart gave 443-651 sync sends/s and 7,953-13,927 batched msg/s (2026-11-30).

* ``wire_sync``: latency of one synchronous send; ``wire_sync_rate``: those sends' throughput;
* ``wire_batch``: batched sends' throughput; ``wire_consume``: the push consumer's throughput.

Each phase's CPU time per 1,000 messages is kept beside its rate, for the server (``mq serve`` and
its broker process; RocketMQ's name server and broker) and for the client's JVM: the client and the
server share the machine's cores, so what a message costs them bounds the rate either can reach,
whatever the machine's speed that day (:func:`bench.stats.cpu_ceiling`). So is what everything else
on the machine spent meanwhile, and what the hypervisor took from its cores (steal): a phase that
ran slower than its CPU says was slowed by them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.java_harness import HarnessError, ScenarioRun, harness_classpath, start_scenario
from bench.lakemq_server import LakemqServer
from bench.machine import cpu_seconds, file_create_us, machine_cpu_seconds, settle_disk
from bench.rocketmq_peer import RocketMQPeer
from bench.stats import Measure, latency, median_measure, rate, unavailable
from bench.workloads import OURS, ROCKETMQ, Context
from bench.workloads.produce import open_store
from engine import Admin
from engine.store.delta.log import probe_latest_version
from engine.store.schemas import COMMIT_LOG

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


PHASE_RATES = {"sync": "wire_sync_rate", "batch": "wire_batch", "consume": "wire_consume"}
"""Each phase of the scenario and the workload that carries its rate (and its CPU)."""

CPU_POLL_S = 0.01
"""How often the run looks for the end of a phase, to read the CPU time spent until then."""


class CpuMark(NamedTuple):
    """CPU seconds spent so far by the server's processes and by the client's (None: not readable),
    by the whole machine, and taken from it by the hypervisor (:func:`machine_cpu_seconds`)."""

    server: float | None
    client: float | None
    machine: float
    steal: float
    commits: int | None = None  # the server's commits so far (lakemq: the commit log's version)


def cpu_mark(
    server_pids: Sequence[int], client_pids: Sequence[int], commits: Callable[[], int | None] | None = None
) -> CpuMark:
    """The CPU spent so far by the server, the client and the machine (and, given ``commits``, the
    server's commits so far)."""
    spent = (cpu_seconds(server_pids), cpu_seconds(client_pids), *machine_cpu_seconds())
    return CpuMark(*spent, commits=None if commits is None else commits())


def commit_log_version(store_root: Path) -> Callable[[], int | None]:
    """How many commits a local store's commit log has had so far (its latest version), read from
    its commit files: a group commit holds as many sends as reached the server meanwhile, so the
    messages per commit of a phase tell how the server grouped its clients' sends."""
    uri = str(store_root / COMMIT_LOG)
    return lambda: probe_latest_version(uri)


def _cpu_per_1k(before: CpuMark | None, after: CpuMark | None, messages: int) -> dict[str, float]:
    """The CPU per 1,000 messages between two marks: the server's and the client's when read at
    both, the rest of the machine's (everything else that ran meanwhile) when both were, and the
    time the hypervisor stole."""
    if before is None or after is None or messages <= 0:
        return {}

    def per_1k(seconds: float) -> float:
        return round(seconds * 1_000_000 / messages, 1)

    out: dict[str, float] = {"steal_ms_1k": per_1k(after.steal - before.steal)}
    spent = {}
    for side in ("server", "client"):
        start, end = getattr(before, side), getattr(after, side)
        if start is not None and end is not None:
            spent[side] = end - start
            out[f"{side}_cpu_ms_1k"] = per_1k(spent[side])
    if len(spent) == 2:
        out["others_cpu_ms_1k"] = per_1k(max(after.machine - before.machine - sum(spent.values()), 0.0))
    if before.commits is not None and after.commits is not None and after.commits > before.commits:
        out["messages_per_commit"] = round(messages / (after.commits - before.commits), 1)
    return out


def measures(events: list[dict[str, Any]], cpu: Mapping[int, CpuMark] | None = None) -> dict[str, Measure]:
    """The four measures of one system from the bench scenario's ``phase`` events; ``cpu`` holds
    the CPU read at the scenario's start (0), once its warm-up is done and the first phase starts
    (1), and at the end of each phase (2, 3, …): :func:`run_with_cpu`'s marks."""
    phase_events = [e for e in events if e.get("event") == "phase"]
    phases = {e["phase"]: e for e in phase_events}
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
    for index, event in enumerate(phase_events, start=1):
        workload = PHASE_RATES.get(event["phase"])
        if workload is not None and cpu is not None:
            out[workload].update(_cpu_per_1k(cpu.get(index), cpu.get(index + 1), event["messages"]))
    missing = consume["expected"] - consume["messages"]
    if missing > 0:
        out["wire_consume"]["missing"] = missing
    if failures:
        for key in ("wire_sync", "wire_sync_rate", "wire_batch"):
            out[key]["failures"] = failures
    return out


def run_with_cpu(
    classpath: str,
    log_dir: Path,
    server_pids: Sequence[int],
    timeout_s: float,
    commits: Callable[[], int | None] | None = None,
    **opts: object,
) -> tuple[ScenarioRun, dict[int, CpuMark]]:
    """Run the ``bench`` scenario, reading the CPU of the server's processes and of the client (and
    the server's ``commits``, when given) at its start (mark 0), at the end of its warm-up (mark 1,
    its ``warm`` event) and as each phase ends (mark n + 1 at the n-th ``phase`` event)."""
    scenario = start_scenario(classpath, log_dir, "bench", **opts)
    client = [scenario.proc.pid]
    marks = {0: cpu_mark(server_pids, client, commits)}
    deadline = time.monotonic() + timeout_s
    while scenario.proc.poll() is None and time.monotonic() < deadline:
        ended = scenario.count("warm") + scenario.count("phase")
        if ended not in marks:  # (two ends within one poll: the first has no mark)
            marks[ended] = cpu_mark(server_pids, client, commits)
        time.sleep(CPU_POLL_S)
    return scenario.finish(max(deadline - time.monotonic(), 1)), marks


def _bench(
    ctx: Context,
    classpath: str,
    namesrv: str,
    log_dir: Path,
    server_pids: Sequence[int],
    commits: Callable[[], int | None] | None = None,
) -> dict[str, Measure]:
    s = ctx.sizes
    run, cpu = run_with_cpu(
        classpath, log_dir, server_pids, 1800, commits, namesrv=namesrv, topic=TOPIC, group=GROUP,
        threads=s.wire_threads, sync_messages=s.wire_sync_messages, batch_messages=s.wire_batch_messages,
        batch_size=BATCH, body_bytes=s.body_bytes, consume_timeout_ms=600_000,
    )  # fmt: skip
    if run.returncode != 0:
        raise HarnessError(f"bench scenario exit code {run.returncode}: {run.stderr[-2000:]}")
    return measures(list(run.events), cpu)


def _rocketmq(ctx: Context, classpath: str, run: Path) -> tuple[dict[str, Measure], str]:
    with RocketMQPeer(run / "rocketmq") as peer:
        if not peer.namesrv:
            return {w[0]: unavailable(f"RocketMQ did not start: {peer.why[:200]}") for w in WORKLOADS}, ""
        try:
            peer.create_topic(TOPIC, QUEUES)
            measured = _bench(ctx, classpath, peer.namesrv, run / "rocketmq-client", peer.pids)
            return measured, peer.version
        except HarnessError as exc:
            return {
                w[0]: unavailable(f"RocketMQ run failed: {str(exc)[:200]}") for w in WORKLOADS
            }, peer.version


def _lakemq(ctx: Context, classpath: str, run: Path) -> dict[str, Measure]:
    root = run / "wire-store"
    Admin(open_store(root)).create_topic(TOPIC, QUEUES)
    with LakemqServer(root, run / "wire-serve.log") as server:
        if not server.namesrv:
            raise HarnessError(server.why)
        client_dir = run / "lakemq-client"
        return _bench(ctx, classpath, server.namesrv, client_dir, server.pids, commit_log_version(root))


def wire(ctx: Context) -> list[dict[str, Any]]:
    """The four wire workloads, lakemq and the real RocketMQ side by side."""
    classpath = harness_classpath()
    s = ctx.sizes
    create_us: dict[str, list[float]] = {ROCKETMQ: [], OURS: []}
    runs: dict[str, list[dict[str, Measure]]] = {ROCKETMQ: [], OURS: []}
    version = ""

    def settle(system: str) -> None:
        took = settle_disk()
        create_us[system].append(file_create_us(ctx.workdir))
        cost = create_us[system][-1]
        ctx.log(f"disk settled before {system} in {took:.1f} s; a new file: {cost} us of CPU")

    for round_no in range(1, s.wire_rounds + 1):
        run = ctx.workdir / f"wire-{round_no}"  # each round from nothing: new stores, new logs
        settle(ROCKETMQ)
        theirs, started = _rocketmq(ctx, classpath, run)
        version = version or started
        runs[ROCKETMQ].append(theirs)
        ctx.log(f"round {round_no}: RocketMQ {started}: {theirs}")
        settle(OURS)
        runs[OURS].append(_lakemq(ctx, classpath, run))
        ctx.log(f"round {round_no}: lakemq mq serve: {runs[OURS][-1]}")
    ours, theirs = (
        {wid: median_measure([run[wid] for run in runs[side]]) for wid, _, _ in WORKLOADS}
        for side in (OURS, ROCKETMQ)
    )
    ctx.extra["rocketmq_broker"] = version or "not available"
    ctx.extra["wire_file_create_us"] = {side: statistics.median(us) for side, us in create_us.items()}
    note = (
        "Apache RocketMQ's Java client (rocketmq-client 4.9.8, unmodified) in one JVM, "
        f"{s.wire_threads} sending threads, {s.wire_sync_messages:,} sync sends then "
        f"{s.wire_batch_messages:,} messages in batches of {BATCH}, {s.body_bytes} B bodies, RocketMQ then "
        f"lakemq {s.wire_rounds} time(s) in turn, each figure the median of the runs; lakemq is "
        "`mq serve` with its in-process broker loop over a local store; RocketMQ is the real name server "
        f"and broker {version or '(not available)'} started from Maven (512 MiB heap, async flush), not "
        "sharing the CPU with lakemq; before each, the page cache's dirty pages are written back and the "
        "caches dropped."
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
