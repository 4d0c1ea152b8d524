"""Latency through the running broker: end to end (send -> first pull that returns the message) and
delayed-delivery lateness (first pull - deliver time), with the real Spark broker jobs running.

The broker is ``jobs/broker.py --jobs dispatch,schedule`` started as a subprocess (its own Spark
application, as in production); messages are sent at a steady rate from one thread while the
measuring thread long-polls. The peers run before the broker starts, so they do not share the CPU
with it: Redis with XADD -> XREADGROUP BLOCK, and for delays the usual Redis pattern (a ZSET scored
by deliver time, moved to the stream by a poll loop); bare delta-rs with one-row commits followed by
a reader polling the table's version.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from bench.stats import Measure, latency, unavailable
from bench.workloads import BARE, OURS, REDIS, Context
from bench.workloads.produce import open_store
from engine import Admin, Message, Producer, PullConsumer, PullStatus

ROOT = Path(__file__).resolve().parents[2]
E2E_TOPIC = "E2E"
DELAY_TOPIC = "Delayed"
BROKER_JOBS = "dispatch,schedule"
READY_TIMEOUT_S = 300.0
SETTLE_S = 20.0  # after the last send: how long a message may still arrive
TIMER_AHEAD_MS = 3000  # timer messages are due this far ahead of their send
DELAY_LEVEL = 1  # every third delayed message uses delay level 1 (1 s) instead of a timer
REDIS_SCHEDULER_POLL_S = 0.1
BARE_POLL_S = 0.02  # as the pull's long_poll_interval_ms
PROBE = 2**62


def now_ms() -> float:
    return time.time() * 1000


def encode(seq: int, body_bytes: int) -> bytes:
    return seq.to_bytes(8, "big") + os.urandom(max(0, body_bytes - 8))


def decode(body: bytes) -> int:
    return int.from_bytes(body[:8], "big")


def drive(
    count: int, rate: float, send: Callable[[int], float], poll: Callable[[], Iterable[int]], settle_s: float
) -> tuple[list[float], dict[int, float]]:
    """Send ``count`` messages at ``rate``/s from a thread while polling here.

    ``send(i)`` sends message i and returns its reference time (epoch ms: the send, or the due
    time); ``poll()`` blocks briefly and returns the sequence numbers that became visible.

    Returns:
        (reference time of each message, first time each sequence number was seen)
    """
    refs = [math.nan] * count
    seen: dict[int, float] = {}
    errors: list[BaseException] = []

    def sender() -> None:
        began = time.monotonic()
        for i in range(count):
            wait = began + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                refs[i] = send(i)
            except BaseException as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=sender, name="bench-sender", daemon=True)
    thread.start()
    deadline: float | None = None
    while len(seen) < count:
        got = list(poll())
        at = now_ms()
        for seq in got:
            seen.setdefault(seq, at)
        if not thread.is_alive():
            if errors:
                raise errors[0]
            deadline = deadline or time.monotonic() + settle_s
            if time.monotonic() > deadline:
                break
    thread.join()
    return refs, seen


def delays_of(refs: list[float], seen: dict[int, float]) -> Measure:
    samples = [seen[i] - ref for i, ref in enumerate(refs) if i in seen]
    measure = latency(samples)
    missing = len(refs) - len(samples)
    if missing:
        measure["missing"] = missing
    return measure


# ----------------------------------------------------------------------------- lakemq
class Broker:
    """``jobs/broker.py`` running as its own process (and Spark application) until stopped."""

    def __init__(
        self,
        store_path: Path | str,
        log_path: Path,
        jobs: str = BROKER_JOBS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.store_path, self.log_path, self.jobs = store_path, log_path, jobs
        self.env = dict(env or {})  # e.g. MQ_STORAGE_<KEY> for an object-store root: never on argv
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Broker:
        env = {**os.environ, **self.env}
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        env.setdefault("SPARK_CONF_DIR", str(ROOT / "conf"))
        cmd = [sys.executable, str(ROOT / "jobs" / "broker.py"), "--store", str(self.store_path)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [*cmd, "--jobs", self.jobs],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: the JVM it starts is stopped with it
            )
        return self

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"the broker exited with {self.proc.returncode}:\n" + "\n".join(tail))

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        # Whatever is left of its group (the JVM), by the group id this run created.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None


def dispatch_batches(store_path: Path) -> int:
    """Micro-batches the running dispatch job has finished (from its ``_status`` file)."""
    try:
        status = json.loads((store_path / "_status" / "dispatch.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(status.get("batches") or 0)


class QueueFollower:
    """Long-polls queue 0 of a topic from an offset; returns the sequence numbers it sees."""

    def __init__(self, consumer: PullConsumer, topic: str) -> None:
        self.consumer, self.topic, self.offset = consumer, topic, 0

    def poll(self) -> list[int]:
        result = self.consumer.pull(self.topic, 0, self.offset, 32, suspend_ms=500)
        if result.status is PullStatus.OFFSET_ILLEGAL:
            raise RuntimeError(f"{self.topic} pull at {self.offset}: {result}")
        self.offset = result.next_begin_offset
        return [decode(m.body) for m in result.messages]

    def wait_for(self, seq: int, timeout_s: float, check: Callable[[], None]) -> float:
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            check()
            if seq in self.poll():
                return time.monotonic() - began
        raise RuntimeError(f"the probe message never became pullable from {self.topic} in {timeout_s:.0f} s")


def ours(ctx: Context) -> tuple[Measure, Measure, dict[str, Any]]:
    sizes = ctx.sizes
    store = open_store(ctx.workdir / "flow")
    admin = Admin(store)
    admin.create_topic(E2E_TOPIC, 1)
    admin.create_topic(DELAY_TOPIC, 1)
    info: dict[str, Any] = {}
    e2e_count = max(1, int(sizes.e2e_seconds * sizes.e2e_rate))
    delay_count = max(1, int(sizes.delayed_seconds * sizes.delayed_rate))
    with (
        Broker(ctx.workdir / "flow", ctx.workdir / "broker.log") as broker,
        Producer(store, "Flow") as producer,
    ):
        e2e = QueueFollower(PullConsumer(store, "FlowE2E"), E2E_TOPIC)
        delayed = QueueFollower(PullConsumer(store, "FlowDelay"), DELAY_TOPIC)
        began = time.monotonic()
        producer.send(Message(E2E_TOPIC, encode(PROBE, 64)), queue_id=0)
        e2e.wait_for(PROBE, READY_TIMEOUT_S, broker.check)
        producer.send(Message(DELAY_TOPIC, encode(PROBE, 64)), queue_id=0, delay_level=DELAY_LEVEL)
        delayed.wait_for(PROBE, READY_TIMEOUT_S, broker.check)
        info["broker_ready_s"] = round(time.monotonic() - began, 1)
        ctx.log(f"broker ready after {info['broker_ready_s']} s")

        def send_e2e(i: int) -> float:
            at = now_ms()
            producer.send(Message(E2E_TOPIC, encode(i, sizes.body_bytes)), queue_id=0)
            return at

        def e2e_poll() -> list[int]:
            broker.check()
            return e2e.poll()

        batches_before, window_began = dispatch_batches(ctx.workdir / "flow"), time.monotonic()
        e2e_measure = delays_of(*drive(e2e_count, sizes.e2e_rate, send_e2e, e2e_poll, SETTLE_S))
        batches = dispatch_batches(ctx.workdir / "flow") - batches_before
        if batches > 0:
            info["dispatch_batch_interval_ms"] = round((time.monotonic() - window_began) * 1000 / batches)
        ctx.log(f"end to end: {e2e_measure}")

        def send_delayed(i: int) -> float:
            at = now_ms()
            body = encode(i, sizes.body_bytes)
            if i % 3 == 0:
                producer.send(Message(DELAY_TOPIC, body), queue_id=0, delay_level=DELAY_LEVEL)
                return at + 1000 * DELAY_LEVEL  # born is stamped a moment after ``at``
            due = int(at) + TIMER_AHEAD_MS
            producer.send(Message(DELAY_TOPIC, body, deliver_at_ms=due), queue_id=0)
            return float(due)

        def delayed_poll() -> list[int]:
            broker.check()
            return delayed.poll()

        delay_measure = delays_of(
            *drive(delay_count, sizes.delayed_rate, send_delayed, delayed_poll, SETTLE_S)
        )
        ctx.log(f"delayed lateness: {delay_measure}")
    return e2e_measure, delay_measure, info


# ----------------------------------------------------------------------------- Redis
MOVE_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 500)
for _, member in ipairs(due) do
    redis.call('XADD', KEYS[2], '*', 'body', member)
    redis.call('ZREM', KEYS[1], member)
end
return #due
"""


