"""One id per message, as RocketMQ: ``MessageExt.msg_id`` is the unique id ``send`` returned, on
every reader and every copy (retry, dead letter, resend); ``offset_msg_id`` is the copy's store id.
Every look-up takes either."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import (
    Admin,
    ConsumeResult,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    SendResult,
    SimpleConsumer,
    Store,
)
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.broker.retry import route_retries
from engine.broker.schedule import deliver_due
from engine.cli import main
from tests.helpers import eventually

FAR_FUTURE = 10**13
GROUP = "g"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store.open(str(tmp_path / "mqdata"))
    Admin(store).create_topic("T", 1)
    return store


def send(store: Store, body: bytes = b"hello") -> SendResult:
    with Producer(store) as producer:
        return producer.send(Message("T", body, keys=("k1",)))


def test_a_pulled_message_has_the_id_send_returned_and_its_store_id_beside_it(store: Store) -> None:
    sent = send(store)
    dispatch_pending(store)
    [message] = PullConsumer(store, GROUP).pull("T", 0, 0).messages
    assert message.msg_id == sent.msg_id  # the unique id, as RocketMQ's consumer getMsgId()
    assert message.offset_msg_id == sent.offset_msg_id
    assert message.uniq_key == sent.msg_id


def test_a_received_message_has_the_id_send_returned(store: Store) -> None:
    sent = send(store)
    dispatch_pending(store)
    with SimpleConsumer(store, GROUP) as consumer:
        consumer.subscribe("T")
        [message] = consumer.receive(max_nums=4, invisible_ms=60_000)
        consumer.ack(message)
    assert (message.msg_id, message.offset_msg_id) == (sent.msg_id, sent.offset_msg_id)


def _receive_and_nack(store: Store) -> MessageExt:
    with SimpleConsumer(store, GROUP) as consumer:
        consumer.subscribe("T")
        [message] = consumer.receive(max_nums=4, invisible_ms=60_000)
        consumer.nack(message)
    return message


def test_a_message_retried_twice_then_dead_lettered_keeps_its_msg_id(store: Store) -> None:
    sent = send(store)
    dispatch_pending(store)
    seen = []
    for _ in range(3):  # the first delivery, then two retries
        seen.append(_receive_and_nack(store))
        assert route_retries(store, max_reconsume_times=2) == 1
        dispatch_pending(store)
        deliver_due(store, FAR_FUTURE)  # the retry's delay has passed
        dispatch_pending(store)
    assert [m.reconsume_times for m in seen] == [0, 1, 2]
    assert [m.topic for m in seen] == ["T", "%RETRY%g", "%RETRY%g"]
    assert {m.msg_id for m in seen} == {sent.msg_id}  # stable across the retry copies
    assert len({m.offset_msg_id for m in seen}) == 3  # each copy its own store id
    admin = Admin(store)
    [dead] = admin.dlq_messages(GROUP)
    assert dead.msg_id == sent.msg_id and dead.offset_msg_id not in {m.offset_msg_id for m in seen}

    resent = admin.resend_dlq(GROUP, dead.msg_id)
    assert resent.msg_id == sent.msg_id  # a resend keeps it too
    dispatch_pending(store)
    again = PullConsumer(store, "other").pull("T", 0, 0).messages
    assert [m.msg_id for m in again] == [sent.msg_id, sent.msg_id]
    assert again[-1].offset_msg_id == resent.offset_msg_id

    # Every look-up takes either id and reports the message's id.
    index_pending(store)
    assert admin.find_message(sent.msg_id).offset_msg_id == sent.offset_msg_id  # the first copy
    for copy in (*seen, dead):
        found = admin.find_message(copy.offset_msg_id)
        assert (found.msg_id, found.offset_msg_id) == (sent.msg_id, copy.offset_msg_id)
        assert admin.view_message(copy.offset_msg_id).msg_id == sent.msg_id
    assert admin.view_message(sent.msg_id, topic="%DLQ%g").offset_msg_id == dead.offset_msg_id
    trace = admin.trace(dead.offset_msg_id)
    assert trace.msg_id == sent.msg_id
    assert {c.msg_id for c in trace.copies} == {sent.msg_id}


def test_a_push_consumer_sees_the_id_send_returned(store: Store) -> None:
    sent = send(store)
    dispatch_pending(store)
    got: list[MessageExt] = []

    def listener(messages: list[MessageExt]) -> ConsumeResult:
        got.extend(messages)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        store,
        GROUP,
        consume_from="FIRST",
        heartbeat_interval_ms=100,
        rebalance_interval_ms=150,
        pull_suspend_ms=200,
    )
    consumer.subscribe("T", "*")
    consumer.register_listener(listener)
    consumer.start()
    try:
        eventually(lambda: got)
    finally:
        consumer.shutdown()
    assert (got[0].msg_id, got[0].offset_msg_id) == (sent.msg_id, sent.offset_msg_id)


def _mq_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_the_cli_shows_the_id_mq_send_printed(capsys: pytest.CaptureFixture[str], store: Store) -> None:
    root = store.root
    sent = _mq_json(capsys, "send", "T", "hello", "--keys", "k1", "--store", root)
    dispatch_pending(store)
    pulled = _mq_json(capsys, "pull", "T", "--queue-id", "0", "--offset", "0", "--store", root)
    [message] = pulled["result"]["messages"]
    assert (message["msg_id"], message["offset_msg_id"]) == (sent["msg_id"], sent["offset_msg_id"])
    for wanted in (sent["msg_id"], sent["offset_msg_id"]):
        viewed = _mq_json(capsys, "message", "view", wanted, "--store", root)
        assert (viewed["msg_id"], viewed["offset_msg_id"]) == (sent["msg_id"], sent["offset_msg_id"])
        traced = _mq_json(capsys, "message", "trace", wanted, "--store", root)
        assert traced["msg_id"] == sent["msg_id"]
    code = main(["pull", "T", "--queue-id", "0", "--offset", "0", "--store", root])
    assert code == 0 and sent["msg_id"] in capsys.readouterr().out


@pytest.mark.spark
def test_spark_readers_and_views_show_the_id_send_returned(spark_reads: Any, store: Store) -> None:
    from engine.spark.replay import replay
    from engine.spark.views import register_views

    spark = spark_reads
    sent = send(store)
    dispatch_pending(store)
    wanted = [(sent.msg_id, sent.offset_msg_id)]
    source = spark.read.format("mq").options(store=store.root, topic="T", startingOffsets="earliest").load()
    register_views(spark, store, ["messages"])
    for frame in (source, spark.table("messages"), replay(spark, store, "T")):
        rows = frame.select("msg_id", "offset_msg_id").collect()
        assert [(r.msg_id, r.offset_msg_id) for r in rows] == wanted
