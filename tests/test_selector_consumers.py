"""Selectors wherever a tag expression is accepted: PushConsumer.subscribe and the ``mq`` Spark source."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from chispa import assert_df_equality

from engine import (
    ConsumeFrom,
    ConsumeResult,
    ExpressionType,
    InvalidArgumentError,
    InvalidSelectorError,
    Message,
    MessageExt,
    MessageSelector,
    Producer,
    PushConsumer,
    Store,
)
from engine.broker.dispatch import dispatch_pending
from engine.spark.mq_options import ReadOptions
from engine.store import schemas
from engine.store.consumer_offset import OffsetStore
from tests.helpers import eventually, versions
from tests.test_push_consumer import dispatcher  # noqa: F401  (the fixture)

FAST: dict[str, Any] = {
    "heartbeat_interval_ms": 100,
    "rebalance_interval_ms": 150,
    "commit_interval_ms": 200,
    "pull_suspend_ms": 200,
}


def _orders(store: Store, n: int, *, dispatch: bool = True) -> None:
    with Producer(store) as p:
        p.send_batch(
            [
                Message(
                    "T",
                    f"order-{i}".encode(),
                    tags="Paid" if i % 2 else "Created",
                    properties={"amount": str(i)},
                )
                for i in range(n)
            ],
            queue_id=0,
        )
    if dispatch:
        dispatch_pending(store)


@pytest.mark.usefixtures("dispatcher")
def test_push_consumer_delivers_only_what_a_sql92_selector_matches(store: Store, topic: str) -> None:
    seen: list[MessageExt] = []
    lock = threading.Lock()

    def listener(messages: list[MessageExt]) -> ConsumeResult:
        with lock:
            seen.extend(messages)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(store, "g", consume_from=ConsumeFrom.FIRST, **FAST)
    consumer.subscribe("T", MessageSelector.by_sql("TAGS = 'Paid' AND amount BETWEEN 3 AND 7"))
    consumer.register_listener(listener)
    assert consumer.subscriptions()["T"] == "SQL92: TAGS = 'Paid' AND amount BETWEEN 3 AND 7"
    assert consumer.selectors()["T"].type is ExpressionType.SQL92
    with consumer.start():
        _orders(store, 12, dispatch=False)  # the dispatcher thread dispatches them
        assert eventually(lambda: len(seen) >= 3), "matching messages consumed"
        offsets = OffsetStore(store, "g")  # the group's committed progress passes the filtered entries
        assert eventually(lambda: offsets.read("T").get(("T", 0)) == 12), "offset past filtered entries"
    with lock:
        assert sorted(m.body for m in seen) == [b"order-3", b"order-5", b"order-7"]


def test_push_consumer_refuses_a_bad_selector_at_subscribe(store: Store, topic: str) -> None:
    consumer = PushConsumer(store, "g", **FAST)
    before = versions(store)
    with pytest.raises(InvalidSelectorError):
        consumer.subscribe("T", MessageSelector.by_sql("amount >"))
    with pytest.raises(InvalidSelectorError):
        consumer.subscribe("T", 7)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        consumer.subscribe("T", "A ||")  # a plain string is still a tag expression
    assert consumer.subscriptions() == {}
    assert versions(store) == before
    consumer.shutdown()


def test_mq_read_options_take_an_expression_type() -> None:
    base = {"store": "/s", "topic": "T"}
    assert ReadOptions.parse(base, streaming=False).selector == MessageSelector.by_tag("*")
    sql = ReadOptions.parse({**base, "expression": "amount > 3", "expressionType": "sql92"}, streaming=False)
    assert sql.selector == MessageSelector.by_sql("amount > 3")
    tag = ReadOptions.parse({**base, "expression": "A || B", "expressionType": "TAG"}, streaming=True)
    assert tag.selector == MessageSelector.by_tag("A || B")
    with pytest.raises(InvalidSelectorError):
        ReadOptions.parse({**base, "expression": "amount >", "expressionType": "SQL92"}, streaming=False)
    with pytest.raises(InvalidSelectorError, match="TAG or SQL92"):
        ReadOptions.parse({**base, "expressionType": "XPATH"}, streaming=False)


@pytest.mark.spark
def test_mq_batch_read_filters_with_a_sql92_selector(spark: Any, store: Store, topic: str) -> None:
    _orders(store, 10)
    df = (
        spark.read.format("mq")
        .option("store", store.root)
        .option("topic", topic)
        .option("expressionType", "SQL92")
        .option("expression", "TAGS = 'Paid' AND amount > 4")
        .load()
    )
    expected = spark.createDataFrame(
        [
            (r["queue_offset"], bytes(r["body"]))
            for r in store.read(schemas.COMMIT_LOG).to_pylist()
            if r["tags"] == "Paid" and int(dict(r["properties"])["amount"]) > 4
        ],
        "queue_offset long, body binary",
    )
    assert expected.count() == 3
    assert_df_equality(
        df.select("queue_offset", "body"), expected, ignore_row_order=True, ignore_nullable=True
    )