def _redis_reader(client: Any, stream: str) -> Callable[[], list[int]]:
    client.delete(stream)
    client.xgroup_create(stream, "g", id="0", mkstream=True)

    def poll() -> list[int]:
        got = client.xreadgroup("g", "c", {stream: ">"}, count=32, block=500)
        if not got:
            return []
        entries = got[0][1]
        client.xack(stream, "g", *[entry_id for entry_id, _ in entries])
        return [decode(fields[b"body"]) for _, fields in entries]

    return poll


def redis(ctx: Context) -> tuple[Measure, Measure]:
    import redis as redis_py

    sizes, client = ctx.sizes, ctx.redis
    reader = redis_py.Redis(connection_pool=client.connection_pool)
    e2e_count = max(1, int(sizes.e2e_seconds * sizes.e2e_rate))
    delay_count = max(1, int(sizes.delayed_seconds * sizes.delayed_rate))

    def send_e2e(i: int) -> float:
        at = now_ms()
        client.xadd("e2e", {"body": encode(i, sizes.body_bytes)})
        return at

    e2e_measure = delays_of(
        *drive(e2e_count, sizes.e2e_rate, send_e2e, _redis_reader(reader, "e2e"), SETTLE_S)
    )

    move = client.register_script(MOVE_DUE)
    stop = threading.Event()

    def scheduler() -> None:
        scheduler_client = redis_py.Redis(connection_pool=client.connection_pool)
        while not stop.is_set():
            move(keys=["delayed", "delivered"], args=[int(now_ms())], client=scheduler_client)
            stop.wait(REDIS_SCHEDULER_POLL_S)

    def send_delayed(i: int) -> float:
        at = now_ms()
        due = at + (1000 * DELAY_LEVEL if i % 3 == 0 else TIMER_AHEAD_MS)
        client.zadd("delayed", {encode(i, sizes.body_bytes): int(due)})
        return float(int(due))

    client.delete("delayed")
    poll = _redis_reader(reader, "delivered")
    thread = threading.Thread(target=scheduler, name="bench-redis-scheduler", daemon=True)
    thread.start()
    try:
        delay_measure = delays_of(*drive(delay_count, sizes.delayed_rate, send_delayed, poll, SETTLE_S))
    finally:
        stop.set()
        thread.join(timeout=10)
    for key in ("e2e", "delayed", "delivered"):
        client.delete(key)
    return e2e_measure, delay_measure


