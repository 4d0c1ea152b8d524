"""Pulls with selectors, RocketMQ's per-pull cap (32 messages / 256 KiB) and NO_MATCHED_MSG at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import (
    Admin,
    InvalidSelectorError,
    Message,
    MessageSelector,
    Producer,
    PullConsumer,
    PullStatus,
    Store,
    load_config,
)
from engine.broker.dispatch import dispatch_pending
from engine.store.consume_queue import QueueIndex
from tests.helpers import versions


def _send(store: Store, messages: list[Message]) -> None:
    with Producer(store) as p:
        for start in range(0, len(messages), 200):
            p.send_batch(messages[start : start + 200], queue_id=0)
    dispatch_pending(store)


def _orders(store: Store, n: int) -> None:
    """Order i: amount i, region eu for even i and us for odd i; tag Paid every third."""
    _send(
        store,
        [
            Message(
                "T",
                f"order-{i}".encode(),
                tags="Paid" if i % 3 == 0 else "Created",
                properties={"amount": str(i), "region": "eu" if i % 2 == 0 else "us"},
            )
            for i in range(n)
        ],
    )


def test_sql92_selector_pulls_only_matching_messages(store: Store, topic: str) -> None:
    _orders(store, 10)
    selector = MessageSelector.by_sql("region = 'eu' AND amount >= 4 AND TAGS <> 'Paid'")
    r = PullConsumer(store, "g").pull(topic, 0, 0, max_nums=32, expression=selector)
    assert r.status is PullStatus.FOUND
    assert [m.body for m in r.messages] == [b"order-4", b"order-8"]
    assert r.next_begin_offset == 10  # past every entry examined


def test_tag_selector_and_plain_tag_string_pull_the_same(store: Store, topic: str) -> None:
    _orders(store, 9)
    consumer = PullConsumer(store, "g")
    by_tag = consumer.pull(topic, 0, 0, expression=MessageSelector.by_tag("Paid"))
    plain = consumer.pull(topic, 0, 0, expression="Paid")
    assert [m.queue_offset for m in by_tag.messages] == [m.queue_offset for m in plain.messages] == [0, 3, 6]


def test_sql92_selector_stops_at_max_nums_past_the_last_message(store: Store, topic: str) -> None:
    _orders(store, 20)
    r = PullConsumer(store, "g").pull(
        topic, 0, 0, max_nums=3, expression=MessageSelector.by_sql("region = 'us'")
    )
    assert [m.body for m in r.messages] == [b"order-1", b"order-3", b"order-5"]
    assert r.next_begin_offset == 6


def test_sparse_sql92_match_is_found_deep_in_the_scan_window(store: Store, topic: str) -> None:
    _send(store, [Message("T", b"x", properties={"n": str(i)}) for i in range(1000)])
    consumer = PullConsumer(store, "g")
    r = consumer.pull(topic, 0, 0, expression=MessageSelector.by_sql("n = 700 OR n = 950"))
    assert [m.properties["n"] for m in r.messages] == ["700"]
    assert r.next_begin_offset == 800  # RocketMQ examines at most 800 entries per pull
    r = consumer.pull(topic, 0, 800, expression=MessageSelector.by_sql("n = 700"))
    assert (r.status, r.next_begin_offset, r.messages) == (PullStatus.NO_MATCHED_MSG, 1000, [])


def test_unmatched_entries_answer_no_matched_msg_at_once_without_long_polling(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _orders(store, 5)

    def parked(_: float) -> None:
        raise AssertionError("the pull parked; RocketMQ answers NO_MATCHED_MSG at once")

    monkeypatch.setattr("engine.client.pull.time.sleep", parked)
    consumer = PullConsumer(store, "g")
    for expression in (MessageSelector.by_sql("amount > 100"), "Refunded"):
        r = consumer.pull(topic, 0, 0, expression=expression, suspend_ms=20_000)
        assert (r.status, r.next_begin_offset) == (PullStatus.NO_MATCHED_MSG, 5)


def test_nothing_new_still_long_polls(store: Store, topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _orders(store, 5)

    class Parked(Exception):
        pass

    def parked(_: float) -> None:
        raise Parked

    monkeypatch.setattr("engine.client.pull.time.sleep", parked)
    with pytest.raises(Parked):
        PullConsumer(store, "g").pull(
            topic, 0, 5, expression=MessageSelector.by_sql("amount > 1"), suspend_ms=5_000
        )


def test_one_pull_returns_at_most_32_messages_whatever_max_nums_asks(store: Store, topic: str) -> None:
    _orders(store, 50)
    r = PullConsumer(store, "g").pull(topic, 0, 0, max_nums=100)
    assert len(r.messages) == 32 and r.next_begin_offset == 32
    r = PullConsumer(store, "g").pull(
        topic, 0, 0, max_nums=100, expression=MessageSelector.by_sql("amount >= 0")
    )
    assert len(r.messages) == 32 and r.next_begin_offset == 32


def test_the_per_pull_cap_is_configurable(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "mqdata", config=load_config(max_transfer_count=40))
    Admin(store).create_topic("T", 1)
    _orders(store, 50)
    assert len(PullConsumer(store, "g").pull("T", 0, 0, max_nums=100).messages) == 40
    assert len(PullConsumer(store, "g").pull("T", 0, 0, max_nums=10).messages) == 10


def test_one_pull_returns_at_most_256_kib(store: Store, topic: str) -> None:
    body = b"x" * (100 * 1024)
    _send(store, [Message("T", body) for _ in range(4)] + [Message("T", b"y" * (300 * 1024))])
    consumer = PullConsumer(store, "g")
    r = consumer.pull(topic, 0, 0)
    assert len(r.messages) == 2 and r.next_begin_offset == 2  # a third would pass 256 KiB
    r = consumer.pull(topic, 0, 3)
    assert [len(m.body) for m in r.messages] == [100 * 1024]  # the 300 KiB one would pass the cap
    r = consumer.pull(topic, 0, 4)
    assert [len(m.body) for m in r.messages] == [300 * 1024]  # the first message whatever its size


def test_the_byte_cap_is_configurable(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "mqdata", config=load_config(max_transfer_bytes=1024 * 1024))
    Admin(store).create_topic("T", 1)
    _send(store, [Message("T", b"x" * (100 * 1024)) for _ in range(12)])
    assert len(PullConsumer(store, "g").pull("T", 0, 0).messages) == 10


def test_bad_sql92_in_a_pull_is_a_typed_error_and_writes_nothing(store: Store, topic: str) -> None:
    _orders(store, 3)
    before = versions(store)
    with pytest.raises(InvalidSelectorError) as caught:
        PullConsumer(store, "g").pull(topic, 0, 0, expression=MessageSelector.by_sql("amount > 'x'"))
    assert caught.value.position == 7
    with pytest.raises(InvalidSelectorError):
        PullConsumer(store, "g").pull(topic, 0, 0, expression=3)  # type: ignore[arg-type]
    assert versions(store) == before


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("*", list(range(20))),
        ("Paid", [i for i in range(20) if i % 3 == 0]),
        (
            MessageSelector.by_sql("region = 'eu' AND amount > 5"),
            [i for i in range(20) if i % 2 == 0 and i > 5],
        ),
    ],
)
def test_one_selection_serves_pulls_and_leases(
    store: Store, topic: str, expression: str | MessageSelector, expected: list[int]
) -> None:
    """QueueIndex.select: without limits (a lease) every match of the entries, in queue order; with a
    pull's limits, the first matches and where the batch stopped."""
    _orders(store, 20)
    index = QueueIndex(store)
    index.refresh()
    entries = index.entries(topic, 0, 0, 20)
    selector = MessageSelector.of(expression)
    rows, stop = index.select(entries, selector)
    assert (rows["queue_offset"].to_pylist(), stop) == (expected, 20)
    rows, stop = index.select(entries, selector, limit=2, max_bytes=1 << 20)
    assert rows["queue_offset"].to_pylist() == expected[:2]
    assert stop == expected[1] + 1  # the batch was full before the next entry
