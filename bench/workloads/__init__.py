"""The workloads of the benchmark, each measuring lakemq and its peers side by side.

Every workload function takes a :class:`Context` and returns a list of result dicts (see
:mod:`bench.report`): ``{"id", "title", "kind": "rate" | "latency", "systems": {name: measure},
"notes": [...]}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import Store

OURS = "lakemq"
BARE = "bare delta-rs"
REDIS = "Redis Streams"
ROCKETMQ = "RocketMQ"  # the real Apache RocketMQ broker, through the same Java client as lakemq's mq serve
ROCKETMQ5 = "RocketMQ 5 proxy"  # the real RocketMQ 5 proxy + broker, through the official Python client
PYTHON_API = "lakemq Python API"  # the gRPC benchmark's fallback peer when RocketMQ 5 cannot run here
SYSTEMS = (OURS, BARE, REDIS, ROCKETMQ, ROCKETMQ5, PYTHON_API)


@dataclass(frozen=True)
class Sizes:
    """How much each workload does; ``quick()`` for a smoke run, ``full()`` for the real one."""

    messages: int = 1_000_000  # the big store: batched produce, pulls, compaction
    body_bytes: int = 1024
    pulls: int = 300
    sync_sends: int = 200
    async_messages: int = 20_000
    e2e_seconds: float = 30.0
    e2e_rate: float = 20.0  # messages per second, sent one by one
    delayed_seconds: float = 20.0
    delayed_rate: float = 10.0
    # Spark replay reads a topic of this many (its own store): at 100k a fixed ~0.5 s of job planning
    # and task launch halves the rate, so the full run replays as many as the big store holds.
    replay_messages: int = 1_000_000
    replay_runs: int = 3  # the best run counts; the first also starts the Python workers
    ack_messages: int = 100_000  # SimpleConsumer receive + ack, 4 processes
    ack_single: int = 10_000  # receive(max_nums=1) + ack, one consumer
    topics_many: int = 10_000  # topics in the many-topic store
    topic_creates: int = 50  # create_topic calls timed one by one
    # RocketMQ's Java client against mq serve and the real RocketMQ broker (bench/workloads/wire.py)
    wire_threads: int = 4
    wire_sync_messages: int = 4_000
    wire_batch_messages: int = 100_000
    wire_rounds: int = 3  # RocketMQ then lakemq, this many times in turn: each figure the median
    # the official RocketMQ 5 Python client through lakemq's gRPC door and the RocketMQ 5 proxy
    grpc_messages: int = 2_000
    # writer processes racing for one commit log (bench/workloads/contention.py)
    contention_writers: int = 8
    contention_sends: int = 100  # synchronous sends per writer
    # object storage (bench/workloads/object_store.py), per profile
    s3_sync_sends: int = 100
    s3_batch_messages: int = 2_000  # messages per send_batch
    s3_batches: int = 10
    s3_async_messages: int = 5_000
    s3_pulls: int = 100
    s3_ack_messages: int = 2_000
    s3_e2e_seconds: float = 20.0  # 0: not run
    s3_e2e_rate: float = 5.0
    s3_e2e_loopback: bool = True  # also with the broker in the loopback profile (a Spark start each)
    s3_writers: int = 8
    s3_writer_sends: int = 20

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            messages=50_000,
            pulls=100,
            sync_sends=50,
            async_messages=5_000,
            e2e_seconds=10.0,
            delayed_seconds=8.0,
            replay_messages=20_000,
            ack_messages=20_000,
            ack_single=3_000,
            topics_many=2_000,
            topic_creates=20,
            wire_sync_messages=1_000,
            wire_batch_messages=10_000,
            wire_rounds=1,
            grpc_messages=300,
            contention_sends=20,
            s3_sync_sends=30,
            s3_batches=3,
            s3_async_messages=1_500,
            s3_pulls=30,
            s3_ack_messages=500,
            s3_e2e_seconds=6.0,
            s3_writer_sends=5,
            s3_e2e_loopback=False,
        )


@dataclass
class Context:
    """What the workloads share: sizes, a scratch directory, the big store, the Redis client."""

    sizes: Sizes
    workdir: Path
    redis: Any  # a redis.Redis, or None
    redis_why: str
    log: Callable[[str], None]
    big_store: Store | None = None
    big_bare_uri: str = ""
    produce_sizes: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
