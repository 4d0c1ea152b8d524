"""The official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified) against the gRPC
door: its producer sends, its SimpleConsumer receives, acks, changes invisible durations and gets a
message it did not ack again after its invisible time; what it sends is what the Python API pulls.

The client runs in a process of its own (tests/grpc/official_client.py says why). Also: its
transactions (commit, rollback, check-back), dead letters after the most attempts, and the README's
RocketMQ 5 example against ``mq serve --grpc``."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from engine import Admin, PullConsumer, SimpleConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.retry import route_retries
from engine.broker.transactions import check_transactions, undecided_halves
from engine.config import load_config
from engine.grpc import GrpcServer
from engine.grpc.v2 import definition_pb2 as pb
from engine.protocol.messages import message_group_queue
from engine.protocol.names import PROPERTY_REAL_TOPIC, PROPERTY_TIMER_DELIVER_MS, SCHEDULE_TOPIC, dlq_topic
from engine.store import schemas
from tests.grpc.official_client import run as client
from tests.grpc.official_client import start
from tests.serve_process import mq_serve


def test_the_official_producer_sends_and_its_simple_consumer_receives_and_acks(door: GrpcServer) -> None:
    sent = client("send", door.address, "orders", 3)["ids"]
    received = client("receive_ack", door.address, "orders", "g1", 3)["received"]
    assert sorted(m["id"] for m in received) == sorted(sent)
    by_body = {m["body"]: m for m in received}
    assert sorted(by_body) == ["body-0", "body-1", "body-2"]
    first = by_body["body-0"]
    assert (first["tag"], first["keys"], first["properties"], first["attempt"]) == (
        "TagA",
        ["key-0"],
        {"index": "0"},
        1,
    )
    assert {m["topic"] for m in received} == {"orders"}


def test_a_changed_invisible_duration_keeps_the_message_away_and_gives_a_new_handle(
    door: GrpcServer,
) -> None:
    client("send", door.address, "orders", 1)
    out = client("change_invisible", door.address, "orders", "g1")
    # Extended from 10 s to 60 s: not delivered again 12 s later; acked with the new handle; the
    # acked handle is then refused as RocketMQ 5 refuses it (INVALID_RECEIPT_HANDLE).
    assert out == {"handle_changed": True, "again": 0, "stale_ack_code": 40013}


def test_a_message_not_acked_comes_again_after_its_invisible_time(door: GrpcServer) -> None:
    client("send", door.address, "orders", 1)
    out = client("redelivery", door.address, "orders", "g1")
    [again] = out["again"]
    assert again["id"] == out["first"]["id"] and again["body"] == "body-0"
    assert (out["first"]["attempt"], again["attempt"]) == (1, 2)


def test_what_the_official_client_sends_the_python_api_pulls(door: GrpcServer, store: Store) -> None:
    sent = client("send", door.address, "orders", 4)["ids"]
    dispatch_pending(store)
    consumer = PullConsumer(store, "pull-group")
    pulled = [m for queue_id in range(2) for m in consumer.pull("orders", queue_id, 0).messages]
    assert sorted(m.msg_id for m in pulled) == sorted(sent)
    by_body = {m.body: m for m in pulled}
    assert sorted(by_body) == [f"body-{i}".encode() for i in range(4)]
    message = by_body[b"body-2"]
    assert (message.tags, tuple(message.keys), message.properties["index"]) == ("TagA", ("key-2",), "2")


def test_delay_and_fifo_sends_keep_their_time_and_message_group(door: GrpcServer, store: Store) -> None:
    due_s = int(time.time()) + 3600
    ids = client("send_kinds", door.address, "orders", due_s)
    [received] = client("receive_ack", door.address, "orders", "g1", 1)["received"]
    # The FIFO message comes with its group; the delayed one waits in the schedule topic.
    assert (received["id"], received["body"], received["group"]) == (ids["fifo"], "in-order", "order-7")
    log = store.read(schemas.COMMIT_LOG, columns=["topic", "uniq_key", "properties"]).to_pylist()
    [waiting] = [row for row in log if row["uniq_key"] == ids["delayed"]]
    props = dict(waiting["properties"])
    assert (waiting["topic"], props[PROPERTY_REAL_TOPIC]) == (SCHEDULE_TOPIC, "orders")
    assert int(props[PROPERTY_TIMER_DELIVER_MS]) == due_s * 1000
    dispatch_pending(store)
    consumer = PullConsumer(store, "pull-group")
    in_orders = [m.msg_id for q in range(2) for m in consumer.pull("orders", q, 0).messages]
    assert ids["delayed"] not in in_orders and ids["fifo"] in in_orders


def test_a_fifo_group_receives_each_message_group_in_order_the_next_after_the_ack(
    door: GrpcServer, store: Store
) -> None:
    Admin(store).update_group("fifo-group", fifo=True)
    out = client("fifo", door.address, "orders", "fifo-group", 4)
    # Each group went to one queue, the one RocketMQ 5's Python client chose (the door agrees).
    assert out["queues"] == {g: [message_group_queue(g, 2)] for g in ("order-0", "order-1")}
    dispatch_pending(store)
    stored = store.read(schemas.COMMIT_LOG, columns=["queue_id", "body"]).to_pylist()
    assert {(r["body"].decode().split(":")[0], r["queue_id"]) for r in stored} == {
        (g, message_group_queue(g, 2)) for g in ("order-0", "order-1")
    }
    received = out["received"]
    for group in ("order-0", "order-1"):
        bodies = [m["body"] for m in received if m["group"] == group]
        assert bodies == [f"{group}:{i}" for i in range(4)]
    assert all(m["attempt"] == 1 for m in received)
    # While the first message was not acked, a receive found nothing more of its queue, only the
    # other group's (the two groups are in different queues).
    assert out["queues"]["order-0"] != out["queues"]["order-1"]
    assert out["probe_groups"] and out["first_group"] not in out["probe_groups"]


def test_a_client_that_shuts_down_leaves_no_consumer_behind(door: GrpcServer) -> None:
    client("send", door.address, "orders", 1)
    client("receive_ack", door.address, "orders", "g1", 1)
    assert door.consumer_keys() == []  # NotifyClientTermination closed it


@contextlib.contextmanager
def mq_serve_grpc(root: Path) -> Iterator[str]:
    """``mq serve --grpc`` on free ports over the store at ``root``; its gRPC address. Stopped with
    SIGTERM after, and it must exit 0."""
    ports = ("--namesrv-port", "0", "--broker-port", "0", "--grpc-port", "0", "--no-broker-jobs")
    with mq_serve(root, "--grpc", *ports, errors=root.parent / f"{root.name}-serve.err") as (_, ready):
        yield ready["grpc"]


def test_mq_serve_with_grpc_serves_the_official_client_and_stops_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "served"
    Admin(Store.open(root)).create_topic("orders", 1)
    with mq_serve_grpc(root) as address:
        assert address.startswith("127.0.0.1:")
        assert len(client("send", address, "orders", 1)["ids"]) == 1


def test_the_readmes_rocketmq_5_example_runs_against_mq_serve_grpc(tmp_path: Path) -> None:
    from tests.test_readme import blocks

    [code] = blocks("grpc")
    root = tmp_path / "mqdata"
    Admin(Store.open(root)).create_topic("Orders", 2)  # mq topic create Orders --queues 2
    example = tmp_path / "example.py"
    example.write_text(code)
    with mq_serve_grpc(root) as address:
        done = subprocess.run(
            [sys.executable, str(example), address], cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines() == ["order 1 True"]


def test_transactions_commit_roll_back_and_an_undecided_one_is_checked_back_and_committed(
    door: GrpcServer, store: Store
) -> None:
    proc = start("transactions", door.address, "orders")
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ids = json.loads(proc.stdout.readline() or "null")
        assert ids is not None, proc.stderr.read() if proc.stderr else ""
        # The engine's check job finds the undecided half; the door asks the producer's checker.
        assert check_transactions(store, timeout_ms=0) == 1
        asked = json.loads(proc.stdout.readline())["asked"]
        assert asked == [ids["unknown"]]
        # Its EndTransaction (source SERVER_CHECK) decides it; waited for, then every half is decided.
        deadline = time.monotonic() + 60
        while undecided_halves(store)[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert undecided_halves(store)[0] == []
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(60)
    received = client("receive_ack", door.address, "orders", "g1", 2)["received"]
    assert sorted(m["body"] for m in received) == ["commit", "unknown"]
    assert sorted(m["id"] for m in received) == sorted([ids["commit"], ids["unknown"]])
    dispatch_pending(store)
    consumer = PullConsumer(store, "pull-group")
    bodies = sorted(m.body for q in range(2) for m in consumer.pull("orders", q, 0).messages)
    assert bodies == [b"commit", b"unknown"]  # the rolled-back one never reached its queue


def test_a_message_never_acked_is_dead_lettered_after_the_max_attempts_the_settings_report(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "mq", config=load_config(max_reconsume_times=2))
    Admin(store).create_topic("orders", 1)
    with GrpcServer(store, port=0) as door:
        settings = pb.Settings()
        settings.subscription.group.name = "g1"
        max_attempts = door.settings_for(settings).backoff_policy.max_attempts
        assert max_attempts == 3
        client("send", door.address, "orders", 1)
        out = client("exhaust", door.address, "orders", "g1", max_attempts)
    assert out == {"attempts": [1, 2, 3], "after": []}
    # The consumer that found the last lease ended recorded it; the retry job dead-letters it.
    assert route_retries(store) == 1
    dispatch_pending(store)
    [dead] = PullConsumer(store, "inspect").pull(dlq_topic("g1"), 0, 0).messages
    assert (dead.body, dead.reconsume_times) == (b"body-0", 3)


def test_the_official_push_consumer_acks_successes_and_gets_a_failure_again_at_its_next_attempt(
    door: GrpcServer, store: Store
) -> None:
    sent = client("send", door.address, "orders", 3)["ids"]
    seen = client("push", door.address, "orders", "push-group", 3)["seen"]
    succeeded = [s for s in seen if s["result"] == "SUCCESS"]
    assert sorted(s["id"] for s in succeeded) == sorted(sent)
    # body-1 failed at attempt 1 and came back at attempt 2 (its invisible time was set to the
    # client's next delay); the others came once.
    attempts = {s["body"]: [x["attempt"] for x in seen if x["body"] == s["body"]] for s in seen}
    assert attempts == {"body-0": [1], "body-1": [1, 2], "body-2": [1]}
    assert _nothing_left(store, "push-group")


def test_a_fifo_groups_official_push_consumer_takes_each_message_group_in_order(
    door: GrpcServer, store: Store
) -> None:
    Admin(store).update_group("fifo-push", fifo=True)
    out = client("push_fifo", door.address, "orders", "fifo-push", 4)
    seen = out["seen"]
    for group in ("order-0", "order-1"):
        bodies = [s["body"] for s in seen if s["group"] == group]
        expected = [f"{group}:{i}" for i in range(4)]
        if group == "order-0":  # failed once, consumed again before the next of its group
            expected.insert(2, "order-0:1")
        assert bodies == expected
    assert [s["result"] for s in seen if s["body"] == "order-0:1"] == ["FAILURE", "SUCCESS"]
    assert _nothing_left(store, "fifo-push")


def _nothing_left(store: Store, group: str) -> bool:
    """Every message of ``orders`` was acked by ``group``: another consumer of it finds none."""
    with SimpleConsumer(store, group, "inspect") as consumer:
        consumer.subscribe("orders")
        return consumer.receive(16, 30_000) == []


def test_the_official_lite_consumers_start_and_their_lite_subscriptions_are_refused(door: GrpcServer) -> None:
    out = client("lite", door.address, "orders", "lite-group")
    assert out == {
        "simple": "LiteSubscriptionQuotaExceededException",
        "push": "LiteSubscriptionQuotaExceededException",
    }
