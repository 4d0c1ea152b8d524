"""Apache RocketMQ's own Java client, unmodified, against lakemq's ``mq serve``.

The harness (``tests/java/harness``, built with Maven once and cached) runs DefaultMQProducer,
TransactionMQProducer, DefaultMQPushConsumer and DefaultLitePullConsumer scenarios and prints every
message it sent or received; these tests account for each one on both sides, and cross the two doors:
what Java sends Python pulls, what Python sends Java consumes.

``LAKEMQ_WIRE_PEER=rocketmq`` runs the same scenarios against the real RocketMQ broker (fetched from
Maven) instead: that is how the harness itself was checked; the checks through lakemq's Python API
are then left out.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.java_harness import ScenarioRun, harness_classpath, java, run_scenario, start_scenario
from bench.lakemq_server import LakemqServer
from bench.rocketmq_peer import RocketMQPeer
from engine import Admin, Message, Producer, PullConsumer, PullStatus, Store, TopicNotFoundError
from engine.protocol.names import retry_topic
from engine.protocol.topics import system_topic_config
from engine.store.store import now_ms

pytestmark = pytest.mark.slow

PEER = os.environ.get("LAKEMQ_WIRE_PEER", "lakemq")
README = Path(__file__).resolve().parent.parent / "README.md"
_JAVA_BLOCK = re.compile(r"<!-- test: java -->\s*\n```java\n(?P<code>.*?)\n```", re.DOTALL)
QUEUES = 4
_names = itertools.count()


@dataclass
class Broker:
    """Where the Java client connects, and (for lakemq) the store behind it."""

    namesrv: str
    store: Store | None
    peer: RocketMQPeer | None
    server: LakemqServer | None

    def create_topic(self, topic: str, queues: int = QUEUES) -> None:
        if self.store is not None:
            Admin(self.store).create_topic(topic, queues)
        elif self.peer is not None:
            self.peer.create_topic(topic, queues)

    def create_retry_topic(self, group: str) -> None:
        """``%RETRY%<group>`` made ahead, as for a group whose consumers ran before. The broker makes
        it at a new group's first heartbeat, after the client looked its route up, so a new client
        finds it only at its next rebalance (RocketMQ's clients rebalance every 20 s): the retry
        tests would wait that out. The real broker is left as it is."""
        if self.store is not None:
            self.store.put_topic(system_topic_config(retry_topic(group), now_ms()))


@pytest.fixture(scope="module")
def classpath() -> str:
    return harness_classpath()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    work = tmp_path_factory.mktemp("wire")
    if PEER == "rocketmq":
        with RocketMQPeer(work) as peer:
            assert peer.namesrv, peer.why
            yield Broker(peer.namesrv, None, peer, None)
        return
    root = work / "store"
    store = Store.open(str(root))
    with LakemqServer(root, work / "serve.log") as server:
        assert server.namesrv, server.why
        yield Broker(server.namesrv, store, None, server)


@pytest.fixture
def names() -> tuple[str, str]:
    """A fresh topic and group for one test (the server is shared by the module's tests)."""
    n = next(_names)
    return f"Wire{n}Topic", f"Wire{n}Group"


def produce(
    classpath: str, broker: Broker, tmp: Path, topic: str, mode: str, count: int, **opts: Any
) -> ScenarioRun:
    run = run_scenario(
        classpath, tmp / "java", "produce", mode=mode, namesrv=broker.namesrv, topic=topic, count=count,
        prefix=opts.pop("prefix", mode), **opts,
    )  # fmt: skip
    run.done()
    assert run.of("send_failed") == [], run.of("send_failed")[:3]
    return run


def push(
    classpath: str, broker: Broker, tmp: Path, topic: str, group: str, expect: int, **opts: Any
) -> ScenarioRun:
    run = run_scenario(
        classpath,
        tmp / "java",
        "push",
        namesrv=broker.namesrv,
        topic=topic,
        group=group,
        expect=expect,
        **opts,
    )
    done = run.done()
    got = sorted({e["key"] for e in run.of("received")})
    assert done["reached"], f"received {done['received']} of {expect}: {got}\n{run.stderr[-2000:]}"
    return run


def keys(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["key"] for e in events)


def committed_offsets(store: Store, topic: str, group: str, wanted: dict[int, int]) -> dict[int, int | None]:
    """The group's committed offsets of the queues in ``wanted``, once they equal ``wanted`` or after
    30 s: the client's last UPDATE_CONSUMER_OFFSET is one-way, sent as it shuts down, and the server
    commits it after the Java process has exited."""
    consumer = PullConsumer(store, group)
    deadline = time.monotonic() + 30
    while True:
        got = {q: consumer.committed_offset(topic, q) for q in wanted}
        if got == wanted or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def python_pull_all(store: Store, topic: str, group: str) -> list[Any]:
    """Every message of a topic through lakemq's Python PullConsumer."""
    consumer = PullConsumer(store, group)
    out = []
    for queue_id in range(QUEUES):
        offset = 0
        while True:
            result = consumer.pull(topic, queue_id, offset, max_nums=32)
            if result.status is not PullStatus.FOUND:
                break
            out += result.messages
            offset = result.next_begin_offset
    return out


def test_every_send_mode_stores_each_message_once_where_its_send_result_says(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    topic, group = names
    broker.create_topic(topic)
    sent: list[dict[str, Any]] = []
    for mode in ("sync", "async", "oneway", "batch"):
        sent += produce(classpath, broker, tmp_path, topic, mode, 6, batch_size=4).of("sent")
    assert len(sent) == 24

    got = push(classpath, broker, tmp_path, topic, group, 24).of("received")

    assert keys(got) == keys(sent) and set(keys(got).values()) == {1}
    placed = {e["key"]: (e["queueId"], e["queueOffset"], e["msgId"]) for e in sent if e["status"] != "ONEWAY"}
    assert len(placed) == 18
    for event in got:
        assert event["topic"] == topic and event["tags"] == "TagA" and event["reconsumeTimes"] == 0
        assert event["body"] == f"body-{event['key']}"
        if event["key"] in placed:
            assert (event["queueId"], event["queueOffset"], event["msgId"]) == placed[event["key"]]
    if broker.store is not None:  # the same messages through the Python door
        pulled = python_pull_all(broker.store, topic, "PyReaderOf" + group)
        assert Counter(m.keys[0] for m in pulled) == keys(sent)
        by_key = {m.keys[0]: m for m in pulled}
        for key, (queue_id, offset, msg_id) in placed.items():
            assert (by_key[key].queue_id, by_key[key].queue_offset, by_key[key].uniq_key) == (
                queue_id,
                offset,
                msg_id,
            )
            assert (
                by_key[key].body == f"body-{key}".encode()
                and by_key[key].properties["seq"] == key.split("-")[1]
            )


def test_python_sent_messages_are_consumed_by_the_java_push_consumer(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    if broker.store is None:
        pytest.skip("the real RocketMQ broker has no Python door")
    topic, group = names
    broker.create_topic(topic)
    with Producer(broker.store, "PyWireProducer") as producer:
        results = [
            producer.send(
                Message(
                    topic, f"body-py-{i}".encode(), tags="TagA", keys=[f"py-{i}"], properties={"seq": str(i)}
                )
            )
            for i in range(10)
        ]

    got = push(classpath, broker, tmp_path, topic, group, 10).of("received")

    assert keys(got) == Counter(f"py-{i}" for i in range(10))
    by_key = {e["key"]: e for e in got}
    for i, result in enumerate(results):
        event = by_key[f"py-{i}"]
        assert (event["msgId"], event["queueId"], event["queueOffset"]) == (
            result.msg_id,
            result.queue_id,
            result.queue_offset,
        )
        assert event["body"] == f"body-py-{i}" and event["seq"] == str(i)


def test_clustering_consumers_share_the_queues_and_each_message_goes_to_one(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    topic, group = names
    broker.create_topic(topic)
    consumers = start_scenario(
        classpath,
        tmp_path / "java",
        "push",
        namesrv=broker.namesrv,
        topic=topic,
        group=group,
        expect=40,
        instances=2,
    )
    started = consumers.wait_for("started")
    assert started["settled"], started
    owned = {name: set(queues) for name, queues in started["assignments"].items()}
    assert len(owned) == 2 and all(owned.values()) and set.union(*owned.values()) == set(range(QUEUES))

    sent = produce(classpath, broker, tmp_path, topic, "sync", 40).of("sent")
    run = consumers.finish()
    assert run.done()["reached"]
    got = run.of("received")

    assert keys(got) == keys(sent) and set(keys(got).values()) == {1}
    for event in got:
        assert event["queueId"] in owned[event["instance"]]


def test_broadcasting_consumers_each_receive_every_message(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    topic, group = names
    broker.create_topic(topic)
    consumers = start_scenario(
        classpath, tmp_path / "java", "push", namesrv=broker.namesrv, topic=topic, group=group, expect=24,
        instances=2, model="broadcasting",
    )  # fmt: skip
    assert consumers.wait_for("started")["settled"]
    sent = produce(classpath, broker, tmp_path, topic, "sync", 12).of("sent")
    run = consumers.finish()
    assert run.done()["reached"]

    by_instance: dict[str, Counter[str]] = defaultdict(Counter)
    for event in run.of("received"):
        by_instance[event["instance"]][event["key"]] += 1
    assert len(by_instance) == 2
    for received in by_instance.values():
        assert received == keys(sent)


def test_orderly_consumer_sees_each_selector_ordered_queue_in_send_order(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    topic, group = names
    broker.create_topic(topic)
    sent = produce(classpath, broker, tmp_path, topic, "ordered", 30, orders=3).of("sent")
    queue_of_order = {e["order"]: e["queueId"] for e in sent}
    assert all(queue_of_order[e["order"]] == e["queueId"] for e in sent) and len(queue_of_order) == 3

    got = push(classpath, broker, tmp_path, topic, group, 30, listener="orderly").of("received")

    assert keys(got) == keys(sent) and set(keys(got).values()) == {1}
    per_order: dict[str, list[int]] = defaultdict(list)
    for event in got:
        per_order[event["order"]].append(int(event["seq"]))
    for order, seqs in per_order.items():
        assert seqs == sorted(seqs) and len(seqs) == 10, (order, seqs)


def test_delay_level_message_is_delivered_after_its_level_and_not_before(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    topic, group = names
    broker.create_topic(topic)
    sent = produce(classpath, broker, tmp_path, topic, "delay", 3, delay_level=2).of("sent")  # level 2: 5 s

    got = push(classpath, broker, tmp_path, topic, group, 3, timeout_ms=90_000).of("received")

    assert keys(got) == keys(sent)
    born = {e["key"]: e["bornMs"] for e in sent}
    for event in got:
        # stored again into its real topic when due: the delivered copy's store time is past the delay
        assert event["storeMs"] - born[event["key"]] >= 5000 - 50, event
        assert event["topic"] == topic


def test_transactions_commit_roll_back_and_resolve_unknown_by_check_back(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    topic, group = names
    broker.create_topic(topic)
    run = run_scenario(
        classpath, tmp_path / "java", "transaction", namesrv=broker.namesrv, topic=topic, count=9,
        prefix="tx", group="TxProducer" + group, check_wait_ms=120_000,
    )  # fmt: skip
    done = run.done()
    states = {e["key"]: e["localState"] for e in run.of("sent")}
    assert len(states) == 9 and run.of("send_failed") == []
    unknown = {k for k, s in states.items() if s == "UNKNOW"}
    assert unknown == {"tx-2", "tx-5", "tx-8"} and done["checked"] == 3
    assert {e["key"] for e in run.of("checked")} == unknown  # no check-back for decided ones

    visible = {k for k, s in states.items() if s != "ROLLBACK_MESSAGE"}
    got = push(classpath, broker, tmp_path, topic, group, len(visible), linger_ms=3000).of("received")
    assert keys(got) == Counter(visible)


def test_reconsume_later_retries_through_the_retry_topic_then_dead_letters(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    topic, group = names
    broker.create_topic(topic)
    broker.create_retry_topic(group)
    sent = produce(classpath, broker, tmp_path, topic, "sync", 3, prefix="dl").of("sent")

    # always RECONSUME_LATER, retries at delay level 1 (1 s), at most 2 reconsumes: 3 deliveries each
    got = push(
        classpath, broker, tmp_path, topic, group, 9, fail_until=99, retry_delay_level=1, max_reconsume=2,
        timeout_ms=120_000, linger_ms=3000,
    ).of("received")  # fmt: skip

    tries: dict[str, list[int]] = defaultdict(list)
    for event in got:
        tries[event["key"]].append(event["reconsumeTimes"])
        assert event["topic"] == topic  # the client restores the real topic of a retried message
        if event["reconsumeTimes"]:
            assert event["retryTopic"] == topic
    assert {k: sorted(v) for k, v in tries.items()} == {e["key"]: [0, 1, 2] for e in sent}
    if broker.store is not None:
        dead = Admin(broker.store).dlq_messages(group)
        assert sorted(m.keys[0] for m in dead) == sorted(e["key"] for e in sent)
        assert {m.properties.get("RETRY_TOPIC") for m in dead} == {topic}


def test_a_retried_message_that_then_succeeds_is_not_dead_lettered(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    topic, group = names
    broker.create_topic(topic)
    broker.create_retry_topic(group)
    produce(classpath, broker, tmp_path, topic, "sync", 2, prefix="once")

    got = push(
        classpath, broker, tmp_path, topic, group, 4, fail_until=1, retry_delay_level=1, timeout_ms=90_000,
        linger_ms=3000,
    ).of("received")  # fmt: skip

    assert sorted((e["key"], e["reconsumeTimes"]) for e in got) == [
        ("once-0", 0),
        ("once-0", 1),
        ("once-1", 0),
        ("once-1", 1),
    ]
    if broker.store is not None:
        assert Admin(broker.store).dlq_messages(group) == []


@pytest.mark.parametrize("mode", ["subscribe", "assign"])
def test_lite_pull_consumer_reads_everything_once_and_commits_its_offsets(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path, mode: str
) -> None:
    topic, group = names
    broker.create_topic(topic)
    sent = produce(classpath, broker, tmp_path, topic, "sync", 20).of("sent")

    run = run_scenario(
        classpath,
        tmp_path / "java",
        "lite",
        mode=mode,
        namesrv=broker.namesrv,
        topic=topic,
        group=group,
        expect=20,
    )
    assert run.done()["reached"]
    got = run.of("received")

    assert keys(got) == keys(sent) and set(keys(got).values()) == {1}
    ends: dict[int, int] = defaultdict(int)
    for event in sent:
        ends[event["queueId"]] = max(ends[event["queueId"]], event["queueOffset"] + 1)
    if mode == "assign":
        assert {e["queueId"]: e["offset"] for e in run.of("committed") if e["queueId"] in ends} == ends
    if broker.store is not None:  # the offsets the client committed are the group's in the store
        assert committed_offsets(broker.store, topic, group, ends) == ends


def test_readme_java_example_produces_and_consumes_through_the_server(
    classpath: str, broker: Broker, tmp_path: Path
) -> None:
    (code,) = [m.group("code") for m in _JAVA_BLOCK.finditer(README.read_text())]
    (tmp_path / "Example.java").write_text(code)
    javac = shutil.which("javac")
    assert javac is not None, "javac (a JDK 17) is needed"
    subprocess.run(
        [javac, "-cp", classpath, "-d", str(tmp_path / "classes"), str(tmp_path / "Example.java")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    broker.create_topic("OrderTopic")
    # the route known before the example's first send (see Producers.awaitRoute in the harness)
    produce(classpath, broker, tmp_path, "OrderTopic", "sync", 0)

    full_classpath = f"{tmp_path / 'classes'}{os.pathsep}{classpath}"
    done = subprocess.run(
        [java(), "-Xmx256m", f"-Duser.home={tmp_path}", "-cp", full_classpath, "Example", broker.namesrv],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert sum(line.startswith("sent ") for line in lines) == 3
    assert sorted(line for line in lines if line.startswith("received")) == [
        f"received order-{i}: hello {i}" for i in range(3)
    ]
    if broker.store is not None:
        pulled = python_pull_all(broker.store, "OrderTopic", "PyReaderOfExample")
        assert sorted((m.keys[0], m.body) for m in pulled) == [
            (f"order-{i}", f"hello {i}".encode()) for i in range(3)
        ]


def wait_events(scenario: Any, ready: Any, timeout_s: float = 60) -> list[dict[str, Any]]:
    """The scenario's events once ``ready(events)`` holds; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = list(scenario.events)
        if ready(events):
            return events
        assert time.monotonic() < deadline, f"gave up waiting; last events {events[-5:]}"
        assert scenario.proc.poll() is None, f"the scenario ended: {events[-5:]}"
        time.sleep(0.1)


def owned_now(events: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Each consumer's queues, as its latest "owned" event says."""
    out: dict[str, list[int]] = {}
    for event in events:
        if event.get("event") == "owned":
            out[event["instance"]] = event["queues"]
    return out


def test_a_killed_consumers_queues_are_taken_by_the_other_without_waiting_for_a_rebalance_round(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    """Two JVMs of one group whose own rebalance timer is 2 minutes: when one is SIGKILLed, the
    broker's NOTIFY_CONSUMER_IDS_CHANGED (RocketMQ's doChannelCloseEvent) makes the other take
    every queue at once."""
    topic, group = names
    broker.create_topic(topic)
    common: dict[str, Any] = dict(
        namesrv=broker.namesrv, topic=topic, group=group, expect=10**6, timeout_ms=300_000,
        report_ms=100, rebalance_interval_ms=120_000,
    )  # fmt: skip
    first = start_scenario(classpath, tmp_path / "a", "push", settle_ms=20_000, **common)
    second = None
    try:
        assert first.wait_for("started")["settled"]
        second = start_scenario(classpath, tmp_path / "b", "push", settle_ms=1, **common)
        second.wait_for("started")
        shared = wait_events(first, lambda ev: [len(q) for q in owned_now(ev).values()] == [2])
        [mine] = owned_now(shared).values()
        wait_events(
            second,
            lambda ev: list(owned_now(ev).values()) == [sorted(set(range(QUEUES)) - set(mine))],
        )

        second.proc.kill()  # SIGKILL: no unregister, only the connection drops
        killed_at = time.monotonic()
        wait_events(first, lambda ev: list(owned_now(ev).values()) == [list(range(QUEUES))], timeout_s=60)
        taken_s = time.monotonic() - killed_at
    finally:
        for scenario in (first, second):
            if scenario is not None:
                scenario.proc.kill()
                scenario.finish()
    # The client's own rebalance would come after 120 s: seconds mean the broker told it.
    assert taken_s < 30, taken_s


def test_a_group_reset_reaches_the_running_java_consumer_which_consumes_again(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    """``mq group reset`` (Admin.reset_offset_by_time) on the store a running ``mq serve`` serves:
    the server pushes RESET_CONSUMER_CLIENT_OFFSET, the Java push consumer consumes everything
    again, and its offset reports from before the reset do not overwrite it.

    The client's periodic rebalance (every 20 s) is put off past the test: the client follows a
    reset by sleeping 10 s and then rebalancing on the reset's thread (``MQClientInstance.resetOffset``,
    ``resume``), which this test's timing lands about 20 s after the consumer's start, when the
    periodic rebalance runs too; two rebalances adding a queue at once let the later one set the
    queue's offset to what the broker held before the first one's consumption (``READ_FROM_STORE``
    overwrites), and the queue ends where the reset left it, on RocketMQ's broker as well. A
    rebalance the server wakes (NOTIFY_CONSUMER_IDS_CHANGED) still runs: the server must not
    send one while the client follows a reset."""
    if broker.store is None:
        pytest.skip("the reset is made through lakemq's Python door")
    store = broker.store
    topic, group = names
    broker.create_topic(topic)
    with Producer(store, "PyWireProducer") as producer:
        placed = Counter(
            producer.send(Message(topic, f"body-{i}".encode(), keys=[f"r-{i}"])).queue_id for i in range(20)
        )
    log_dir = tmp_path / "java"
    consumer = start_scenario(
        classpath, log_dir, "push", namesrv=broker.namesrv, topic=topic, group=group, expect=40,
        timeout_ms=120_000, linger_ms=2000,
        properties={"rocketmq.client.rebalance.waitInterval": "600000", "rocketmq.client.logLevel": "INFO"},
    )  # fmt: skip
    try:
        wait_events(consumer, lambda ev: len([e for e in ev if e.get("event") == "received"]) >= 20)
        # Its progress reached the store (a report every 5 s), so the reset really moves it back.
        assert committed_offsets(store, topic, group, dict(placed)) == dict(placed)
        Admin(store).reset_offset_by_time(group, topic, 0)
        run = consumer.finish(timeout_s=180)
    finally:
        consumer.proc.kill()
    assert run.done()["reached"], run.stderr[-2000:]
    assert keys(run.of("received")) == Counter({f"r-{i}": 2 for i in range(20)})
    assert committed_offsets(store, topic, group, dict(placed)) == dict(placed), rebalance_lines(log_dir)


def rebalance_lines(log_dir: Path) -> str:
    """The Java client's log lines on rebalances, resets and offsets (to tell a failure's cause)."""
    wanted = ("doRebalance", "reset", "suspend", "resume", "notification", "persist", "already exists")
    log = log_dir / "rocketmq_client.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(line[:220] for line in lines if any(w in line for w in wanted))


def test_a_producer_with_message_trace_on_stores_its_trace_records(
    classpath: str, broker: Broker, names: tuple[str, str], tmp_path: Path
) -> None:
    """``new DefaultMQProducer(group, true)``: the client sends a trace record of each send to
    ``RMQ_SYS_TRACE_TOPIC``, whose route the server makes and whose sends it accepts. The producer
    stays up while the test looks (its shutdown drops the trace sends still in flight, on RocketMQ's
    broker too)."""
    if broker.store is None:
        pytest.skip("the trace records are read through lakemq's Python door")
    topic, _ = names
    broker.create_topic(topic)
    release = tmp_path / "release"
    producing = start_scenario(
        classpath, tmp_path / "java", "produce", mode="sync", namesrv=broker.namesrv, topic=topic, count=3,
        trace="true", prefix="traced", hold_file=release,
    )  # fmt: skip
    try:
        producing.wait_for("holding")
        assert not [e for e in producing.events if e.get("event") == "send_failed"]
        wanted = {e["key"] for e in producing.events if e.get("event") == "sent"}
        assert len(wanted) == 3
        reader = PullConsumer(broker.store, "TraceReader")
        deadline = time.monotonic() + 60
        found: set[str] = set()
        while not wanted <= found and time.monotonic() < deadline:
            try:
                result = reader.pull("RMQ_SYS_TRACE_TOPIC", 0, 0, max_nums=32)
            except TopicNotFoundError:  # made at the client's first route look-up of the topic
                messages = []
            else:
                messages = result.messages if result.status is PullStatus.FOUND else []
            bodies = b"".join(m.body for m in messages)
            found = {key for key in wanted if key.encode() in bodies}
            time.sleep(0.2)
    finally:
        release.touch()
        ended = producing.finish()
    assert found == wanted
    ended.done()  # the producer shut down cleanly once let go
