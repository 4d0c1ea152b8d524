"""The official RocketMQ 5 Java client (``rocketmq-client-java`` 5.2.0 from Maven Central, unmodified)
against the gRPC door: its Producer sends normal, delay and FIFO messages, its SimpleConsumer
receives, acks and changes invisible durations, its PushConsumer's listener acks on SUCCESS and gets a
message again after FAILURE; and the store is the same for every door: what it sends the RocketMQ 4.x
Java client (through the remoting door) and the Python API consume, and the reverse.

The client runs in the harness ``tests/java/rocketmq5`` (built once by :mod:`bench.java_harness`);
one door of each kind serves the module's tests over one store, each test on topics of its own."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.java_harness import (
    HarnessError,
    ScenarioRun,
    harness_classpath,
    rocketmq5_classpath,
    run_scenario,
    start_rocketmq5_scenario,
)
from engine import Admin, Message, Producer, PullConsumer, PullStatus, Store
from engine.broker.dispatch import dispatch_pending
from engine.config import load_config
from engine.grpc import GrpcServer
from engine.protocol.names import PROPERTY_REAL_TOPIC, PROPERTY_TIMER_DELIVER_MS, SCHEDULE_TOPIC
from engine.remoting import RemotingServer
from engine.store import schemas

pytestmark = pytest.mark.slow

QUEUES = 2
# A receive waits at most this long here (20 s by default, as the proxy): a PushConsumer's close waits
# out its receive in flight, so each push scenario would end 20 s after its last message.
LONG_POLL_MAX_MS = 2000
_names = itertools.count()


@dataclass
class Doors:
    """The gRPC door and the RocketMQ 4 remoting door over one store."""

    store: Store
    grpc: GrpcServer
    remoting: RemotingServer

    @property
    def endpoint(self) -> str:
        return self.grpc.address


@pytest.fixture(scope="module")
def classpath() -> str:
    try:
        return rocketmq5_classpath()
    except HarnessError as exc:
        pytest.skip(f"the RocketMQ 5 Java harness cannot be built here: {exc}")


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    root = tmp_path_factory.mktemp("grpc-java") / "store"
    store = Store.open(root, config=load_config(long_poll_max_ms=LONG_POLL_MAX_MS))
    with (
        GrpcServer(store, port=0) as grpc,
        RemotingServer(store, namesrv_port=0, broker_port=0) as remoting,
    ):
        yield Doors(store, grpc, remoting)


@pytest.fixture
def topic(doors: Doors) -> str:
    """A fresh topic of ``QUEUES`` queues (the doors are shared by the module's tests)."""
    name = f"J5Topic{next(_names)}"
    Admin(doors.store).create_topic(name, QUEUES)
    return name


def java5(classpath: str, doors: Doors, tmp: Path, scenario: str, **opts: Any) -> ScenarioRun:
    """Run one scenario of the RocketMQ 5 harness against the gRPC door to its end."""
    log = tmp / f"{scenario}-{next(_names)}"
    run = start_rocketmq5_scenario(classpath, log, scenario, endpoint=doors.endpoint, **opts).finish(120)
    run.done()
    return run


def produce(classpath: str, doors: Doors, tmp: Path, topic: str, count: int, **opts: Any) -> ScenarioRun:
    run = java5(classpath, doors, tmp, "produce", topic=topic, count=count, **opts)
    assert run.of("send_failed") == [] and len(run.of("sent")) == count, run.stderr[-2000:]
    return run


def ids(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["id"] for e in events)


def pull_all(store: Store, topic: str) -> list[Any]:
    """Every message of a topic through the Python API, in queue order."""
    dispatch_pending(store)
    consumer = PullConsumer(store, "python-reader")
    out = []
    for queue_id in range(QUEUES):
        result = consumer.pull(topic, queue_id, 0, max_nums=32)
        if result.status is PullStatus.FOUND:
            out += result.messages
    return out


def test_the_java_producer_sends_and_its_simple_consumer_receives_and_acks_each_message(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    sent = produce(classpath, doors, tmp_path, topic, 4).of("sent")
    stored = {m.msg_id: m.queue_id for m in pull_all(doors.store, topic)}
    assert stored == {e["id"]: e["queue"] for e in sent}  # the queue each receipt names
    run = java5(classpath, doors, tmp_path, "simple", topic=topic, group="J5Simple", expect=4)
    received = run.of("received")
    assert ids(received) == ids(sent) == Counter({e["id"]: 1 for e in sent})
    assert ids(run.of("acked")) == ids(sent) and run.of("failed") == []
    first = next(e for e in received if e["body"] == "normal-0")
    assert (first["topic"], first["tag"], first["keys"], first["properties"], first["attempt"]) == (
        topic,
        "TagA",
        ["normal-key-0"],
        {"index": "0"},
        1,
    )


def test_a_message_made_visible_again_comes_back_at_its_next_attempt(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    sent = produce(classpath, doors, tmp_path, topic, 2).of("sent")
    # mode retry: changeInvisibleDuration(1 s) at the first attempt, ack at the second
    run = java5(classpath, doors, tmp_path, "simple", topic=topic, group="J5Retry", expect=2, mode="retry")
    attempts = defaultdict(list)
    for event in run.of("received"):
        attempts[event["id"]].append(event["attempt"])
    assert attempts == {e["id"]: [1, 2] for e in sent}
    assert ids(run.of("acked")) == ids(sent) and run.of("failed") == []


def test_an_extended_invisible_time_is_acked_with_the_handle_the_change_returned(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    sent = produce(classpath, doors, tmp_path, topic, 2).of("sent")
    run = java5(classpath, doors, tmp_path, "simple", topic=topic, group="J5Change", expect=2, mode="change")
    # The client acks with the receipt handle ChangeInvisibleDuration answered: accepted, not stale.
    assert ids(run.of("changed")) == ids(run.of("acked")) == ids(sent) and run.of("failed") == []
    again = java5(
        classpath, doors, tmp_path, "simple", topic=topic, group="J5Change", expect=1, timeout_ms=3000
    )
    assert again.of("received") == []


def test_a_delay_message_waits_in_the_schedule_topic_for_its_delivery_time(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    [sent] = produce(classpath, doors, tmp_path, topic, 1, kind="delay", delay_ms=3_600_000).of("sent")
    log = doors.store.read(schemas.COMMIT_LOG, columns=["topic", "uniq_key", "properties"]).to_pylist()
    [waiting] = [row for row in log if row["uniq_key"] == sent["id"]]
    props = dict(waiting["properties"])
    assert (waiting["topic"], props[PROPERTY_REAL_TOPIC]) == (SCHEDULE_TOPIC, topic)
    assert int(props[PROPERTY_TIMER_DELIVER_MS]) == sent["delivery_ms"]
    assert pull_all(doors.store, topic) == []


def test_a_fifo_message_group_goes_to_one_queue_in_send_order_and_comes_back_with_its_group(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    sent = produce(classpath, doors, tmp_path, topic, 6, kind="fifo", groups=2).of("sent")
    stored = {m.msg_id: m for m in pull_all(doors.store, topic)}
    assert sorted(stored) == sorted(e["id"] for e in sent)
    # Each message is stored in the queue the client chose (SipHash of its group), the queue its
    # receipt names.
    assert {e["id"]: e["queue"] for e in sent} == {e["id"]: stored[e["id"]].queue_id for e in sent}
    for group in ("fifo-g0", "fifo-g1"):
        mine = [stored[e["id"]] for e in sent if e["group"] == group]
        assert len({m.queue_id for m in mine}) == 1
        assert [m.queue_offset for m in mine] == sorted(m.queue_offset for m in mine)
    run = java5(classpath, doors, tmp_path, "simple", topic=topic, group="J5FifoReader", expect=6)
    assert {e["id"]: e["group"] for e in run.of("received")} == {e["id"]: e["group"] for e in sent}


def test_a_push_consumer_acks_on_success_and_gets_a_failed_message_again(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    sent = produce(classpath, doors, tmp_path, topic, 3).of("sent")
    run = java5(classpath, doors, tmp_path, "push", topic=topic, group="J5Push", expect=3, fail_first="true")
    assert run.done()["complete"]
    seen = defaultdict(list)
    for event in run.of("received"):
        seen[event["id"]].append((event["attempt"], event["result"]))
    assert seen == {e["id"]: [(1, "FAILURE"), (2, "SUCCESS")] for e in sent}


def test_what_the_java_5_client_sends_the_4_x_client_and_the_python_api_consume(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    sent = {e["id"]: e for e in produce(classpath, doors, tmp_path, topic, 5).of("sent")}
    pulled = pull_all(doors.store, topic)
    assert {m.msg_id: (m.body.decode(), m.tags, m.keys[0]) for m in pulled} == {
        i: (e["body"], "TagA", f"normal-key-{e['index']}") for i, e in sent.items()
    }
    run = run_scenario(
        harness_classpath(), tmp_path / "java4", "push", timeout_s=120,
        namesrv=doors.remoting.namesrv_address, topic=topic, group="J4Reader", expect=5,
    )  # fmt: skip
    assert run.done()["reached"], run.stderr[-2000:]
    assert {e["msgId"]: (e["key"], e["tags"]) for e in run.of("received")} == {
        i: (f"normal-key-{e['index']}", "TagA") for i, e in sent.items()
    }


def test_what_the_4_x_client_and_the_python_api_send_the_java_5_client_consumes(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    java4 = run_scenario(
        harness_classpath(), tmp_path / "java4", "produce", timeout_s=120,
        namesrv=doors.remoting.namesrv_address, topic=topic, mode="sync", count=3, prefix="j4",
    )  # fmt: skip
    java4.done()
    assert java4.of("send_failed") == []
    with Producer(doors.store, "PyToJava5") as producer:
        python = [
            producer.send(Message(topic, f"py-{i}".encode(), tags="TagB", keys=[f"py-key-{i}"]))
            for i in range(2)
        ]
    run = java5(classpath, doors, tmp_path, "push", topic=topic, group="J5FromOthers", expect=5)
    got = {e["keys"][0]: e for e in run.of("received")}
    assert sorted(got) == ["j4-0", "j4-1", "j4-2", "py-key-0", "py-key-1"]
    assert (got["j4-1"]["body"], got["j4-1"]["tag"], got["j4-1"]["properties"]) == (
        "body-j4-1",
        "TagA",
        {"seq": "1"},
    )
    assert [got[f"py-key-{i}"]["id"] for i in range(2)] == [r.msg_id for r in python]
    assert got["py-key-0"]["body"] == "py-0" and got["py-key-0"]["tag"] == "TagB"


def test_transactions_commit_roll_back_and_resolve_an_open_one_by_check_back(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    run = java5(classpath, doors, tmp_path, "transaction", topic=topic, count=3, check_wait_ms=20_000)
    decisions = {e["id"]: e["decision"] for e in run.of("sent")}
    assert sorted(decisions.values()) == ["commit", "open", "rollback"]
    # The open one was checked back on the producer's Telemetry stream and committed by its checker.
    assert [e["id"] for e in run.of("checked")] == [i for i, d in decisions.items() if d == "open"]
    got = java5(classpath, doors, tmp_path, "simple", topic=topic, group="J5TxReader", expect=2)
    assert sorted(e["id"] for e in got.of("received")) == sorted(
        i for i, d in decisions.items() if d != "rollback"
    )


def make_fifo_group(store: Store, group: str) -> None:
    """Declare ``group`` a FIFO consumer group (RocketMQ's ``consumeMessageOrderly``)."""
    Admin(store).update_group(group, fifo=True)


def test_a_fifo_groups_push_consumer_takes_each_message_group_in_order_retrying_its_head(
    classpath: str, doors: Doors, topic: str, tmp_path: Path
) -> None:
    make_fifo_group(doors.store, "J5Fifo")
    sent = produce(classpath, doors, tmp_path, topic, 6, kind="fifo", groups=2).of("sent")
    run = java5(classpath, doors, tmp_path, "push", topic=topic, group="J5Fifo", expect=6, fail_first="true")
    for group in ("fifo-g0", "fifo-g1"):
        order = [e["id"] for e in sent if e["group"] == group]
        seen = [(e["id"], e["result"]) for e in run.of("received") if e["group"] == group]
        # The head that failed comes again before anything after it in its group.
        assert seen == [(i, r) for i in order for r in ("FAILURE", "SUCCESS")]
