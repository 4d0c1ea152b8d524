"""Scenarios run by the official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified)
against a gRPC door, in a process of its own: its threads stay out of the test process, and a test
can kill it (the two import into one process too: tests/grpc/test_stubs.py).

Run as ``python -m tests.grpc.official_client SCENARIO ENDPOINT TOPIC [GROUP] [N]``; prints one JSON
line with what happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run(*args: object) -> Any:
    """Run one scenario in a process of its own (from a test); what it printed last. Also:
    :func:`start` for a scenario a test talks to while it runs."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.grpc.official_client", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def start(*args: object) -> subprocess.Popen[str]:
    """Start one scenario in a process of its own; its stdin and stdout are pipes (text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.grpc.official_client", *map(str, args)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _config(endpoint: str) -> Any:
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(endpoint, Credentials(), request_timeout=10)


def send(endpoint: str, topic: str, n: int) -> dict[str, Any]:
    from rocketmq import Message, Producer

    producer = Producer(_config(endpoint), (topic,))
    producer.startup()
    try:
        ids = []
        for i in range(n):
            message = Message()
            message.topic = topic
            message.body = f"body-{i}".encode()
            message.tag = "TagA"
            message.keys = f"key-{i}"
            message.add_property("index", str(i))
            receipt = producer.send(message)
            ids.append(receipt.message_id)
        return {"ids": ids}
    finally:
        producer.shutdown()


def send_kinds(endpoint: str, topic: str, deliver_at_s: int) -> dict[str, Any]:
    """A delay message due at ``deliver_at_s`` (epoch seconds) and a FIFO one of group ``order-7``."""
    from rocketmq import Message, Producer

    producer = Producer(_config(endpoint), (topic,))
    producer.startup()
    try:
        delayed = Message()
        delayed.topic, delayed.body = topic, b"later"
        delayed.delivery_timestamp = deliver_at_s
        fifo = Message()
        fifo.topic, fifo.body = topic, b"in-order"
        fifo.message_group = "order-7"
        return {"delayed": producer.send(delayed).message_id, "fifo": producer.send(fifo).message_id}
    finally:
        producer.shutdown()


def _consumer(endpoint: str, topic: str, group: str) -> Any:
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(_config(endpoint), group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    return consumer


def _describe(message: Any) -> dict[str, Any]:
    return {
        "id": message.message_id,
        "body": message.body.decode(),
        "tag": message.tag,
        "keys": sorted(message.keys),
        "properties": dict(message.properties),
        "attempt": message.delivery_attempt,
        "topic": message.topic,
        "group": message.message_group,
    }


def _receive(consumer: Any, want: int, invisible_s: int, rounds: int = 8) -> list[Any]:
    got: list[Any] = []
    for _ in range(rounds):
        got += consumer.receive(min(32, want - len(got)), invisible_s) or []
        if len(got) >= want:
            break
    return got


def receive_ack(endpoint: str, topic: str, group: str, n: int) -> dict[str, Any]:
    consumer = _consumer(endpoint, topic, group)
    try:
        got = _receive(consumer, n, 30)
        for message in got:
            consumer.ack(message)
        return {"received": [_describe(m) for m in got]}
    finally:
        consumer.shutdown()


def change_invisible(endpoint: str, topic: str, group: str, n: int) -> dict[str, Any]:
    """Receive one message for 10 s, extend it to 60 s, wait past the first 10 s (it must not come
    again meanwhile) and ack it with the new handle; a stale (acked) handle is refused after."""
    from rocketmq.v5.exception import BadRequestException

    consumer = _consumer(endpoint, topic, group)
    try:
        [message] = _receive(consumer, 1, 10)
        old_handle = message.receipt_handle
        consumer.change_invisible_duration(message, 60)
        changed = message.receipt_handle != old_handle
        deadline = time.monotonic() + 12
        again: list[Any] = []
        while time.monotonic() < deadline:
            again += consumer.receive(1, 10) or []
        consumer.ack(message)
        refused = None
        try:
            consumer.ack(message)
        except BadRequestException as exc:
            refused = exc.code
        return {"handle_changed": changed, "again": len(again), "stale_ack_code": refused}
    finally:
        consumer.shutdown()


def redelivery(endpoint: str, topic: str, group: str, n: int) -> dict[str, Any]:
    """Receive one message for 10 s without acking it; it comes again after that, attempt 2."""
    consumer = _consumer(endpoint, topic, group)
    try:
        [first] = _receive(consumer, 1, 10)
        again: list[Any] = []
        for _ in range(10):
            again = consumer.receive(1, 10) or []
            if again:
                break
        for message in again:
            consumer.ack(message)
        return {"first": _describe(first), "again": [_describe(m) for m in again]}
    finally:
        consumer.shutdown()


def _queue_id(queue: Any) -> int:
    """The queue id the client chose (its MessageQueue keeps it in a private attribute)."""
    return int(next(v for k, v in vars(queue).items() if k.endswith("__queue_id")))


def fifo(endpoint: str, topic: str, group: str, n: int) -> dict[str, Any]:
    """Send ``n`` messages of each of two message groups, interleaved (the client hashes each group
    to a queue); then receive as the FIFO consumer group ``group``: one message per receive, and
    once, before acking, a second receive that must find nothing of the first's queue."""
    queues = _send_groups(endpoint, topic, n)
    consumer = _consumer(endpoint, topic, group)
    try:
        received: list[dict[str, Any]] = []
        held_probe: list[Any] | None = None
        for _ in range(20 * n):
            got = consumer.receive(1, 30) or []
            if got and held_probe is None:
                # Not acked yet: its queue is held, the other group's queue is not.
                held_probe = consumer.receive(2 * n, 30) or []
                probe_groups = [m.message_group for m in held_probe]
                received += [_describe(m) for m in got + held_probe]
                for m in got + held_probe:
                    consumer.ack(m)
                continue
            for m in got:
                received.append(_describe(m))
                consumer.ack(m)
            if len(received) >= 2 * n:
                break
        return {
            "queues": {k: sorted(v) for k, v in queues.items()},
            "received": received,
            "first_group": received[0]["group"] if received else None,
            "probe_groups": probe_groups if held_probe is not None else None,
        }
    finally:
        consumer.shutdown()


