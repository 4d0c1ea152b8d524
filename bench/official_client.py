"""The official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified) timed against a gRPC
endpoint: lakemq's door or RocketMQ's own proxy. It runs in a process of its own (its generated protos
and engine.grpc's define the same protobuf names, as tests/grpc/official_client.py says).

    python -m bench.official_client ENDPOINT TOPIC GROUP MESSAGES BODY_BYTES

prints one JSON line: the latency of each synchronous send (ms), the sends' seconds, then the seconds
one SimpleConsumer took to receive (batches of 32) and ack (one by one) every message, and each ack's
latency (ms).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

RECEIVE_BATCH = 32
INVISIBLE_S = 60
IDLE_ROUNDS = 10  # receives in a row that find nothing: the rest is not coming


def run(endpoint: str, topic: str, group: str, messages: int, body_bytes: int) -> dict[str, Any]:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    body = b"x" * body_bytes
    # the consumer first: its group then starts at the first message on either server
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5)
    consumer.startup()
    producer = Producer(config, (topic,))
    producer.startup()
    send_ms: list[float] = []
    failures = 0
    try:
        began = time.perf_counter()
        for i in range(messages):
            message = Message()
            message.topic, message.body, message.keys = topic, body, f"k{i}"
            t = time.perf_counter()
            try:
                producer.send(message)
            except Exception:
                failures += 1
                continue
            send_ms.append((time.perf_counter() - t) * 1000)
        send_s = time.perf_counter() - began
    finally:
        producer.shutdown()
    ack_ms: list[float] = []
    received = idle = 0
    try:
        began = time.perf_counter()
        while received < len(send_ms) and idle < IDLE_ROUNDS:
            got = consumer.receive(RECEIVE_BATCH, INVISIBLE_S) or []
            idle = 0 if got else idle + 1
            for message in got:
                t = time.perf_counter()
                consumer.ack(message)
                ack_ms.append((time.perf_counter() - t) * 1000)
            received += len(got)
        receive_s = time.perf_counter() - began
    finally:
        consumer.shutdown()
    return {
        "send_ms": send_ms,
        "send_s": send_s,
        "send_failures": failures,
        "received": received,
        "receive_s": receive_s,
        "ack_ms": ack_ms,
    }


def main(argv: list[str]) -> None:
    endpoint, topic, group, messages, body_bytes = argv[:5]
    print(json.dumps(run(endpoint, topic, group, int(messages), int(body_bytes))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
