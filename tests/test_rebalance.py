"""Rebalance strategies: pure functions with RocketMQ's allocation results."""

from __future__ import annotations

import pytest

from engine import InvalidArgumentError, MessageQueue
from engine.protocol.rebalance import (
    STRATEGIES,
    allocate_averagely,
    allocate_averagely_by_circle,
    allocate_consistent_hash,
    resolve_strategy,
)


def _queues(n: int, topic: str = "T") -> list[MessageQueue]:
    return [MessageQueue(topic, i) for i in range(n)]


def _ids(queues: list[MessageQueue]) -> list[int]:
    return [q.queue_id for q in queues]


def _all(strategy: object, queues: list[MessageQueue], cids: list[str]) -> dict[str, list[int]]:
    return {c: _ids(strategy(queues, cids, c)) for c in cids}  # type: ignore[operator]


def test_message_queue_orders_by_topic_then_queue_id() -> None:
    qs = [MessageQueue("B", 0), MessageQueue("A", 10), MessageQueue("A", 2)]
    assert sorted(qs) == [MessageQueue("A", 2), MessageQueue("A", 10), MessageQueue("B", 0)]
    assert str(MessageQueue("T", 3)) == "MessageQueue [topic=T, queueId=3]"
    assert hash(MessageQueue("T", 3)) == hash(MessageQueue("T", 3))


def test_averagely_gives_contiguous_blocks_larger_first() -> None:
    assert _all(allocate_averagely, _queues(8), ["c0", "c1", "c2"]) == {
        "c0": [0, 1, 2],
        "c1": [3, 4, 5],
        "c2": [6, 7],
    }


def test_averagely_splits_evenly_when_divisible() -> None:
    assert _all(allocate_averagely, _queues(4), ["a", "b"]) == {"a": [0, 1], "b": [2, 3]}


def test_averagely_with_more_consumers_than_queues_leaves_extras_idle() -> None:
    assert _all(allocate_averagely, _queues(2), ["a", "b", "c"]) == {"a": [0], "b": [1], "c": []}


def test_averagely_sorts_consumers_and_queues_first() -> None:
    shuffled = [MessageQueue("T", i) for i in (3, 0, 2, 1)]
    assert _ids(allocate_averagely(shuffled, ["b", "a"], "a")) == [0, 1]
    assert _ids(allocate_averagely(shuffled, ["b", "a"], "b")) == [2, 3]


def test_averagely_by_circle_deals_round_robin() -> None:
    assert _all(allocate_averagely_by_circle, _queues(8), ["c0", "c1", "c2"]) == {
        "c0": [0, 3, 6],
        "c1": [1, 4, 7],
        "c2": [2, 5],
    }


@pytest.mark.parametrize("strategy", list(STRATEGIES.values()))
@pytest.mark.parametrize(("queues", "consumers"), [(1, 1), (4, 2), (8, 3), (5, 7), (16, 5), (3, 3)])
def test_every_queue_goes_to_exactly_one_consumer(strategy: object, queues: int, consumers: int) -> None:
    qs = _queues(queues)
    cids = [f"10.0.0.{i}@{i}" for i in range(consumers)]
    taken = [q for c in cids for q in strategy(qs, cids, c)]  # type: ignore[operator]
    assert sorted(taken) == qs


def test_queues_of_several_topics_are_sorted_together() -> None:
    qs = _queues(2, "B") + _queues(2, "A")
    got = allocate_averagely(qs, ["x", "y"], "x")
    assert got == [MessageQueue("A", 0), MessageQueue("A", 1)]


def test_consumer_not_in_the_list_gets_nothing() -> None:
    for strategy in STRATEGIES.values():
        assert strategy(_queues(4), ["a", "b"], "zzz") == []


@pytest.mark.parametrize("strategy", list(STRATEGIES.values()))
def test_empty_inputs_raise_like_rocketmq(strategy: object) -> None:
    with pytest.raises(InvalidArgumentError):
        strategy([], ["a"], "a")  # type: ignore[operator]
    with pytest.raises(InvalidArgumentError):
        strategy(_queues(2), [], "a")  # type: ignore[operator]
    with pytest.raises(InvalidArgumentError):
        strategy(_queues(2), ["a"], "")  # type: ignore[operator]


def test_consistent_hash_matches_rocketmq_md5_ring() -> None:
    # Expected values computed from RocketMQ's ConsistentHashRouter (MD5, first 4 bytes, big
    # endian; virtual node keys "<cid>-<i>"; queue key = MessageQueue.toString()).
    import hashlib

    def h(key: str) -> int:
        return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")

    cids = ["a", "b", "c"]
    qs = _queues(12)
    ring = sorted((h(f"{c}-{i}"), c) for c in cids for i in range(10))
    expected: dict[str, list[int]] = {c: [] for c in cids}
    for q in qs:
        hv = h(str(q))
        owner = next((c for p, c in ring if p >= hv), ring[0][1])
        expected[owner].append(q.queue_id)
    assert _all(allocate_consistent_hash, qs, cids) == expected


def test_consistent_hash_moves_few_queues_when_a_consumer_joins() -> None:
    qs = _queues(64)
    before = {q: c for c in ["a", "b", "c"] for q in allocate_consistent_hash(qs, ["a", "b", "c"], c)}
    cids = ["a", "b", "c", "d"]
    after = {q: c for c in cids for q in allocate_consistent_hash(qs, cids, c)}
    moved = [q for q in qs if before[q] != after[q]]
    assert all(after[q] == "d" for q in moved)  # only queues taken by the newcomer move


def test_consistent_hash_virtual_nodes_must_be_positive() -> None:
    with pytest.raises(InvalidArgumentError):
        allocate_consistent_hash(_queues(2), ["a"], "a", virtual_nodes=0)


def test_resolve_strategy_by_name_or_callable() -> None:
    assert resolve_strategy("averagely") is allocate_averagely
    assert resolve_strategy("averagely_by_circle") is allocate_averagely_by_circle

    def mine(qs: object, cids: object, me: str) -> list[MessageQueue]:
        return []

    assert resolve_strategy(mine) is mine
    with pytest.raises(InvalidArgumentError, match="averagely"):
        resolve_strategy("fastest")  # type: ignore[arg-type]
