"""Where the requests of send -> pullable on S3 go: the broker and the client behind proxies of their
own, every request recorded and classified (by process, method and path pattern), idle and while
sending.

Usage: ``python -m bench.s3_e2e_profile [--rtt-ms 20] [--seconds 20] [--rate 5] [--idle-s 10]``.
Prints one JSON document: the end-to-end latency, and per side (broker, client) the requests per
second idle and per message while sending, by kind.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.s3proxy import S3Proxy
from bench.seaweedfs import SeaweedS3
from bench.workloads import flow as flow_workload
from engine import Admin, EngineConfig, Message, Producer, PullConsumer, Store
from engine.config import STORAGE_ENV_PREFIX

_KINDS: tuple[tuple[str, str, str], ...] = (
    # (kind, method, path regex searched in "target")
    ("list _delta_log", "GET", r"[?&]list-type=2"),
    ("GET _last_checkpoint", "GET", r"_delta_log/_last_checkpoint"),
    ("GET commit json", "GET", r"_delta_log/\d{20}\.json"),
    ("GET checkpoint parquet", "GET", r"_delta_log/.*\.parquet"),
    ("GET data parquet", "GET", r"\.parquet"),
    ("PUT commit json", "PUT", r"_delta_log/\d{20}\.json"),
    ("PUT", "PUT", r""),
    ("HEAD", "HEAD", r""),
    ("GET other", "GET", r""),
    ("other", "", r""),
)


def kind_of(request: str) -> str:
    """The kind of one recorded request (``"METHOD target"``)."""
    method, _, target = request.partition(" ")
    for kind, want, pattern in _KINDS:
        if want and want != method:
            continue
        if re.search(pattern, target):
            return kind
    return "other"


def table_of(request: str) -> str:
    """The store table a request touches (the path segment before ``_delta_log`` or the data file)."""
    target = request.partition(" ")[2]
    m = re.search(r"prefix=([^&]*)", target)
    path = m.group(1).replace("%2F", "/") if m else target.split("?")[0]
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        if part == "_delta_log" and i > 0:
            return parts[i - 1]
    return parts[-2] if len(parts) > 2 else "?"


_DUMP: list[Path | None] = [None]


def breakdown(seen: list[str], per: float, name: str = "") -> dict[str, Any]:
    """Requests by kind and by table, divided by ``per`` (seconds or messages)."""
    if _DUMP[0] is not None and name:
        _DUMP[0].mkdir(parents=True, exist_ok=True)
        (_DUMP[0] / f"{name}.txt").write_text("\n".join(seen))
    kinds = Counter(kind_of(r) for r in seen)
    tables = Counter(table_of(r) for r in seen)
    return {
        "total": round(len(seen) / per, 1),
        "by_kind": {k: round(v / per, 1) for k, v in kinds.most_common()},
        "by_table": {k: round(v / per, 1) for k, v in tables.most_common()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--dump", type=Path, default=None, help="write every recorded request here")
    args = parser.parse_args(argv)
    _DUMP[0] = args.dump
    work = Path(tempfile.mkdtemp(prefix="s3-e2e-profile-"))
    out: dict[str, Any] = {"rtt_ms": args.rtt_ms}
    with (
        SeaweedS3(work / "seaweed") as server,
        S3Proxy(server.endpoint, delay_ms=args.rtt_ms) as broker_proxy,
        S3Proxy(server.endpoint, delay_ms=args.rtt_ms) as client_proxy,
    ):
        bucket = server.create_bucket()
        root = f"s3://{bucket}/flow-{uuid.uuid4().hex[:6]}"
        options = server.storage_options(endpoint=client_proxy.endpoint)
        store = Store.open(root, storage_options=options, config=EngineConfig(store=root))
        Admin(store).create_topic(flow_workload.E2E_TOPIC, 1)
        env = {
            STORAGE_ENV_PREFIX + k: v
            for k, v in server.storage_options(endpoint=broker_proxy.endpoint).items()
        }
        count = max(1, int(args.seconds * args.rate))
        with (
            flow_workload.Broker(root, work / "broker.log", env=env) as broker,
            Producer(store, "Profile") as producer,
        ):
            follower = flow_workload.QueueFollower(PullConsumer(store, "ProfileE2E"), flow_workload.E2E_TOPIC)
            producer.send(
                Message(flow_workload.E2E_TOPIC, flow_workload.encode(flow_workload.PROBE, 64)), queue_id=0
            )
            out["ready_s"] = round(follower.wait_for(flow_workload.PROBE, 600, broker.check), 1)
            time.sleep(3)
            # idle: the broker alone, then the consumer's long poll alone
            broker_proxy.record(True)
            time.sleep(args.idle_s)
            out["broker_idle_per_s"] = breakdown(broker_proxy.record(False), args.idle_s, "broker_idle_per_s")
            client_proxy.record(True)
            began = time.monotonic()
            while time.monotonic() - began < args.idle_s:
                follower.poll()
            out["client_idle_poll_per_s"] = breakdown(
                client_proxy.record(False), args.idle_s, "client_idle_poll_per_s"
            )

            def send(i: int) -> float:
                at = flow_workload.now_ms()
                body = flow_workload.encode(i, args.body_bytes)
                producer.send(Message(flow_workload.E2E_TOPIC, body), queue_id=0)
                return at

            def poll() -> list[int]:
                broker.check()
                return follower.poll()

            broker_proxy.record(True)
            client_proxy.record(True)
            measure = flow_workload.delays_of(*flow_workload.drive(count, args.rate, send, poll, 20.0))
            out["broker_per_msg"] = breakdown(broker_proxy.record(False), count, "broker_per_msg")
            out["client_per_msg"] = breakdown(client_proxy.record(False), count, "client_per_msg")
            out["e2e"] = measure
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
