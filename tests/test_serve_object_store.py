"""``mq serve`` (RocketMQ's wire protocol) over an ``s3a://`` store, driven by Apache RocketMQ's own
Java client (the harness of ``tests/test_rocketmq_client.py``).

The server is started as a user would: ``mq serve --store s3a://... --storage-option KEY=VALUE`` for
what is not secret, the keys in the environment (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``),
so no secret is on a command line; the tests check that the secret shows in neither the process
listing nor the server's log.
"""

from __future__ import annotations

import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.java_harness import harness_classpath, run_scenario
from bench.lakemq_server import LakemqServer
from bench.seaweedfs import SeaweedS3
from engine import Admin, Message, Producer, Store
from tests.test_rocketmq_client import QUEUES, python_pull_all

pytestmark = [pytest.mark.slow, pytest.mark.s3]

# The keys travel in the environment; everything else on the command line.
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@dataclass
class Served:
    server: LakemqServer
    store: Store  # the same store, opened by the test
    secret: str
    access_key: str


def serve_command_options(options: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``--storage-option`` arguments for what is not secret, and the environment for the rest."""
    args: list[str] = []
    for key, value in options.items():
        if key not in SECRET_ENV:
            args += ["--storage-option", f"{key}={value}"]
    return args, {key: options[key] for key in SECRET_ENV}


@pytest.fixture(scope="module")
def served(
    s3_server: SeaweedS3, s3_bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    options = s3_server.storage_options()
    root = f"s3a://{s3_bucket}/serve-{uuid.uuid4().hex[:8]}"
    store = Store.open(root, storage_options=options)
    args, env = serve_command_options(options)
    work = tmp_path_factory.mktemp("serve-s3")
    with pytest.MonkeyPatch.context() as patch:  # the server process inherits the keys, not argv
        for key, value in env.items():
            patch.setenv(key, value)
        server = LakemqServer(root, work / "serve.log", extra_args=tuple(args)).__enter__()  # type: ignore[arg-type]
    try:
        assert server.namesrv, server.why
        yield Served(server, store, options["AWS_SECRET_ACCESS_KEY"], options["AWS_ACCESS_KEY_ID"])
    finally:
        server.stop()


@pytest.fixture(scope="module")
def classpath() -> str:
    return harness_classpath()


def _keys(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["key"] for e in events)


def test_java_client_sends_sync_and_batch_and_consumes_by_push_and_pull_on_an_s3a_store(
    served: Served, classpath: str, tmp_path: Path
) -> None:
    topic, group = "S3WireTopic", "S3WireGroup"
    Admin(served.store).create_topic(topic, QUEUES)
    sent: list[dict[str, Any]] = []
    for mode in ("sync", "batch"):
        run = run_scenario(
            classpath, tmp_path / "java", "produce", mode=mode, namesrv=served.server.namesrv, topic=topic,
            count=6, prefix=mode, batch_size=3,
        )  # fmt: skip
        run.done()
        assert run.of("send_failed") == [], run.of("send_failed")[:3]
        sent += run.of("sent")
    assert len(sent) == 12

    pushed = run_scenario(
        classpath, tmp_path / "java", "push", namesrv=served.server.namesrv, topic=topic, group=group,
        expect=12,
    )  # fmt: skip
    assert pushed.done()["reached"], pushed.stderr[-2000:]
    pulled = run_scenario(
        classpath, tmp_path / "java", "lite", mode="subscribe", namesrv=served.server.namesrv, topic=topic,
        group=group + "Lite", expect=12,
    )  # fmt: skip
    assert pulled.done()["reached"], pulled.stderr[-2000:]

    assert _keys(pushed.of("received")) == _keys(sent) and set(_keys(pushed.of("received")).values()) == {1}
    assert _keys(pulled.of("received")) == _keys(sent) and set(_keys(pulled.of("received")).values()) == {1}
    # Stored on S3 where each SendResult said, and readable through the Python door.
    placed = {e["key"]: (e["queueId"], e["queueOffset"]) for e in sent}
    stored = {
        m.keys[0]: (m.queue_id, m.queue_offset) for m in python_pull_all(served.store, topic, "PyS3Reader")
    }
    assert stored == placed


def test_python_sent_messages_reach_the_java_consumer_through_the_s3a_store(
    served: Served, classpath: str, tmp_path: Path
) -> None:
    topic = "S3PyToJava"
    Admin(served.store).create_topic(topic, QUEUES)
    with Producer(served.store, "PyS3Producer") as producer:
        for i in range(5):
            producer.send(Message(topic, f"body-py-{i}".encode(), tags="TagA", keys=[f"py-{i}"]))
    pushed = run_scenario(
        classpath, tmp_path / "java", "push", namesrv=served.server.namesrv, topic=topic, group="S3PyGroup",
        expect=5,
    )  # fmt: skip
    assert pushed.done()["reached"], pushed.stderr[-2000:]
    assert _keys(pushed.of("received")) == Counter(f"py-{i}" for i in range(5))


def test_the_keys_are_in_neither_the_process_listing_nor_the_serve_log(served: Served) -> None:
    listing = subprocess.run(
        ["ps", "-eo", "pgid=,args=", "--width", "100000"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    (group,) = {line.split(None, 1)[0] for line in listing if served.store.root in line and " serve " in line}
    ours = [line for line in listing if line.split(None, 1)[0] == group]  # mq serve and what it started
    assert ours and not any(served.secret in line or served.access_key in line for line in ours), ours
    assert not any(served.secret in line for line in listing)
    log = served.server.output()
    assert "s3a://" in log  # it did say where its store is
    assert served.secret not in log and served.access_key not in log
