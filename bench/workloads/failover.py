"""A consumer dies: how long until the others consume its queues (DESIGN.md §7).

``failover``: a producer sends a message to every queue of a topic of 8 queues every 50 ms (and
dispatches them) while 4 spawned ``PushConsumer`` processes of one clustering group consume them,
each with its default settings. Once every queue is consumed by exactly one process, one of them
is killed (SIGKILL, as a crash or an OOM kill); for each queue it was consuming, the failover time is
from the kill to the first message of that queue consumed by another process. Then a second one is
killed the same way. The measure is the slowest queue of each kill (``p50_ms``/``max_ms`` over the
kills, ``p99_ms`` = the slowest queue of all).

The RocketMQ peer (its broker notices the closed connection and tells the group at once) runs with
the wire step's Java harness only; Redis Streams has no queue ownership to fail over.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import signal
import threading
import time
from typing import Any

from bench.stats import Measure, unavailable
from bench.workloads import OURS, Context
from bench.workloads.produce import open_store
from engine import Admin, ConsumeResult, Message, Producer, PushConsumer
from engine.broker.dispatch import dispatch_pending

TOPIC = "FailoverBench"
GROUP = "FailoverGroup"
QUEUES = 8
PROCESSES = 4
KILLS = 2
SEND_EVERY_S = 0.05
STABLE_S = 2.0  # every queue consumed by one process only, for this long, before a kill
WAIT_S = 60.0  # the longest a queue may wait for its new consumer before the run gives up on it


def _consumer(root: str, worker: int, events: Any) -> None:
    store = open_store(root)
    consumer = PushConsumer(store, GROUP)
    consumer.subscribe(TOPIC)

    def listener(messages: list[Any]) -> ConsumeResult:
        now = time.time()
        for m in messages:
            if m.topic == TOPIC:  # not the group's retries (their queue ids are another topic's)
                events.put((worker, m.queue_id, now))
        return ConsumeResult.SUCCESS

    consumer.register_listener(listener)
    consumer.start()
    while True:
        time.sleep(3600)  # until killed


def _produce(root: str, stop: threading.Event) -> None:
    store = open_store(root)
    with Producer(store, "FailoverProducer") as producer:
        n = 0
        while not stop.is_set():
            for q in range(QUEUES):
                producer.send(Message(TOPIC, str(n).encode()), queue_id=q)
                n += 1
            dispatch_pending(store)
            stop.wait(SEND_EVERY_S)


class _Owners:
    """Who consumed each queue lately, from the consumers' events."""

    def __init__(self, events: Any) -> None:
        self._events = events
        self.seen: list[tuple[int, int, float]] = []

    def drain(self, wait_s: float = 0.1) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.seen.append(self._events.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue_module.Empty:
                return

    def owners(self, since: float) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for worker, q, at in self.seen:
            if at >= since:
                out.setdefault(q, set()).add(worker)
        return out

    def wait_stable(self, alive: set[int], timeout_s: float) -> dict[int, int]:
        """Queue -> its one consumer, once every queue had exactly one live consumer for STABLE_S."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.drain(0.5)
            owners = self.owners(time.time() - STABLE_S)
            single = len(owners) == QUEUES and all(len(w) == 1 and w <= alive for w in owners.values())
            if single and set().union(*owners.values()) == alive:  # every live process holds queues
                return {q: next(iter(w)) for q, w in owners.items()}
        last = self.owners(time.time() - STABLE_S)
        raise TimeoutError(f"the group did not settle within {timeout_s:.0f} s: {last}")

    def taken_over(self, queues: set[int], dead: int, killed_at: float, timeout_s: float) -> dict[int, float]:
        """Per queue of ``queues``, seconds from the kill to its first message consumed by another."""
        deadline = time.monotonic() + timeout_s
        found: dict[int, float] = {}
        while time.monotonic() < deadline and len(found) < len(queues):
            self.drain(0.2)
            for worker, q, at in self.seen:
                if q in queues and q not in found and worker != dead and at > killed_at:
                    found[q] = at - killed_at
        return found


def failover(ctx: Context) -> list[dict[str, Any]]:
    """The failover workload (module docstring)."""
    root = ctx.workdir / "failover"
    store = open_store(root)
    Admin(store).create_topic(TOPIC, QUEUES)
    mp = multiprocessing.get_context("spawn")
    events = mp.Queue()
    procs = {
        i: mp.Process(target=_consumer, args=(str(root), i, events), daemon=True) for i in range(PROCESSES)
    }
    stop = threading.Event()
    sender = threading.Thread(target=_produce, args=(str(root), stop), daemon=True)
    owners = _Owners(events)
    kills: list[float] = []
    slowest: list[float] = []
    notes: list[str] = []
    measure: Measure
    try:
        for p in procs.values():
            p.start()
        sender.start()
        alive = set(procs)
        for _ in range(KILLS):
            held = owners.wait_stable(alive, 120)
            victim = max(alive, key=lambda w: (sum(1 for o in held.values() if o == w), w))
            queues = {q for q, w in held.items() if w == victim}
            killed_at = time.time()
            os.kill(procs[victim].pid or 0, signal.SIGKILL)
            alive.discard(victim)
            found = owners.taken_over(queues, victim, killed_at, WAIT_S)
            if len(found) < len(queues):
                missing = sorted(queues - set(found))
                raise TimeoutError(f"queues {missing} not consumed {WAIT_S:.0f} s after the kill")
            kills.append(max(found.values()))
            slowest.extend(found.values())
            notes.append(
                f"kill of 1 of {len(alive) + 1} processes holding {len(queues)} queues: slowest queue "
                f"{max(found.values()):.2f} s, fastest {min(found.values()):.2f} s"
            )
            ctx.log(f"failover: {notes[-1]}")
        kills_ms = sorted(k * 1000 for k in kills)
        measure = {
            "p50_ms": round(kills_ms[len(kills_ms) // 2], 1),
            "p99_ms": round(max(slowest) * 1000, 1),
            "max_ms": round(max(kills_ms), 1),
            "n": len(kills_ms),
        }
    except Exception as exc:
        measure = unavailable(f"{type(exc).__name__}: {exc}")
    finally:
        stop.set()
        sender.join(30)
        for p in procs.values():
            if p.is_alive():
                p.kill()
            p.join(10)
    return [
        {
            "id": "failover",
            "title": "A consumer process killed: its queues consumed by the others "
            f"({PROCESSES} PushConsumer processes)",
            "kind": "latency",
            "systems": {OURS: measure},
            "notes": [
                f"lakemq: {PROCESSES} spawned `PushConsumer` processes of one clustering group (default "
                f"settings) on a topic of {QUEUES} queues, a message to every queue every "
                f"{SEND_EVERY_S * 1000:.0f} ms; SIGKILL of the process holding the most queues once the "
                f"group settled, {KILLS} times; per kill, the time from the kill to the first message "
                "of its slowest queue consumed by another process.",
                *notes,
            ],
        }
    ]
