"""Many producer processes appending to one store at once: throughput, fairness, lost races.

Each writer is its own (spawned) process with its own :class:`~engine.Producer`; all warm up (tables
opened, one send), start together and make ``sends`` synchronous sends of ``batch`` 1 KiB messages
(``send`` when ``batch`` is 1, ``send_batch`` otherwise). Without the host lock
(``MQ_SEQUENCER_LOCK=0``: writers on different hosts) only the optimistic protocol sequences them.

Reported per run: writers, host lock on/off, commit-log shards, aggregate msg/s (all messages over
the wall time from the first send to the last acknowledgement), the p50 / p99 / max latency of one
send (the max is the longest any writer waited), lost races (``CommitLogWriter.conflicts``) and
sends that gave up with ``CommitConflictError``.

Workloads of the benchmark step (``contention``): ``contention_1`` (one writer), ``contention_racing``
and ``contention_queued`` (8 writers without and with the host lock; target: none gives up without
it) and ``contention_shards`` (8 writers without the
lock on 4 shards; target: >= 2.5x one shard's msg/s, none gives up).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import percentile, rate
from bench.workloads import OURS, Context
from engine import EngineConfig

TOPIC = "Contention"
QUEUES = 8
BODY = 1024
SHARDED = 4  # shards of the sharded run (the target)


def _config(root: str, shards: int) -> EngineConfig:
    return EngineConfig(store=root, commit_log_shards=shards)


def _writer(
    root: str,
    worker: int,
    sends: int,
    batch: int,
    lock: bool,
    shards: int,
    ready: Any,
    start: Any,
    out: Any,
    storage: dict[str, str] | None = None,
) -> None:
    os.environ["MQ_SEQUENCER_LOCK"] = "1" if lock else "0"
    try:
        result = _writes(root, worker, sends, batch, shards, ready, start, storage)
    except Exception as exc:  # the parent reports it instead of waiting for a writer that is gone
        why = f"writer {worker}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        ready.put(why)
        out.put({"error": why})
        return
    out.put(result)


def _writes(
    root: str,
    worker: int,
    sends: int,
    batch: int,
    shards: int,
    ready: Any,
    start: Any,
    storage: dict[str, str] | None,
) -> dict[str, Any]:
    from engine import CommitConflictError, Message, Producer, Store

    store = Store.open(root, storage_options=storage, config=_config(root, shards))
    body = os.urandom(BODY)
    latencies: list[float] = []
    gave_up = failed = 0
    first_failure = ""
    with Producer(store) as producer:
        producer.send(Message(TOPIC, body))  # warm-up: tables opened, topic cached
        ready.put(worker)
        start.wait()
        began, cpu = time.time(), time.process_time()
        for i in range(sends):
            t = time.perf_counter()
            try:
                if batch == 1:
                    producer.send(Message(TOPIC, body, keys=(f"w{worker}-{i}",)))
                else:
                    producer.send_batch(
                        [Message(TOPIC, body, keys=(f"w{worker}-{i}-{j}",)) for j in range(batch)]
                    )
            except CommitConflictError:
                gave_up += 1
            except Exception as exc:  # any other refusal is counted, not fatal: the run goes on
                failed += 1
                first_failure = first_failure or f"{type(exc).__name__}: {str(exc)[:200]}"
            latencies.append((time.perf_counter() - t) * 1000)
        ended, cpu = time.time(), time.process_time() - cpu
        conflicts = producer.lost_races
    return {
        "began": began,
        "ended": ended,
        "cpu": cpu,
        "lat": latencies,
        "gave_up": gave_up,
        "conflicts": conflicts,
        "failed": failed,
        "first_failure": first_failure,
    }


def _collect(box: Any, procs: list[Any], count: int, timeout_s: float) -> list[Any]:
    """``count`` items from ``box``; raises when a writer reported an error, died, or time ran out."""
    items: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(items) < count:
        try:
            item = box.get(timeout=2)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{len(dead)} writer process(es) died (exit code {dead[0]})") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"the writers took over {timeout_s:.0f} s") from None
            continue
        if isinstance(item, str) or (isinstance(item, dict) and "error" in item):
            raise RuntimeError(item if isinstance(item, str) else item["error"])
        items.append(item)
    return items


def run(
    writers: int,
    sends: int,
    batch: int = 1,
    *,
    lock: bool,
    shards: int = 1,
    workdir: Path | None = None,
    root: str | None = None,
    storage: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One contention run; the measure (see the module docstring).

    The store is fresh: under ``workdir`` (removed after), or at ``root`` (an object-store URI
    with its ``storage`` options, left for the caller to drop).
    """
    from engine import Admin, Store

    scratch = None if root else Path(tempfile.mkdtemp(prefix="lakemq-contention-", dir=workdir))
    try:
        root = root or str(Path(str(scratch)) / "store")
        store = Store.open(root, storage_options=storage, config=_config(root, shards))
        Admin(store).create_topic(TOPIC, QUEUES)
        ctx = mp.get_context("spawn")
        ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(
                target=_writer, args=(root, w, sends, batch, lock, shards, ready, start, out, storage)
            )
            for w in range(writers)
        ]
        for p in procs:
            p.start()
        try:
            _collect(ready, procs, len(procs), 300)
            start.set()
            results = _collect(out, procs, len(procs), 1800)
        except BaseException:
            for p in procs:  # a writer that never got the start signal would wait for ever
                p.kill()
            raise
        finally:
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    lat = [x for r in results for x in r["lat"]]
    failures = sum(r["failed"] for r in results)
    wall = max(r["ended"] for r in results) - min(r["began"] for r in results)
    return {
        **rate((writers * sends - failures) * batch, wall),
        "writers": writers,
        "lock": lock,
        "shards": shards,
        "p50_ms": round(percentile(lat, 50), 1),
        "p99_ms": round(percentile(lat, 99), 1),
        "max_ms": round(max(lat), 1),
        "conflicts": sum(r["conflicts"] for r in results),
        "gave_up": sum(r["gave_up"] for r in results),
        "failures": failures,
        "first_failure": next((r["first_failure"] for r in results if r["first_failure"]), ""),
        # the writers' CPU per message, and the cores they kept busy on average
        "cpu_ms": round(sum(r["cpu"] for r in results) * 1000 / max(writers * sends * batch, 1), 1),
        "cores": round(sum(r["cpu"] for r in results) / max(wall, 1e-9), 2),
    }


