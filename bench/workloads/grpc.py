"""RocketMQ 5's gRPC door (issue 29's target): the official Python client (``rocketmq-python-client``,
unmodified) against lakemq's ``mq serve --grpc`` and against the real RocketMQ 5 proxy with its broker
(from Maven, :mod:`bench.rocketmq5_peer`), in the same run; the ratios are stated, not judged.

The client runs :mod:`bench.official_client` in a process of its own: synchronous sends of 1 KiB one
after another, then one SimpleConsumer receiving batches of 32 and acking each message. RocketMQ runs
first and is stopped before lakemq starts, so the two never share the CPU. When the proxy cannot run
here, lakemq's own Python API (Producer.send, SimpleConsumer receive + ack, in process) is the peer
instead, and the report says why.

* ``grpc_send``: one synchronous send's latency; ``grpc_send_rate``: those sends' throughput;
* ``grpc_receive_ack``: receive + ack throughput.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.java_harness import ROOT, HarnessError
from bench.lakemq_server import LakemqServer
from bench.peers import free_port
from bench.rocketmq5_peer import RocketMQ5Peer
from bench.stats import Measure, latency, rate, unavailable
from bench.workloads import OURS, PYTHON_API, ROCKETMQ5, Context
from bench.workloads.produce import open_store
from engine import Admin, Message, Producer, SimpleConsumer

TOPIC = "GrpcBench"
GROUP = "GrpcBenchGroup"
QUEUES = 4
CLIENT_TIMEOUT_S = 1800
WORKLOADS = (
    ("grpc_send", "RocketMQ 5 official Python client: one synchronous send, 1 KiB", "latency"),
    ("grpc_send_rate", "RocketMQ 5 official Python client: synchronous sends one after another", "rate"),
    ("grpc_receive_ack", "RocketMQ 5 official Python client: SimpleConsumer receive (32) + ack each", "rate"),
)


def measures(out: dict[str, Any]) -> dict[str, Measure]:
    """The three measures of one system from what :mod:`bench.official_client` printed."""
    sent = len(out["send_ms"])
    got: dict[str, Measure] = {
        "grpc_send": latency(out["send_ms"]) if sent else unavailable("no send succeeded"),
        "grpc_send_rate": rate(sent, out["send_s"]),
        "grpc_receive_ack": rate(out["received"], out["receive_s"]),
    }
    if out["send_failures"]:
        for key in ("grpc_send", "grpc_send_rate"):
            got[key]["failures"] = out["send_failures"]
    if out["received"] < sent:
        got["grpc_receive_ack"]["missing"] = sent - out["received"]
    return got


def run_client(endpoint: str, messages: int, body_bytes: int) -> dict[str, Measure]:
    """The official client's run against ``endpoint``, as measures."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.official_client", endpoint, TOPIC, GROUP, str(messages),
         str(body_bytes)],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        raise HarnessError(f"the official client failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return measures(json.loads(done.stdout.strip().splitlines()[-1]))


def _all_unavailable(why: str) -> dict[str, Measure]:
    return {w[0]: unavailable(why) for w in WORKLOADS}


def _rocketmq5(ctx: Context) -> tuple[dict[str, Measure], str, str]:
    """RocketMQ 5's measures, its version, and why it did not run ("" when it did)."""
    with RocketMQ5Peer(ctx.workdir / "rocketmq5") as peer:
        if not peer.endpoint:
            return {}, peer.version, f"RocketMQ 5 did not start: {peer.why[:300]}"
        try:
            peer.create_topic(TOPIC, QUEUES)
            return run_client(peer.endpoint, ctx.sizes.grpc_messages, ctx.sizes.body_bytes), peer.version, ""
        except HarnessError as exc:
            return {}, peer.version, f"RocketMQ 5 run failed: {str(exc)[:300]}"


def _grpc_ready(port: int, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def _lakemq(ctx: Context) -> dict[str, Measure]:
    root = ctx.workdir / "grpc-store"
    Admin(open_store(root)).create_topic(TOPIC, QUEUES)
    port = free_port()
    args = ("--grpc", "--grpc-port", str(port))
    with LakemqServer(root, ctx.workdir / "grpc-serve.log", extra_args=args) as server:
        if not server.namesrv or not _grpc_ready(port):
            raise HarnessError(server.why or f"mq serve --grpc did not open port {port}")
        return run_client(f"127.0.0.1:{port}", ctx.sizes.grpc_messages, ctx.sizes.body_bytes)


def python_api(store_root: Path, messages: int, body_bytes: int) -> dict[str, Measure]:
    """The fallback peer: the same sends and receive + ack through lakemq's Python API in process."""
    store = open_store(store_root)
    Admin(store).create_topic(TOPIC, QUEUES)
    body = b"x" * body_bytes
    send_ms: list[float] = []
    with Producer(store, "GrpcBenchPython") as producer:
        began = time.perf_counter()
        for i in range(messages):
            t = time.perf_counter()
            producer.send(Message(TOPIC, body, keys=[f"k{i}"]))
            send_ms.append((time.perf_counter() - t) * 1000)
        send_s = time.perf_counter() - began
    consumer = SimpleConsumer(store, GROUP, "bench")
    consumer.subscribe(TOPIC)
    received = idle = 0
    try:
        began = time.perf_counter()
        while received < messages and idle < 10:
            got = consumer.receive(32, 60_000, wait_ms=1000)
            idle = 0 if got else idle + 1
            for message in got:
                consumer.ack(message)
            received += len(got)
        receive_s = time.perf_counter() - began
    finally:
        consumer.close()
    out = {"send_ms": send_ms, "send_s": send_s, "send_failures": 0, "received": received}
    return measures({**out, "receive_s": receive_s})


def grpc(ctx: Context) -> list[dict[str, Any]]:
    """The three gRPC workloads, lakemq beside the RocketMQ 5 proxy (or the Python API, said why)."""
    theirs, version, why = _rocketmq5(ctx)
    peer = ROCKETMQ5
    if why:
        ctx.log(f"{why}; the peer is lakemq's Python API instead")
        peer = PYTHON_API
        theirs = python_api(ctx.workdir / "grpc-python", ctx.sizes.grpc_messages, ctx.sizes.body_bytes)
    ctx.log(f"{peer} {version}: {theirs}")
    try:
        ours = _lakemq(ctx)
    except HarnessError as exc:
        ours = _all_unavailable(f"mq serve --grpc run failed: {str(exc)[:300]}")
    ctx.log(f"lakemq mq serve --grpc: {ours}")
    ctx.extra["rocketmq5_proxy"] = version if not why else f"not available ({why[:200]})"
    s = ctx.sizes
    note = (
        f"The official RocketMQ 5 Python client (rocketmq-python-client, unmodified) in one process: "
        f"{s.grpc_messages:,} synchronous sends of {s.body_bytes} B one after another, then one "
        "SimpleConsumer receiving batches of 32 (invisible 60 s) and acking each message; lakemq is "
        "`mq serve --grpc` with its broker loop over a local store; "
        + (
            f"RocketMQ is the real proxy {version} in LOCAL mode (its broker in the proxy's process, 768 MiB "
            "heap, async flush) and name server, from Maven, not sharing the CPU with lakemq."
            if not why
            else f"the peer is lakemq's own Python API in process, because {why[:200]}."
        )
    )
    return [
        {
            "id": wid,
            "title": title,
            "kind": kind,
            "notes": [note],
            "systems": {OURS: ours[wid], peer: theirs[wid]},
        }
        for wid, title, kind in WORKLOADS
    ]