# ----------------------------------------------------------------------------- bare delta-rs
def bare(ctx: Context) -> Measure:
    """One-row commits; a reader polls the table version every 20 ms and scans the new rows."""
    sizes = ctx.sizes
    uri = str(ctx.workdir / "bare_flow")
    schema = pa.schema([("seq", pa.int64()), ("body", pa.binary())])
    DeltaTable.create(uri, schema, mode="error")
    writer = DeltaTable(uri)
    follower = DeltaTable(uri)
    state = {"version": follower.version(), "max_seq": -1}
    count = max(1, int(sizes.e2e_seconds * sizes.e2e_rate))

    def send(i: int) -> float:
        at = now_ms()
        row = pa.table(
            {"seq": pa.array([i], pa.int64()), "body": [encode(i, sizes.body_bytes)]}, schema=schema
        )
        write_deltalake(writer, row, mode="append")
        return at

    def poll() -> list[int]:
        time.sleep(BARE_POLL_S)
        follower.update_incremental()
        version = follower.version()
        if version == state["version"]:
            return []
        state["version"] = version
        rows = follower.to_pyarrow_dataset().to_table(
            columns=["seq", "body"], filter=pc.field("seq") > state["max_seq"]
        )
        seqs: list[int] = rows["seq"].to_pylist()
        if seqs:
            state["max_seq"] = max(state["max_seq"], *seqs)
        return seqs

    return delays_of(*drive(count, sizes.e2e_rate, send, poll, SETTLE_S))