def transactions(endpoint: str, topic: str) -> None:
    """Three transactional sends: one committed, one rolled back, one left undecided. Prints the ids
    (``commit``, ``rollback``, ``unknown``), then waits for the server's check-back of the undecided
    one (its checker commits it), prints the ids it was asked about, and stays until stdin closes
    (so the checker's EndTransaction is not cut off by a shutdown)."""
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    asked: list[str] = []
    checked = threading.Event()

    class Checker(TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            asked.append(message.message_id)
            checked.set()
            return TransactionResolution.COMMIT

    producer = Producer(_config(endpoint), (topic,), Checker())
    producer.startup()
    try:
        ids = {}
        for name in ("commit", "rollback", "unknown"):
            message = Message()
            message.topic, message.body = topic, name.encode()
            transaction = producer.begin_transaction()
            ids[name] = producer.send(message, transaction).message_id
            if name == "commit":
                transaction.commit()
            elif name == "rollback":
                transaction.rollback()
        print(json.dumps(ids), flush=True)
        checked.wait(120)
        print(json.dumps({"asked": asked}), flush=True)
        sys.stdin.read()
    finally:
        producer.shutdown()


def exhaust(endpoint: str, topic: str, group: str, n: int) -> dict[str, Any]:
    """Receive one message ``n`` times (each time made visible again in 1 s and never acked), then
    receive twice more: with ``n`` the group's most attempts, nothing more comes."""
    consumer = _consumer(endpoint, topic, group)
    try:
        attempts: list[int] = []
        for _ in range(10 * n):
            for message in consumer.receive(1, 10) or []:
                attempts.append(message.delivery_attempt)
                consumer.change_invisible_duration(message, 1)
            if len(attempts) >= n:
                break
        after = [m.delivery_attempt for _ in range(2) for m in consumer.receive(1, 10) or []]
        return {"attempts": attempts, "after": after}
    finally:
        consumer.shutdown()


def receive_hold(endpoint: str, topic: str, group: str, n: int) -> dict[str, Any]:
    """Receive ``n`` messages for 10 s without acking them, print their ids, then wait in receive
    after receive (a client killed in the middle of a receive)."""
    consumer = _consumer(endpoint, topic, group)
    got = _receive(consumer, n, 10)
    print(json.dumps({"held": [m.message_id for m in got]}), flush=True)
    while True:
        consumer.receive(1, 10)


def _send_groups(endpoint: str, topic: str, n: int) -> dict[str, set[int]]:
    """``n`` messages of each of two message groups, interleaved; the queues the client chose."""
    from rocketmq import Message, Producer

    producer = Producer(_config(endpoint), (topic,))
    producer.startup()
    queues: dict[str, set[int]] = {}
    try:
        for i in range(n):
            for name in ("order-0", "order-1"):
                message = Message()
                message.topic, message.body = topic, f"{name}:{i}".encode()
                message.message_group = name
                receipt = producer.send(message)
                queues.setdefault(name, set()).add(_queue_id(receipt.message_queue))
    finally:
        producer.shutdown()
    return queues


def _push(endpoint: str, topic: str, group: str, want: int, fail_once: set[str]) -> list[dict[str, Any]]:
    """A ``PushConsumer`` of ``group`` on ``topic`` until ``want`` messages were consumed with
    ``SUCCESS`` (at most 90 s); its listener answers ``FAILURE`` the first time it sees a body of
    ``fail_once``. What the listener saw, in the order it saw it (``result`` added)."""
    from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

    seen: list[dict[str, Any]] = []
    failed: set[str] = set()
    lock = threading.Lock()
    done = threading.Event()

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            body = message.body.decode()
            with lock:
                result = "FAILURE" if body in fail_once and body not in failed else "SUCCESS"
                failed.add(body)
                seen.append({**_describe(message), "result": result})
                if sum(1 for s in seen if s["result"] == "SUCCESS") >= want:
                    done.set()
            return ConsumeResult.FAILURE if result == "FAILURE" else ConsumeResult.SUCCESS

    consumer = PushConsumer(_config(endpoint), group, Listener(), {topic: FilterExpression()})
    consumer.startup()
    try:
        done.wait(float(os.environ.get("PUSH_WAIT_S", "90")))
        time.sleep(1)  # the last acks go out before the shutdown
    finally:
        consumer.shutdown()
    with lock:
        return list(seen)


def push(endpoint: str, topic: str, group: str, n: int) -> dict[str, Any]:
    """A push consumer of the ``n`` messages ``send`` sent; it fails ``body-1`` once."""
    return {"seen": _push(endpoint, topic, group, n, {"body-1"})}


def push_fifo(endpoint: str, topic: str, group: str, n: int) -> dict[str, Any]:
    """``n`` messages of each of two message groups, then a push consumer of the FIFO group
    ``group`` that fails ``order-0:1`` once."""
    queues = _send_groups(endpoint, topic, n)
    seen = _push(endpoint, topic, group, 2 * n, {"order-0:1"})
    return {"queues": {k: sorted(v) for k, v in queues.items()}, "seen": seen}


def lite(endpoint: str, topic: str, group: str, n: int) -> dict[str, Any]:
    """A ``LiteSimpleConsumer`` and a ``LitePushConsumer`` bound to ``topic``: each starts, and its
    ``subscribe_lite`` is refused (what it raised, by class name)."""
    from rocketmq import ConsumeResult, LitePushConsumer, LiteSimpleConsumer, MessageListener

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            return ConsumeResult.SUCCESS

    out: dict[str, Any] = {}
    for name, make in (
        ("simple", lambda: LiteSimpleConsumer(topic, _config(endpoint), group, await_duration=5)),
        ("push", lambda: LitePushConsumer(_config(endpoint), group, topic, Listener())),
    ):
        consumer = make()
        consumer.startup()
        try:
            consumer.subscribe_lite("lite-1")
            out[name] = None
        except Exception as exc:
            out[name] = type(exc).__name__
        finally:
            consumer.shutdown()
    return out


SCENARIOS = {
    "lite": lite,
    "push": push,
    "push_fifo": push_fifo,
    "fifo": fifo,
    "receive_hold": receive_hold,
    "exhaust": exhaust,
    "receive_ack": receive_ack,
    "change_invisible": change_invisible,
    "redelivery": redelivery,
}


def main(argv: list[str]) -> None:
    scenario, endpoint, topic = argv[:3]
    if scenario == "send":
        out = send(endpoint, topic, int(argv[3]))
    elif scenario == "transactions":
        transactions(endpoint, topic)
        return
    elif scenario == "send_kinds":
        out = send_kinds(endpoint, topic, int(argv[3]))
    else:
        out = SCENARIOS[scenario](endpoint, topic, argv[3], int(argv[4]) if len(argv) > 4 else 1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