def describe(measure: dict[str, Any]) -> str:
    """One run in words, for the report's notes."""
    return (
        f"{measure['writers']} writer{'s' if measure['writers'] != 1 else ''}, "
        f"host lock {'on' if measure['lock'] else 'off'}, "
        f"{measure['shards']} shard{'s' if measure['shards'] != 1 else ''}: {measure['msg_s']:,} msg/s, "
        f"send p50 {measure['p50_ms']} ms / p99 {measure['p99_ms']} ms / max {measure['max_ms']} ms, "
        f"{measure['conflicts']} lost races, {measure['gave_up']} gave up, "
        + (f"{measure['failures']} failed ({measure['first_failure']}), " if measure.get("failures") else "")
        + f"{measure['cpu_ms']} ms of writer CPU per message ({measure['cores']} cores busy)."
    )


def _workload(wid: str, title: str, measure: dict[str, Any], sends: int, *notes: str) -> dict[str, Any]:
    return {
        "id": wid,
        "title": title,
        "kind": "rate",
        "systems": {OURS: measure},
        "notes": [
            f"{measure['writers']} spawned processes x {sends} synchronous sends of one {BODY} B message "
            f"to {QUEUES} queues, started together.",
            describe(measure),
            *notes,
        ],
    }


def contention(ctx: Context) -> list[dict[str, Any]]:
    """The benchmark step: 1 writer, 8 without and with the host lock, 8 without it on 4 shards."""
    sends, many = ctx.sizes.contention_sends, ctx.sizes.contention_writers
    one = run(1, sends, lock=False, workdir=ctx.workdir)
    ctx.log(describe(one))
    racing = run(many, sends, lock=False, workdir=ctx.workdir)
    ctx.log(describe(racing))
    queued = run(many, sends, lock=True, workdir=ctx.workdir)
    ctx.log(describe(queued))
    results = [
        _workload("contention_1", "Contention: one writer process", one, sends),
        _workload(
            "contention_racing",
            f"Contention: {many} writer processes without the host lock, one shard",
            racing,
            sends,
            "Only the optimistic protocol sequences them (writers on different hosts).",
        ),
        _workload(
            "contention_queued",
            f"Contention: {many} writer processes with the host lock",
            queued,
            sends,
        ),
    ]
    sharded = run(many, sends, lock=False, shards=SHARDED, workdir=ctx.workdir)
    ctx.log(describe(sharded))
    sharded["x_one_shard"] = round(sharded["msg_s"] / max(racing["msg_s"], 1), 2)
    results.append(
        _workload(
            "contention_shards",
            f"Contention: {many} writer processes without the host lock, {SHARDED} shards",
            sharded,
            sends,
            f"{sharded['x_one_shard']:.2f}x the msg/s of one shard in the same run.",
        )
    )
    return results
