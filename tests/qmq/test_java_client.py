"""The unmodified QMQ Java client (``com.qunar.qmq:qmq`` 1.1.43 from Maven Central) against the QMQ
door: a producer's synchronous sends reach a consumer whose listener acks on success, every
message accounted for on both sides and in the action log; and what a QMQ producer sent is read by
the Python API.

The client runs in the harness ``tests/java/qmq`` (built once by :mod:`bench.java_harness`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.java_harness import HarnessError, java, qmq_classpath, start_qmq_scenario
from engine import Admin, Message, Producer, PullConsumer, Store
from engine.broker.loop import BrokerLoop
from engine.protocol.actions import ACK, PULL
from engine.protocol.names import SCHEDULE_TOPIC
from engine.protocol.qmq import qmq_dead_subject, qmq_retry_subject, qmq_store_group
from engine.qmq import QmqServer, codec
from engine.qmq.messages import P_EXPIRE, attributes
from engine.store import schemas
from engine.store.action_log import read_actions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def classpath() -> str:
    try:
        return qmq_classpath()
    except HarnessError as exc:
        pytest.skip(f"the QMQ harness cannot be built here: {exc}")


def offsets(rows: list[dict[str, object]], consumer_suffix: str) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for r in rows:
        if not str(r["consumer_id"]).endswith(consumer_suffix):
            continue
        start = int(r["queue_offset"])  # type: ignore[call-overload]
        end = r["end_offset"]
        out |= {(int(r["queue_id"]), o) for o in range(start, start + 1 if end is None else int(end))}  # type: ignore[call-overload]
    return out


def wait_subscribed(server: QmqServer, subject: str, group: str) -> None:
    """Wait until a consumer of the group registered (a new group starts at the latest message)."""
    wait_until(lambda: bool(server.consumers_of(subject, group)), f"a consumer of {group} registered")


def test_a_java_producer_and_consumer_account_for_every_message(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    Admin(store).create_topic("qmq_orders", 4)
    count = 20
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        meta = server.meta_server_url
        consumer = start_qmq_scenario(
            classpath,
            tmp_path / "consumer",
            "consume",
            meta=meta,
            subject="qmq_orders",
            group="billing",
            count=count,
            timeout_ms=120_000,
        )
        consumer.wait_for("ready")
        wait_subscribed(server, "qmq_orders", "billing")
        produced = start_qmq_scenario(
            classpath, tmp_path / "producer", "produce", meta=meta, subject="qmq_orders", count=count
        ).finish(300)
        consumed = consumer.finish(300)
    assert produced.done() == {"event": "done", "sent": count, "failed": 0}
    sent = {e["id"]: e["payload"] for e in produced.of("sent")}
    assert len(sent) == count
    done = consumed.done()
    assert done["complete"] and done["received"] == count
    assert {e["id"]: e["payload"] for e in consumed.of("received")} == sent
    assert {e["subject"] for e in consumed.of("received")} == {"qmq_orders"}
    # Every message handed out was acked, through the pull-log sequences the client acked by.
    pulled = offsets(read_actions(store, "billing", PULL), "@qmq_orders")
    assert len(pulled) == count
    assert offsets(read_actions(store, "billing", ACK), "@qmq_orders") == pulled


def test_a_qmq_sent_message_is_read_by_the_python_api(store: Store, classpath: str, tmp_path: Path) -> None:
    Admin(store).create_topic("qmq_cross", 1)
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        produced = start_qmq_scenario(
            classpath,
            tmp_path / "producer",
            "produce",
            meta=server.meta_server_url,
            subject="qmq_cross",
            count=3,
            prefix="cross",
        ).finish(300)
    sent = {e["id"]: e["payload"] for e in produced.of("sent")}
    assert produced.done()["sent"] == 3
    messages = PullConsumer(store, "python-reader").pull("qmq_cross", 0, 0).messages
    assert {m.keys[0]: attributes(m)["payload"] for m in messages} == sent
    assert {attributes(m)["index"] for m in messages} == {"0", "1", "2"}


def test_a_consumer_restarted_with_its_id_gets_its_unacked_messages_at_once(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    Admin(store).create_topic("qmq_restart", 1)
    count = 5
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        meta = server.meta_server_url
        server.subscribe("qmq_restart", "billing", "worker-1")  # as worker-1's registration does
        produced = start_qmq_scenario(
            classpath, tmp_path / "producer", "produce", meta=meta, subject="qmq_restart", count=count
        ).finish(300)
        assert produced.done()["sent"] == count
        common = {"meta": meta, "subject": "qmq_restart", "group": "billing", "client_id": "worker-1"}
        # The first run dies in its listener: what it was handed stays unacked, leased to worker-1.
        crashed = start_qmq_scenario(
            classpath, tmp_path / "first", "consume", count=count, halt_on_first="true", **common
        ).finish(300)
        assert crashed.returncode == 3 and len(crashed.of("received")) == 1
        handed = offsets(read_actions(store, "billing", PULL), "@qmq_restart")
        assert handed and not offsets(read_actions(store, "billing", ACK), "@qmq_restart")
        # The restarted worker-1 gets them again (not after a lease expiry) and acks everything.
        again = start_qmq_scenario(
            classpath, tmp_path / "second", "consume", count=count, timeout_ms=120_000, **common
        ).finish(300)
    done = again.done()
    assert done["complete"] and done["received"] == count
    assert {e["id"] for e in again.of("received")} == {e["id"] for e in produced.of("sent")}
    pulled = offsets(read_actions(store, "billing", PULL), "@qmq_restart")
    assert len(pulled) == count  # handed out again under the same sequences, never leased twice
    assert offsets(read_actions(store, "billing", ACK), "@qmq_restart") == pulled


def test_a_listener_that_throws_gets_the_message_again_through_the_retry_subject(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    Admin(store).create_topic("qmq_retry", 2)
    count = 4
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0, retry_delay_ms=0) as server:
        meta = server.meta_server_url
        server.subscribe("qmq_retry", "billing", "worker-1")  # as worker-1's registration does
        produced = start_qmq_scenario(
            classpath, tmp_path / "producer", "produce", meta=meta, subject="qmq_retry", count=count
        ).finish(300)
        consumed = start_qmq_scenario(
            classpath,
            tmp_path / "consumer",
            "consume",
            meta=meta,
            subject="qmq_retry",
            group="billing",
            count=count,
            client_id="worker-1",
            fail_times=1,
            timeout_ms=120_000,
        ).finish(300)
    assert produced.done()["sent"] == count
    received = consumed.of("received")
    sent_ids = {e["id"] for e in produced.of("sent")}
    # Every message: a first delivery that failed, then one through %RETRY%qmq_retry%billing.
    assert sorted((e["id"], e["attempt"]) for e in received) == sorted(
        (i, a) for i in sent_ids for a in (1, 2)
    )
    assert {e["times"] for e in received if e["attempt"] == 2} == {2}
    retry = qmq_retry_subject("qmq_retry", "billing")
    stored = PullConsumer(store, "python-reader").pull(retry, 0, 0).messages
    assert sorted(m.keys[0] for m in stored) == sorted(sent_ids)
    for pulled_from in ("@qmq_retry", "@" + retry):
        pulled = offsets(read_actions(store, "billing", PULL), pulled_from)
        assert len(pulled) == count and offsets(read_actions(store, "billing", ACK), pulled_from) == pulled


def test_a_python_sent_message_reaches_a_qmq_consumer_with_its_properties(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    Admin(store).create_topic("qmq_from_python", 1)
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        server.subscribe("qmq_from_python", "billing", "worker-1")  # as worker-1's registration does
        with Producer(store) as producer:
            for i in range(3):
                producer.send(
                    Message("qmq_from_python", f"body-{i}".encode(), properties={"payload": f"py-{i}"})
                )
        consumed = start_qmq_scenario(
            classpath,
            tmp_path / "consumer",
            "consume",
            meta=server.meta_server_url,
            subject="qmq_from_python",
            group="billing",
            client_id="worker-1",
            count=3,
            timeout_ms=120_000,
        ).finish(300)
    assert consumed.done()["complete"]
    assert sorted(e["payload"] for e in consumed.of("received")) == ["py-0", "py-1", "py-2"]


def test_a_delayed_message_waits_in_the_schedule_topic_and_then_reaches_the_consumer(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    Admin(store).create_topic("qmq_delayed", 1)
    loop = BrokerLoop(store).start()  # the schedule job (``mq serve`` runs it in-process)
    try:
        with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
            meta = server.meta_server_url
            consumer = start_qmq_scenario(
                classpath,
                tmp_path / "consumer",
                "consume",
                meta=meta,
                subject="qmq_delayed",
                group="billing",
                count=2,
                timeout_ms=120_000,
            )
            consumer.wait_for("ready")
            wait_subscribed(server, "qmq_delayed", "billing")
            produced = start_qmq_scenario(
                classpath,
                tmp_path / "producer",
                "produce",
                meta=meta,
                subject="qmq_delayed",
                count=2,
                delay_ms=3000,
            ).finish(300)
            consumed = consumer.finish(300)
            registered = {s.client_type for s in server.clients.values() if s.subject == "qmq_delayed"}
    finally:
        loop.stop(30)
    assert produced.done()["sent"] == 2
    assert consumed.done()["complete"]
    assert {e["id"] for e in consumed.of("received")} == {e["id"] for e in produced.of("sent")}
    assert codec.ClientType.DELAY_PRODUCER in registered
    # None reached the subject's topic before its schedule time (they waited as timers in the
    # schedule topic unless the send itself arrived that late).
    log = store.read(schemas.COMMIT_LOG, columns=["topic", "keys", "properties", "store_ts_ms"]).to_pylist()
    stored = [row for row in log if row["topic"] == "qmq_delayed"]
    assert sorted(k for row in stored for k in row["keys"]) == sorted(e["id"] for e in produced.of("sent"))
    for row in stored:
        assert row["store_ts_ms"] >= int(dict(row["properties"])[P_EXPIRE])
    assert any(row["topic"] == SCHEDULE_TOPIC for row in log)


README = Path(__file__).resolve().parent.parent.parent / "README.md"
_QMQ_JAVA_BLOCK = re.compile(r"<!-- test: qmq-java -->\s*\n```java\n(?P<code>.*?)\n```", re.DOTALL)


def test_the_readme_qmq_example_compiles_and_runs_against_the_door(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    (code,) = [m.group("code") for m in _QMQ_JAVA_BLOCK.finditer(README.read_text())]
    (tmp_path / "QmqExample.java").write_text(code)
    javac = shutil.which("javac")
    assert javac is not None, "javac (a JDK 17) is needed"
    classes = tmp_path / "classes"
    subprocess.run(
        [javac, "-cp", classpath, "-d", str(classes), str(tmp_path / "QmqExample.java")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        done = subprocess.run(
            [java(), "-Xmx256m", f"-Duser.home={tmp_path}", "-cp", f"{classes}{os.pathsep}{classpath}",
             "QmqExample", server.meta_server_url],
            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert sorted(line for line in lines if line.startswith("sent")) == [f"sent order-{i}" for i in range(3)]
    assert sorted(line for line in lines if line.startswith("received")) == [
        f"received order-{i}" for i in range(3)
    ]
    messages = PullConsumer(store, "python-reader").pull("order.changed", 0, 0).messages
    messages += [
        m
        for q in range(1, 4)
        for m in PullConsumer(store, "python-reader").pull("order.changed", q, 0).messages
    ]
    assert sorted(attributes(m)["orderNo"] for m in messages) == [f"order-{i}" for i in range(3)]


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def test_two_consumers_of_a_group_share_a_subject_each_message_to_one_of_them(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    Admin(store).create_topic("qmq_shared", 4)
    count = 40
    stop = tmp_path / "stop"
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        meta = server.meta_server_url
        consumers = [
            start_qmq_scenario(
                classpath, tmp_path / name, "consume", meta=meta, subject="qmq_shared", group="billing",
                count=count, client_id=name, stop_file=stop, timeout_ms=120_000,
            )
            for name in ("worker-1", "worker-2")
        ]  # fmt: skip
        for consumer in consumers:
            consumer.wait_for("ready")
        wait_subscribed(server, "qmq_shared", "billing")
        produced = start_qmq_scenario(
            classpath, tmp_path / "producer", "produce", meta=meta, subject="qmq_shared", count=count
        ).finish(300)
        sent = {e["id"] for e in produced.of("sent")}
        wait_until(
            lambda: {e["id"] for c in consumers for e in list(c.events) if e["event"] == "received"} == sent,
            "every message received",
        )
        stop.touch()
        runs = [c.finish(300) for c in consumers]
    assert len(sent) == count
    received = [e["id"] for run in runs for e in run.of("received")]
    assert sorted(received) == sorted(sent)  # each message once, to one of the two
    assert {c.client_id for c in server.consumers_of("qmq_shared", "billing")} == {"worker-1", "worker-2"}
    for name in ("worker-1", "worker-2"):
        pulled = offsets(read_actions(store, "billing", PULL), f"{name}@qmq_shared")
        assert offsets(read_actions(store, "billing", ACK), f"{name}@qmq_shared") == pulled


def test_a_message_that_always_fails_is_dead_lettered_after_32_deliveries(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    Admin(store).create_topic("qmq_dead", 1)
    dead = qmq_dead_subject("qmq_dead", "billing")
    stop = tmp_path / "stop"

    def dead_letters() -> list[str]:
        if dead not in store.topic_configs(refresh=True):
            return []
        return [m.keys[0] for m in PullConsumer(store, "reader").pull(dead, 0, 0).messages]

    with QmqServer(store, http_port=0, meta_port=0, broker_port=0, retry_delay_ms=0) as server:
        meta = server.meta_server_url
        consumer = start_qmq_scenario(
            classpath, tmp_path / "consumer", "consume", meta=meta, subject="qmq_dead", group="billing",
            count=1, fail_times=1000, stop_file=stop, timeout_ms=240_000,
        )  # fmt: skip
        consumer.wait_for("ready")
        wait_subscribed(server, "qmq_dead", "billing")
        produced = start_qmq_scenario(
            classpath, tmp_path / "producer", "produce", meta=meta, subject="qmq_dead", count=1
        ).finish(300)
        wait_until(lambda: bool(dead_letters()), "a dead letter", timeout_s=240)
        stop.touch()
        run = consumer.finish(300)
    (sent,) = [e["id"] for e in produced.of("sent")]
    assert dead_letters() == [sent]
    # QMQ's client counts deliveries in ``times``: past maxRetryNum (32) a nack goes to the dead subject.
    assert [(e["attempt"], e["times"]) for e in run.of("received")] == [(t, t) for t in range(1, 33)]


def test_a_subject_and_a_group_with_dots_work_end_to_end(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    count = 5
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        meta = server.meta_server_url
        consumer = start_qmq_scenario(
            classpath, tmp_path / "consumer", "consume", meta=meta, subject="order.changed",
            group="billing.v2", count=count, timeout_ms=120_000,
        )  # fmt: skip
        consumer.wait_for("ready")
        wait_subscribed(server, "order.changed", "billing.v2")
        produced = start_qmq_scenario(
            classpath, tmp_path / "producer", "produce", meta=meta, subject="order.changed", count=count
        ).finish(300)
        consumed = consumer.finish(300)
    assert produced.done()["sent"] == count
    assert consumed.done()["complete"]
    assert {e["id"] for e in consumed.of("received")} == {e["id"] for e in produced.of("sent")}
    assert {e["subject"] for e in consumed.of("received")} == {"order.changed"}
    pulled = offsets(read_actions(store, "billing.v2", PULL), "@order.changed")
    assert (
        len(pulled) == count and offsets(read_actions(store, "billing.v2", ACK), "@order.changed") == pulled
    )


def retried_through_the_schedule(
    store: Store, classpath: str, tmp_path: Path, subject: str, **opts: object
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """One message, whose first delivery fails as ``opts`` say, consumed by group billing with the
    schedule job running: (the consumer's received events, the commit-log rows of the message)."""
    Admin(store).create_topic(subject, 1)
    loop = BrokerLoop(store).start()  # the schedule job (``mq serve`` runs it in-process)
    try:
        with QmqServer(store, http_port=0, meta_port=0, broker_port=0, retry_delay_ms=1000) as server:
            meta = server.meta_server_url
            consumer = start_qmq_scenario(
                classpath, tmp_path / "consumer", "consume", meta=meta, subject=subject, group="billing",
                count=1, fail_times=1, timeout_ms=120_000, **opts,
            )  # fmt: skip
            consumer.wait_for("ready")
            wait_subscribed(server, subject, "billing")
            produced = start_qmq_scenario(
                classpath, tmp_path / "producer", "produce", meta=meta, subject=subject, count=1
            ).finish(300)
            consumed = consumer.finish(300)
    finally:
        loop.stop(30)
    assert produced.done()["sent"] == 1 and consumed.done()["complete"]
    (sent,) = [e["id"] for e in produced.of("sent")]
    log = store.read(schemas.COMMIT_LOG, columns=["topic", "keys", "properties", "store_ts_ms"]).to_pylist()
    return consumed.of("received"), [row for row in log if sent in row["keys"]]


def test_a_listeners_need_retry_exception_waits_its_delay_then_comes_through_the_retry_subject(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    received, rows = retried_through_the_schedule(
        store, classpath, tmp_path, "qmq_later", retry_after_ms=3000
    )
    first, second = received
    assert (first["attempt"], second["attempt"], second["times"]) == (1, 2, 2)
    assert int(second["at"]) >= int(first["at"]) + 3000  # type: ignore[call-overload]
    retry = qmq_retry_subject("qmq_later", "billing")
    # The client's delayed send-back waited in the schedule topic, then landed in the retry subject.
    assert sorted(row["topic"] for row in rows) == sorted(["qmq_later", SCHEDULE_TOPIC, retry])
    (waiting,) = [row for row in rows if row["topic"] == SCHEDULE_TOPIC]
    assert dict(waiting["properties"])["REAL_TOPIC"] == retry


def test_a_nack_waits_the_retry_delay_in_the_schedule_before_the_retry_subject(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    received, rows = retried_through_the_schedule(store, classpath, tmp_path, "qmq_nack")
    assert [e["attempt"] for e in received] == [1, 2]
    retry = qmq_retry_subject("qmq_nack", "billing")
    assert sorted(row["topic"] for row in rows) == sorted(["qmq_nack", SCHEDULE_TOPIC, retry])
    (landed,) = [row for row in rows if row["topic"] == retry]
    (waiting,) = [row for row in rows if row["topic"] == SCHEDULE_TOPIC]
    assert landed["store_ts_ms"] >= int(dict(waiting["properties"])["TIMER_DELIVER_MS"])


def test_broadcast_consumers_each_receive_every_message(store: Store, classpath: str, tmp_path: Path) -> None:
    Admin(store).create_topic("qmq_broadcast", 2)
    count = 10
    names = ("box-1@@a1", "box-2@@a1")  # a broadcast consumer's group is its client id
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        meta = server.meta_server_url
        consumers = [
            start_qmq_scenario(
                classpath, tmp_path / f"consumer-{i}", "consume", meta=meta, subject="qmq_broadcast",
                group="billing", broadcast="true", client_id=name, count=count, timeout_ms=120_000,
            )
            for i, name in enumerate(names)
        ]  # fmt: skip
        for consumer, name in zip(consumers, names, strict=True):
            consumer.wait_for("ready")
            wait_subscribed(server, "qmq_broadcast", qmq_store_group(name))
        produced = start_qmq_scenario(
            classpath, tmp_path / "producer", "produce", meta=meta, subject="qmq_broadcast", count=count
        ).finish(300)
        runs = [c.finish(300) for c in consumers]
    sent = {e["id"] for e in produced.of("sent")}
    assert len(sent) == count
    for run in runs:
        assert run.done()["complete"]
        assert {e["id"] for e in run.of("received")} == sent  # every message, to each of them
    for name in names:
        group = qmq_store_group(name)
        pulled = offsets(read_actions(store, group, PULL), "@qmq_broadcast")
        assert len(pulled) == count and offsets(read_actions(store, group, ACK), "@qmq_broadcast") == pulled


def test_a_broadcast_consumers_failed_message_comes_again_through_its_own_retry_subject(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    Admin(store).create_topic("qmq_broadcast_retry", 1)
    name = "box-1@@a1"
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0, retry_delay_ms=0) as server:
        meta = server.meta_server_url
        consumer = start_qmq_scenario(
            classpath, tmp_path / "consumer", "consume", meta=meta, subject="qmq_broadcast_retry",
            group="billing", broadcast="true", client_id=name, count=2, fail_times=1, timeout_ms=120_000,
        )  # fmt: skip
        consumer.wait_for("ready")
        wait_subscribed(server, "qmq_broadcast_retry", qmq_store_group(name))
        produced = start_qmq_scenario(
            classpath, tmp_path / "producer", "produce", meta=meta, subject="qmq_broadcast_retry", count=2
        ).finish(300)
        run = consumer.finish(300)
    sent = {e["id"] for e in produced.of("sent")}
    assert run.done()["complete"]
    assert sorted((e["id"], e["attempt"]) for e in run.of("received")) == sorted(
        (i, a) for i in sent for a in (1, 2)
    )
    retry = qmq_retry_subject("qmq_broadcast_retry", qmq_store_group(name))
    assert sorted(m.keys[0] for m in PullConsumer(store, "reader").pull(retry, 0, 0).messages) == sorted(sent)


def test_rocketmq_5_and_qmq_clients_read_what_the_other_sent(
    store: Store, classpath: str, tmp_path: Path
) -> None:
    from engine.grpc import GrpcServer
    from tests.grpc.official_client import run as rocketmq5

    admin = Admin(store)
    admin.create_topic("rmq5_to_qmq", 1)
    admin.create_topic("qmq_to_rmq5", 1)
    with (
        QmqServer(store, http_port=0, meta_port=0, broker_port=0) as qmq,
        GrpcServer(store, port=0) as grpc_door,
    ):
        qmq.subscribe("rmq5_to_qmq", "billing", "worker-1")  # as worker-1's registration does
        sent = rocketmq5("send", grpc_door.address, "rmq5_to_qmq", 3)["ids"]
        BrokerLoop(store).run_once(everything=False)
        consumed = start_qmq_scenario(
            classpath,
            tmp_path / "consumer",
            "consume",
            meta=qmq.meta_server_url,
            subject="rmq5_to_qmq",
            group="billing",
            client_id="worker-1",
            count=3,
            timeout_ms=120_000,
        ).finish(300)
        produced = start_qmq_scenario(
            classpath,
            tmp_path / "producer",
            "produce",
            meta=qmq.meta_server_url,
            subject="qmq_to_rmq5",
            count=3,
            prefix="to5",
        ).finish(300)
        BrokerLoop(store).run_once(everything=False)
        received = rocketmq5("receive_ack", grpc_door.address, "qmq_to_rmq5", "readers5", 3)["received"]
    assert consumed.done()["complete"] and len(sent) == 3
    assert {e["subject"] for e in consumed.of("received")} == {"rmq5_to_qmq"}
    assert produced.done()["sent"] == 3
    payloads = sorted(e["payload"] for e in produced.of("sent"))
    # A QMQ message is its attributes: a 5.x consumer gets them as the body, keyed by QMQ's id.
    assert sorted(codec.decode_attrs(m["body"].encode())["payload"] for m in received) == payloads
    assert {m["keys"][0] for m in received} == {e["id"] for e in produced.of("sent")}
    assert {m["topic"] for m in received} == {"qmq_to_rmq5"}
