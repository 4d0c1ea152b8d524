"""Object storage: lakemq on a real S3 server (SeaweedFS on loopback), beside bare delta-rs on the
same server through the same proxy, in two profiles.

* ``loopback``: the proxy forwards at once (a round trip is what loopback and SeaweedFS cost);
* ``rtt20``: the proxy holds every request ``INJECTED_RTT_MS`` (20 ms) before forwarding it, the
  round trip of a cloud object store.

The proxy (:class:`bench.s3proxy.S3Proxy`, in a process of its own) counts the requests, so each
operation is also reported in requests per operation, and each latency as a multiple of the injected
round trip. Per profile: sync send, batched produce (2,000 x 1 KiB per batch) beside bare
``write_deltalake``, async send, pull 32, end to end (send -> pullable) with the broker jobs running
on the S3 store, receive + ack (SimpleConsumer), and 8 writer processes on 1 and on 4 commit-log
shards.

Workload ids are ``s3_<profile>_<what>``; a part that fails is reported unavailable with its error
(the store's object-storage work is under way), the others are still measured.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from deltalake import write_deltalake

from bench import peers
from bench.s3proxy import S3Proxy
from bench.seaweedfs import SeaweedS3
from bench.stats import Measure, latency, rate, unavailable
from bench.workloads import BARE, OURS, Context
from bench.workloads import contention as contention_workload
from bench.workloads import flow as flow_workload
from bench.workloads.produce import QUEUES, TOPIC, random_messages
from bench.workloads.pull import PULL, positions
from engine import Admin, EngineConfig, Message, Producer, PullConsumer, PullStatus, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.config import STORAGE_ENV_PREFIX
from engine.store import schemas

INJECTED_RTT_MS = 20.0
INJECTED = "rtt20"  # the profile the design's object-storage targets are judged on
PROFILES: tuple[tuple[str, float], ...] = (("loopback", 0.0), (INJECTED, INJECTED_RTT_MS))
PROFILE_TITLES = {"loopback": "loopback", INJECTED: f"{INJECTED_RTT_MS:g} ms injected per request"}
SHARDS = contention_workload.SHARDED
E2E_READY_TIMEOUT_S = 240.0
# (what, title): the workloads of one profile, in the order the report shows them
WHATS: tuple[tuple[str, str], ...] = (
    ("send_sync", "Single synchronous send, 1 KiB"),
    ("produce_batched", "Batched produce"),
    ("send_async", "Async produce (`send_async`, default linger)"),
    ("pull", f"Pull {PULL}"),
    ("end_to_end", "End to end: send -> pullable, broker jobs running"),
    ("ack", f"SimpleConsumer receive {PULL} + ack, one consumer"),
    ("writers_1", "8 writer processes, one commit-log shard"),
    (f"writers_{SHARDS}", f"8 writer processes, {SHARDS} commit-log shards"),
)


def workload_id(profile: str, what: str) -> str:
    """The id of one object-storage workload: ``s3_<profile>_<what>``."""
    return f"s3_{profile}_{what}"


def _why(exc: BaseException) -> str:
    """An error in one line (the first), short enough for a table cell."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