def flow(ctx: Context) -> list[dict[str, Any]]:
    sizes = ctx.sizes
    trigger_ms = open_store(ctx.workdir / "flow").config.dispatch_trigger_ms
    if ctx.redis is None:
        red_e2e = red_delay = unavailable(ctx.redis_why)
    else:
        red_e2e, red_delay = redis(ctx)
        ctx.log(f"Redis end to end {red_e2e}, delayed {red_delay}")
    bare_e2e = bare(ctx)
    ctx.log(f"bare end to end {bare_e2e}")
    ours_e2e, ours_delay, info = ours(ctx)
    rate_note = (
        f"{int(sizes.e2e_seconds * sizes.e2e_rate)} messages of {sizes.body_bytes} B sent one by one at "
        f"{sizes.e2e_rate:g}/s from one thread; latency = first pull that returns the message - start of "
        "its send call (so it includes the send itself)."
    )
    return [
        {
            "id": "end_to_end",
            "title": "End to end: send -> pullable, broker jobs running",
            "kind": "latency",
            "systems": {OURS: ours_e2e, BARE: bare_e2e, REDIS: red_e2e},
            "notes": [
                rate_note,
                f"lakemq: `Producer.send`; `jobs/broker.py --jobs {BROKER_JOBS}` running as its own process "
                f"and Spark application (dispatch trigger {trigger_ms} ms; ready "
                f"{info.get('broker_ready_s', '?')} s after start); a `PullConsumer` long-polling the queue "
                "(suspend 500 ms). While it was measured the dispatch job finished a micro-batch every "
                f"{info.get('dispatch_batch_interval_ms', '?')} ms on average: each batch reads the new "
                "commit-log versions on the driver with delta-rs, then commits the consume-queue entries.",
                "bare delta-rs: `write_deltalake` of one row per message; a reader polls the table version "
                "every 20 ms and scans the new rows (no dispatch stage, no index): the floor.",
                "Redis: XADD; a consumer in XREADGROUP BLOCK 500 COUNT 32 + XACK.",
            ],
        },
        {
            "id": "delay_lateness",
            "title": "Delayed delivery lateness: first pullable - deliver time",
            "kind": "latency",
            "systems": {
                OURS: ours_delay,
                BARE: unavailable("delta-rs has no scheduler"),
                REDIS: red_delay,
            },
            "notes": [
                f"{int(sizes.delayed_seconds * sizes.delayed_rate)} messages sent at "
                f"{sizes.delayed_rate:g}/s: two in three timer messages due {TIMER_AHEAD_MS / 1000:g} s "
                f"after their send (`deliver_at_ms`), one in three with delay level {DELAY_LEVEL} "
                f"({DELAY_LEVEL} s).",
                "lakemq: the schedule job (250 ms ticks) re-puts due messages, the dispatch job makes them "
                "pullable; measured by a long-polling `PullConsumer` on the real topic.",
                f"Redis: the usual pattern, a ZSET scored by deliver time and a poll loop every "
                f"{REDIS_SCHEDULER_POLL_S * 1000:g} ms running a Lua script that moves due members to a "
                "stream (ZRANGEBYSCORE + XADD + ZREM), read with XREADGROUP BLOCK.",
            ],
        },
    ]
