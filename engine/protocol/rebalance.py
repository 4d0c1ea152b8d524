"""Rebalance: which queues of a group's topics each consumer takes. Pure functions, no I/O.

The strategies are RocketMQ's ``AllocateMessageQueueAveragely``, ``…AveragelyByCircle`` and
``…ConsistentHash``: every consumer of a group computes the same answer from the same sorted list
of queues and consumer ids, so the group agrees on an assignment without talking to each other.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from engine.errors import InvalidArgumentError


class MessageModel(enum.StrEnum):
    """How a group shares messages (RocketMQ ``MessageModel``).

    CLUSTERING: each message goes to one consumer of the group; queues are divided among members.
    BROADCASTING: every consumer instance gets every message; each keeps its own offsets.
    """

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic, ordered by topic then queue id (as RocketMQ's ``MessageQueue``)."""

    topic: str
    queue_id: int

    def __str__(self) -> str:
        # RocketMQ's toString() without the broker name, which a store does not have; the
        # consistent-hash strategy hashes this text.
        return f"MessageQueue [topic={self.topic}, queueId={self.queue_id}]"


AllocateStrategy = Callable[[Sequence[MessageQueue], Sequence[str], str], list[MessageQueue]]
StrategyName = Literal["averagely", "averagely_by_circle", "consistent_hash"]


def _check(
    group_queues: Sequence[MessageQueue], consumers: Sequence[str], me: str
) -> tuple[list[MessageQueue], list[str], int]:
    """RocketMQ's ``AbstractAllocateMessageQueueStrategy.check``: the sorted queues and consumers, and
    ``me``'s place among the consumers (-1: not a member, so it takes nothing).

    Raises:
        InvalidArgumentError: ``me`` is empty, or there are no queues or no consumers.
    """
    if not isinstance(me, str) or not me:
        raise InvalidArgumentError("current consumer id must be a non-empty string", consumer_id=me)
    if not group_queues:
        raise InvalidArgumentError("there are no queues to allocate")
    if not consumers:
        raise InvalidArgumentError("there are no consumers to allocate queues to")
    queues = sorted(set(group_queues))
    cids = sorted(set(consumers))
    # Not (yet) seen as a member: take nothing, as RocketMQ does.
    return queues, cids, cids.index(me) if me in cids else -1


def allocate_averagely(
    group_queues: Sequence[MessageQueue], consumers: Sequence[str], me: str
) -> list[MessageQueue]:
    """Contiguous blocks, the first ``len(queues) % len(consumers)`` consumers one queue larger.

    8 queues over 3 consumers: ``[0, 1, 2]``, ``[3, 4, 5]``, ``[6, 7]``. With more consumers than
    queues, the extra consumers get nothing. Raises as :func:`_check`.
    """
    queues, cids, index = _check(group_queues, consumers, me)
    if index < 0:
        return []
    n, m = len(queues), len(cids)
    mod = n % m
    if n <= m:
        average = 1
    elif mod > 0 and index < mod:
        average = n // m + 1
    else:
        average = n // m
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, n - start)
    return [queues[(start + i) % n] for i in range(count)]


def allocate_averagely_by_circle(
    group_queues: Sequence[MessageQueue], consumers: Sequence[str], me: str
) -> list[MessageQueue]:
    """Round robin: consumer ``i`` takes queues ``i``, ``i + m``, ``i + 2m``, …

    8 queues over 3 consumers: ``[0, 3, 6]``, ``[1, 4, 7]``, ``[2, 5]``. Raises as :func:`_check`.
    """
    queues, cids, index = _check(group_queues, consumers, me)
    return [q for i, q in enumerate(queues) if i % len(cids) == index]


def _md5_hash(key: str) -> int:
    """RocketMQ's ``ConsistentHashRouter.MD5Hash``: the first 4 digest bytes, big endian."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


def allocate_consistent_hash(
    group_queues: Sequence[MessageQueue],
    consumers: Sequence[str],
    me: str,
    virtual_nodes: int = 10,
) -> list[MessageQueue]:
    """Consistent hashing on a ring of ``virtual_nodes`` points per consumer (MD5, as RocketMQ).

    A consumer joining or leaving moves only the queues next to its points on the ring.

    Raises:
        InvalidArgumentError: ``me`` is empty, no queues or consumers, or ``virtual_nodes < 1``.
    """
    if isinstance(virtual_nodes, bool) or not isinstance(virtual_nodes, int) or virtual_nodes < 1:
        raise InvalidArgumentError(
            f"virtual_nodes {virtual_nodes!r} must be an int >= 1", virtual_nodes=virtual_nodes
        )
    queues, cids, index = _check(group_queues, consumers, me)
    if index < 0:
        return []
    ring: dict[int, str] = {}
    for cid in cids:
        for replica in range(virtual_nodes):
            ring[_md5_hash(f"{cid}-{replica}")] = cid  # a later node wins a collision, as in a TreeMap
    points = sorted(ring)
    result = []
    for queue in queues:
        at = bisect.bisect_left(points, _md5_hash(str(queue)))
        if ring[points[at % len(points)]] == me:
            result.append(queue)
    return result


STRATEGIES: dict[str, AllocateStrategy] = {
    "averagely": allocate_averagely,
    "averagely_by_circle": allocate_averagely_by_circle,
    "consistent_hash": allocate_consistent_hash,
}


def resolve_strategy(allocate: StrategyName | AllocateStrategy) -> AllocateStrategy:
    """A strategy by name (see :data:`STRATEGIES`) or a callable with the same signature.

    Raises:
        InvalidArgumentError: an unknown name.
    """
    if callable(allocate):
        return allocate
    strategy = STRATEGIES.get(allocate) if isinstance(allocate, str) else None
    if strategy is None:
        raise InvalidArgumentError(
            f"allocate {allocate!r} is unknown; use one of {', '.join(sorted(STRATEGIES))} or a callable",
            allocate=allocate,
        )
    return strategy