@dataclass
class Bed:
    """One profile's test bed: the server, a bucket, and the proxy every client goes through."""

    server: SeaweedS3
    bucket: str
    proxy: S3Proxy
    profile: str
    rtt_ms: float
    prefix: str = ""

    def options(self) -> dict[str, str]:
        """Storage options pointing at the proxy."""
        return self.server.storage_options(endpoint=self.proxy.endpoint)

    def root(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{self.profile}-{name}"

    def store(self, name: str, topic: str = TOPIC, queues: int = QUEUES) -> Store:
        root = self.root(name)
        store = Store.open(root, storage_options=self.options(), config=EngineConfig(store=root))
        Admin(store).create_topic(topic, queues)
        return store

    def requests(self) -> int:
        return self.proxy.requests

    @contextmanager
    def counting(self, out: dict[str, Any]) -> Iterator[None]:
        """Put the requests made inside the block in ``out["requests"]`` and the median time the
        proxy took to answer them (the store's round trip, the injected delay included) in
        ``out["round_trip_ms"]`` (None when there was none)."""
        began = self.requests()
        self.proxy.round_trips()  # drop what came before the block
        try:
            yield
        finally:
            out["requests"] = self.requests() - began
            taken = self.proxy.round_trips()
            out["round_trip_ms"] = statistics.median(taken) if taken else None

    def round_trips(self, measure: Measure, counted: dict[str, Any], ops: int) -> Measure:
        """``measure`` with requests per operation and, with an injected delay, the store's round trip
        measured during it (``rtt_ms``: the median request the workload made, as the proxy timed it)
        and its latencies in those round trips."""
        if "unavailable" in measure:
            return measure
        measure["requests_per_op"] = round(counted.get("requests", 0) / max(ops, 1), 1)
        rtt_ms = counted.get("round_trip_ms")
        if self.rtt_ms > 0 and rtt_ms:
            measure["injected_ms"] = self.rtt_ms
            measure["rtt_ms"] = round(rtt_ms, 2)
            for key in ("p50", "p99"):
                if f"{key}_ms" in measure:
                    measure[f"{key}_rtts"] = round(measure[f"{key}_ms"] / rtt_ms, 2)
        return measure


def timed_calls(fn: Callable[[int], Any], n: int) -> tuple[list[float], int, str]:
    """Call ``fn(0..n-1)``; the milliseconds of each call that returned, the failures and the first
    failure's error (a send the store refused is counted, not timed, and the run goes on)."""
    samples: list[float] = []
    failed, first = 0, ""
    for i in range(n):
        began = time.perf_counter()
        try:
            fn(i)
        except Exception as exc:
            failed += 1
            first = first or _why(exc)
            continue
        samples.append((time.perf_counter() - began) * 1000)
    return samples, failed, first


def _with_failures(measure: Measure, failed: int, first: str) -> Measure:
    if failed:
        measure["failures"] = failed
        measure["first_failure"] = first
    return measure


# ----------------------------------------------------------------------------- the parts
def _tagged(body: bytes) -> Message:
    return Message(TOPIC, body, tags="TagA")


def sync_send(bed: Bed, n: int, body_bytes: int) -> dict[str, Measure]:
    """``Producer.send`` one after another; bare: ``write_deltalake`` of one commit-log row per call."""
    store = bed.store("sync")
    body = os.urandom(body_bytes)
    counted: dict[str, Any] = {}
    with Producer(store, "S3Sync") as producer:
        for _ in range(3):  # warm-up: first touches of the tables
            producer.send(Message(TOPIC, body, tags="TagA"))
        with bed.counting(counted):
            samples, failed, first = timed_calls(lambda i: producer.send(_tagged(body)), n)
    ours = bed.round_trips(_with_failures(latency(samples), failed, first), counted, n)
    one_row = store.read(schemas.COMMIT_LOG).slice(0, 1)
    dt = peers.create_commit_log_like(bed.root("bare-sync"), bed.options())
    for _ in range(3):
        write_deltalake(dt, one_row, mode="append")
    with bed.counting(counted):
        samples, failed, first = timed_calls(lambda i: write_deltalake(dt, one_row, mode="append"), n)
    bare = bed.round_trips(_with_failures(latency(samples), failed, first), counted, n)
    return {OURS: ours, BARE: bare}


def batched_produce(bed: Bed, per_batch: int, batches: int, body_bytes: int) -> dict[str, Measure]:
    """``send_batch`` of ``per_batch`` messages, ``batches`` times; bare: the same Arrow rows in the
    same batch sizes with ``write_deltalake``."""
    store = bed.store("batch")
    messages = random_messages(TOPIC, per_batch, body_bytes)
    counted: dict[str, Any] = {}
    with Producer(store, "S3Batch") as producer:
        producer.send_batch(messages)  # warm-up, not timed (nor copied to the bare table)
        with bed.counting(counted):
            began = time.perf_counter()
            for _ in range(batches):
                producer.send_batch(messages)
            ours_s = time.perf_counter() - began
    ours = bed.round_trips(rate(per_batch * batches, ours_s), counted, batches)
    rows = store.read(schemas.COMMIT_LOG).sort_by("physical_offset").slice(per_batch)
    dt = peers.create_commit_log_like(bed.root("bare-batch"), bed.options())
    parts = peers.slices(rows, [per_batch] * batches)
    write_deltalake(dt, parts[0], mode="append")  # warm-up, as lakemq's
    with bed.counting(counted):
        bare_s = peers.append_slices(dt, parts)
    bare = bed.round_trips(rate(per_batch * batches, bare_s), counted, batches)
    return {OURS: ours, BARE: bare}


def async_send(bed: Bed, n: int, body_bytes: int) -> tuple[Store, dict[str, Measure]]:
    """``send_async`` of ``n`` messages then ``flush``; the store is kept for the pulls and acks."""
    store = bed.store("async")
    messages = random_messages(TOPIC, min(n, 1024), body_bytes)
    counted: dict[str, Any] = {}
    with Producer(store, "S3Async") as producer:
        producer.send(messages[0])
        with bed.counting(counted):
            began = time.perf_counter()
            futures = [producer.send_async(messages[i % len(messages)]) for i in range(n)]
            producer.flush()
            seconds = time.perf_counter() - began
    errors = [f.exception() for f in futures if f.exception() is not None]
    measure = rate(n - len(errors), seconds)
    measure["requests_per_op"] = round(counted["requests"] / max(n, 1), 3)
    if errors:
        _with_failures(measure, len(errors), _why(errors[0]))  # type: ignore[arg-type]
    return store, {OURS: measure}


def pulls(bed: Bed, store: Store, n: int) -> dict[str, Measure]:
    """``PullConsumer.pull`` of 32 at random offsets, after dispatching everything."""
    dispatch_pending(store)
    bounds = {s.queue_id: (s.min_offset, s.max_offset) for s in Admin(store).topic_stats(TOPIC)}
    where = positions(bounds, n, seed=11, tail=False)
    consumer = PullConsumer(store, "S3Pull")
    consumer.pull(TOPIC, where[0][0], where[0][1], PULL)  # warm-up

    def pull(i: int) -> None:
        qid, offset = where[i]
        result = consumer.pull(TOPIC, qid, offset, PULL)
        if result.status is not PullStatus.FOUND or len(result.messages) != PULL:
            raise RuntimeError(f"pull {qid}@{offset} returned {result.status} {len(result.messages)}")

    counted: dict[str, Any] = {}
    with bed.counting(counted):
        samples, failed, first = timed_calls(pull, n)
    return {OURS: bed.round_trips(_with_failures(latency(samples), failed, first), counted, n)}


def receive_ack(bed: Bed, store: Store, count: int) -> dict[str, Measure]:
    """One ``SimpleConsumer``: ``receive(max_nums=32)`` + ``ack`` of each, ``count`` messages."""
    consumer = SimpleConsumer(store, "S3Ack", "one")
    consumer.subscribe(TOPIC)
    done = 0
    counted: dict[str, Any] = {}
    with bed.counting(counted):
        began = time.perf_counter()
        while done < count:
            got = consumer.receive(max_nums=PULL, invisible_ms=60_000)
            if not got:
                break
            for message in got[: count - done]:
                consumer.ack(message)
            done += min(len(got), count - done)
        consumer.close()
        seconds = time.perf_counter() - began
    measure = rate(done, seconds) if done else unavailable("nothing received")
    if done:
        measure["requests_per_op"] = round(counted["requests"] / done, 3)
        if done < count:
            measure["missing"] = count - done
    return {OURS: measure}


def end_to_end(bed: Bed, ctx: Context, seconds: float, send_rate: float) -> dict[str, Measure]:
    """Sends at ``send_rate``/s while ``jobs/broker.py`` runs on the S3 store; latency = first pull
    that returns the message - start of its send (as the local ``end_to_end`` workload)."""
    if seconds <= 0:
        return {OURS: unavailable("not run (s3_e2e_seconds is 0)")}
    root = bed.root("flow")
    store = bed.store("flow", topic=flow_workload.E2E_TOPIC, queues=1)
    env = {STORAGE_ENV_PREFIX + k: v for k, v in bed.options().items()}
    log = ctx.workdir / f"broker-{bed.profile}.log"
    count = max(1, int(seconds * send_rate))
    body_bytes = ctx.sizes.body_bytes
    counted: dict[str, Any] = {}
    try:
        with (
            flow_workload.Broker(root, log, env=env) as broker,
            Producer(store, "S3Flow") as producer,
        ):
            follower = flow_workload.QueueFollower(PullConsumer(store, "S3FlowE2E"), flow_workload.E2E_TOPIC)
            producer.send(
                Message(flow_workload.E2E_TOPIC, flow_workload.encode(flow_workload.PROBE, 64)), queue_id=0
            )
            ready_s = follower.wait_for(flow_workload.PROBE, E2E_READY_TIMEOUT_S, broker.check)
            ctx.log(f"s3 {bed.profile}: broker ready after {ready_s:.0f} s")

            def send(i: int) -> float:
                at = flow_workload.now_ms()
                body = flow_workload.encode(i, body_bytes)
                producer.send(Message(flow_workload.E2E_TOPIC, body), queue_id=0)
                return at

            def poll() -> list[int]:
                broker.check()
                return follower.poll()

            with bed.counting(counted):
                measure = flow_workload.delays_of(
                    *flow_workload.drive(count, send_rate, send, poll, flow_workload.SETTLE_S)
                )
    except Exception as exc:
        # A broker that exited says why in the last line of its log (Broker.check quotes the tail).
        lines = [line for line in str(exc).splitlines() if line.strip()]
        why = f"{_why(exc)} {lines[-1].strip()[:200]}" if len(lines) > 1 else _why(exc)
        return {OURS: unavailable(f"the broker on the S3 store: {why}")}
    return {OURS: bed.round_trips(measure, counted, count)}


def writers(bed: Bed, count: int, sends: int) -> tuple[Measure, Measure]:
    """``count`` spawned writer processes without the host lock, on 1 and on ``SHARDS`` shards."""
    out = []
    for shards in (1, SHARDS):
        counted: dict[str, Any] = {}
        try:
            with bed.counting(counted):
                measure = contention_workload.run(
                    count,
                    sends,
                    lock=False,
                    shards=shards,
                    root=bed.root(f"writers-{shards}"),
                    storage=bed.options(),
                )
            measure["requests_per_op"] = round(counted["requests"] / max(measure["n"], 1), 1)
        except Exception as exc:
            measure = unavailable(_why(exc))
        out.append(measure)
    one, sharded = out
    if "msg_s" in one and "msg_s" in sharded:
        sharded["x_one_shard"] = round(sharded["msg_s"] / max(one["msg_s"], 1), 2)
    return one, sharded


# ----------------------------------------------------------------------------- the step
def _guarded(what: str, fn: Callable[[], dict[str, Measure]]) -> dict[str, Measure]:
    try:
        return fn()
    except Exception as exc:
        return {OURS: unavailable(f"{what}: {_why(exc)}")}


def profile_workloads(bed: Bed, ctx: Context) -> list[dict[str, Any]]:
    """Every workload of one profile (see the module docstring)."""
    s = ctx.sizes
    got: dict[str, dict[str, Measure]] = {}
    got["send_sync"] = _guarded("sync send", lambda: sync_send(bed, s.s3_sync_sends, s.body_bytes))
    got["produce_batched"] = _guarded(
        "batched produce", lambda: batched_produce(bed, s.s3_batch_messages, s.s3_batches, s.body_bytes)
    )
    kept: list[Store] = []

    def run_async() -> dict[str, Measure]:
        store, measures = async_send(bed, s.s3_async_messages, s.body_bytes)
        kept.append(store)
        return measures

    got["send_async"] = _guarded("async send", run_async)
    if kept:
        got["pull"] = _guarded("pull", lambda: pulls(bed, kept[0], s.s3_pulls))
        got["ack"] = _guarded("receive + ack", lambda: receive_ack(bed, kept[0], s.s3_ack_messages))
    else:
        got["pull"] = got["ack"] = {OURS: unavailable("the async step, which fills the store, failed")}
    if bed.rtt_ms > 0 or s.s3_e2e_loopback:
        got["end_to_end"] = end_to_end(bed, ctx, s.s3_e2e_seconds, s.s3_e2e_rate)
    else:
        got["end_to_end"] = {
            OURS: unavailable("not run in this profile (--quick: the injected profile only)")
        }
    one, sharded = writers(bed, s.s3_writers, s.s3_writer_sends)
    got["writers_1"], got[f"writers_{SHARDS}"] = {OURS: one}, {OURS: sharded}
    for what, measures in got.items():
        ctx.log(f"s3 {bed.profile} {what}: {measures}")
    return [_result(bed, ctx, what, title, got[what]) for what, title in WHATS]


def _notes(bed: Bed, ctx: Context, what: str) -> list[str]:
    s = ctx.sizes
    where = (
        f"SeaweedFS's S3 gateway on 127.0.0.1 through the proxy ({PROFILE_TITLES[bed.profile]}); requests "
        "per operation counted by the proxy."
    )
    return {
        "send_sync": [
            where,
            f"{s.s3_sync_sends} `Producer.send` calls one after another; bare: `write_deltalake` of one "
            "commit-log row per call, same server, same proxy.",
        ],
        "produce_batched": [
            where,
            f"{s.s3_batches} `send_batch` calls of {s.s3_batch_messages:,} x {s.body_bytes} B; bare: the "
            "same Arrow rows appended in the same batch sizes.",
        ],
        "send_async": [where, f"{s.s3_async_messages:,} `send_async` calls from one thread, then `flush()`."],
        "pull": [where, f"{s.s3_pulls} pulls of {PULL} at random offsets after `dispatch_pending`."],
        "end_to_end": [
            where,
            f"`jobs/broker.py --jobs {flow_workload.BROKER_JOBS}` on the S3 store (storage options in its "
            f"environment); {int(s.s3_e2e_seconds * s.s3_e2e_rate)} sends at {s.s3_e2e_rate:g}/s; latency = "
            "first pull that returns the message - start of its send.",
        ],
        "ack": [where, f"receive(max_nums={PULL}) + ack of each, up to {s.s3_ack_messages:,} messages."],
    }.get(
        what,
        [
            where,
            f"{s.s3_writers} spawned processes x {s.s3_writer_sends} synchronous sends of one "
            f"{contention_workload.BODY} B message, no host lock (writers on different hosts).",
        ],
    )


def _result(bed: Bed, ctx: Context, what: str, title: str, systems: dict[str, Measure]) -> dict[str, Any]:
    kind = "latency" if what in ("send_sync", "pull", "end_to_end") else "rate"
    return {
        "id": workload_id(bed.profile, what),
        "title": f"Object storage ({PROFILE_TITLES[bed.profile]}): {title}",
        "kind": kind,
        "profile": bed.profile,
        "what": what,
        "systems": systems,
        "notes": _notes(bed, ctx, what),
    }


def on_server(server: SeaweedS3, bucket: str, ctx: Context) -> list[dict[str, Any]]:
    """Every workload in both profiles on a running server, under fresh prefixes of ``bucket``."""
    results: list[dict[str, Any]] = []
    ctx.extra["s3_profiles"] = dict(PROFILES)
    for profile, delay_ms in PROFILES:
        with S3Proxy(server.endpoint, delay_ms=delay_ms) as proxy:
            bed = Bed(server, bucket, proxy, profile, delay_ms, f"{uuid.uuid4().hex[:8]}/")
            results += profile_workloads(bed, ctx)
    return results


def object_store(ctx: Context) -> list[dict[str, Any]]:
    """The benchmark step ``s3``: starts SeaweedFS in the run's directory, then :func:`on_server`."""
    with SeaweedS3(ctx.workdir / "seaweedfs") as server:
        return on_server(server, server.create_bucket("bench"), ctx)
