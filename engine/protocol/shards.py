"""Commit-log shards: which shard holds a queue, and which shard a physical offset names.

A store created with ``commit_log_shards = N`` keeps N commit logs, each a Delta table with its own
sequencer, as RocketMQ spreads a topic's queues over brokers: every queue belongs to exactly one
shard (so its offsets are stamped by one sequencer and stay dense), and a topic's queues are spread
over the shards round-robin from a start chosen by the topic's name (so topics with few queues do
not all land on shard 0).

Physical offsets are global: shard ``k`` stamps offsets from ``k << SHARD_SHIFT`` on, so an offset
(and the offset message id made from it) names its shard, every consume-queue entry, index entry and
message id keeps its one ``physical_offset`` column, and shard 0's offsets are those of a store
without shards. A shard holds up to 2**56 bytes (64 PiB).
"""

from __future__ import annotations

from engine.errors import InvalidArgumentError
from engine.protocol.tags import java_string_hashcode

SHARD_SHIFT = 56
MAX_SHARDS = 128  # shard numbers 0..127 keep every physical offset a positive int64
SHARD_SPAN = 1 << SHARD_SHIFT


def _check_shards(shards: int) -> None:
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise InvalidArgumentError(
            f"shards must be an integer in 1..{MAX_SHARDS}, got {shards!r}", shards=shards
        )


def shard_of_queue(topic: str, queue_id: int, shards: int) -> int:
    """The shard whose commit log holds queue ``queue_id`` of ``topic`` in a store of ``shards``.

    Queue ``q`` goes to ``(h + q) % shards`` where ``h`` is the topic name's Java ``hashCode`` (made
    non-negative): consecutive queues of a topic land on consecutive shards.

    Raises:
        InvalidArgumentError: ``shards`` outside 1..128 or a negative ``queue_id``.
    """
    _check_shards(shards)
    if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
        raise InvalidArgumentError(
            f"queue_id must be a non-negative integer, got {queue_id!r}", queue_id=queue_id
        )
    if shards == 1:
        return 0
    return ((java_string_hashcode(topic) & 0x7FFFFFFF) + queue_id) % shards


def shard_of_offset(physical_offset: int) -> int:
    """The shard a physical offset (or the offset message id holding it) belongs to.

    Raises:
        InvalidArgumentError: a negative offset.
    """
    if physical_offset < 0:
        raise InvalidArgumentError(
            f"physical offset {physical_offset} is negative", physical_offset=physical_offset
        )
    return physical_offset >> SHARD_SHIFT


def shard_base(shard: int) -> int:
    """The first physical offset of ``shard`` (0 for shard 0).

    Raises:
        InvalidArgumentError: ``shard`` outside 0..127.
    """
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < MAX_SHARDS:
        raise InvalidArgumentError(
            f"shard must be an integer in 0..{MAX_SHARDS - 1}, got {shard!r}", shard=shard
        )
    return shard << SHARD_SHIFT
