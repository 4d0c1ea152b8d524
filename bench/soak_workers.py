"""The processes of the soak (:mod:`bench.soak`): producers, pull consumers, simple consumers.

Each runs in its own ``spawn``-ed process (delta-rs does not survive ``fork``) until ``stop`` is set,
and every ``window_s`` puts one :func:`window` dict on ``out``: what it did in that window and its
latencies. At the end it puts a ``final`` dict with every sequence number it sent or received, so the
soak can account for every message.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from bench.stats import percentile

HEADER = struct.Struct(">qd")  # sequence number (producer id << 40 | n), send time (epoch ms)
SEQ_SHIFT = 40
COMMIT_EVERY_S = 5.0


def encode(producer: int, n: int, body_bytes: int) -> bytes:
    head = HEADER.pack((producer << SEQ_SHIFT) | n, time.time() * 1000)
    return head + b"x" * max(0, body_bytes - HEADER.size)


def decode(body: bytes) -> tuple[int, float]:
    seq, sent_ms = HEADER.unpack_from(body)
    return int(seq), float(sent_ms)


def window(role: str, ident: str, count: int, latencies: dict[str, list[float]]) -> dict[str, Any]:
    """One window's report: the count and, per latency series, p50 / p99 / max in ms."""
    row: dict[str, Any] = {"role": role, "id": ident, "t": time.time(), "count": count}
    for name, values in latencies.items():
        row[name] = (
            {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values)}
            if values
            else None
        )
    return row


class _Windows:
    """Cuts a worker's measurements into windows and ships them."""

    def __init__(self, role: str, ident: str, out: Any, window_s: float, series: tuple[str, ...]) -> None:
        self.role, self.ident, self.out, self.window_s = role, ident, out, window_s
        self.series = series
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self.started = now
        self.count = 0
        self.values: dict[str, list[float]] = {name: [] for name in self.series}

    def add(self, n: int = 0, **latencies: float) -> None:
        self.count += n
        for name, value in latencies.items():
            self.values[name].append(value)
        now = time.monotonic()
        if now - self.started >= self.window_s:
            self.out.put(window(self.role, self.ident, self.count, self.values))
            self._reset(now)


def producer(
    store_path: str,
    topic: str,
    ident: int,
    rate: float,
    body_bytes: int,
    window_s: float,
    stop: Any,
    out: Any,
) -> None:
    """Synchronous sends at ``rate`` per second; reports send latency."""
    from engine import Message, Producer, Store

    windows = _Windows("producer", f"p{ident}", out, window_s, ("send_ms",))
    sent: list[int] = []
    failed = 0
    with Producer(Store.open(store_path), f"SoakProducer{ident}") as prod:
        began = time.monotonic()

        def one() -> None:
            nonlocal failed
            n = len(sent) + failed
            wait = began + n / rate - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, 0.5))
                return
            body = encode(ident, n, body_bytes)
            t0 = time.perf_counter()
            try:
                prod.send(Message(topic, body))
            except Exception:  # a failed send is counted, never retried with the same number
                failed += 1
                windows.add(0)
                return
            sent.append(decode(body)[0])
            windows.add(1, send_ms=(time.perf_counter() - t0) * 1000)

        while not stop.is_set():
            one()
    out.put({"role": "producer", "id": f"p{ident}", "final": True, "sent": sent, "failed": failed})


def pull_consumer(
    store_path: str,
    topic: str,
    ident: int,
    queues: list[int],
    window_s: float,
    stop: Any,
    drained: Any,
    quit: Any,
    out: Any,
) -> None:
    """Pulls its queues round robin from the group's committed offsets (committed every 5 s); reports
    pull and end-to-end latency. Ends once drained (``stop`` and ``drained`` set, nothing found for a
    few rounds), or when ``quit`` is set (the drain's deadline)."""
    from engine import PullConsumer, PullStatus, Store

    consumer = PullConsumer(Store.open(store_path), "SoakPull")
    windows = _Windows("pull", f"c{ident}", out, window_s, ("pull_ms", "e2e_ms"))
    offsets = {q: consumer.committed_offset(topic, q) or 0 for q in queues}
    last = dict(offsets)
    committed = [time.monotonic()]
    received: list[int] = []
    idle_rounds = 0

    def one_round() -> None:
        nonlocal idle_rounds
        found = 0
        for q in queues:
            t0 = time.perf_counter()
            result = consumer.pull(topic, q, offsets[q], 32)
            took = (time.perf_counter() - t0) * 1000
            if result.status is PullStatus.FOUND:
                now = time.time() * 1000
                for m in result.messages:
                    seq, sent_ms = decode(m.body)
                    received.append(seq)
                    windows.add(1, e2e_ms=now - sent_ms)
                windows.add(0, pull_ms=took)
                found += len(result.messages)
            offsets[q] = result.next_begin_offset
        if time.monotonic() - committed[0] >= COMMIT_EVERY_S or stop.is_set():
            for q in queues:  # as RocketMQ's consumers: offsets persisted every 5 s, not per pull
                if offsets[q] != last[q]:
                    consumer.commit_offset(topic, q, offsets[q])
                    last[q] = offsets[q]
            committed[0] = time.monotonic()
        idle_rounds = 0 if found else idle_rounds + 1
        if not found:
            windows.add(0)
            time.sleep(0.05)

    while not quit.is_set() and not (stop.is_set() and drained.is_set() and idle_rounds > 3):
        one_round()
    out.put({"role": "pull", "id": f"c{ident}", "final": True, "received": received})


def simple_consumer(
    store_path: str, topic: str, ident: int, window_s: float, stop: Any, drained: Any, quit: Any, out: Any
) -> None:
    """Receives up to 32 at a time and acks each; reports receive and end-to-end latency. Ends as
    :func:`pull_consumer` does."""
    from engine import SimpleConsumer, Store

    consumer = SimpleConsumer(Store.open(store_path), "SoakSimple", f"s{ident}")
    consumer.subscribe(topic)
    windows = _Windows("simple", f"s{ident}", out, window_s, ("receive_ms", "e2e_ms"))
    received: list[int] = []
    idle_rounds = 0
    try:
        while not quit.is_set() and not (stop.is_set() and drained.is_set() and idle_rounds > 3):
            t0 = time.perf_counter()
            batch = consumer.receive(32, 60_000, wait_ms=200)
            took = (time.perf_counter() - t0) * 1000
            now = time.time() * 1000
            for m in batch:
                seq, sent_ms = decode(m.body)
                received.append(seq)
                consumer.ack(m)
                windows.add(1, e2e_ms=now - sent_ms)
            if batch:
                windows.add(0, receive_ms=took)
                idle_rounds = 0
            else:
                idle_rounds += 1
                windows.add(0)
    finally:
        consumer.close()
    out.put({"role": "simple", "id": f"s{ident}", "final": True, "received": received})
