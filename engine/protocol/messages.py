"""Messages: what a producer may send, the stored size of a record, and queue selection by key."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from engine.errors import InvalidArgumentError, InvalidMessageError
from engine.protocol.names import MAX_PROPERTIES_BYTES, RESERVED_PROPERTIES, validate_topic_name
from engine.protocol.tags import java_string_hashcode

MAX_BODY_BYTES = 4 * 1024 * 1024

# Fixed part of a RocketMQ commit-log record (CommitLog.calMsgLength with IPv4 hosts).
_RECORD_HEADER_BYTES = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2


def check_body_size(size: int, topic: object = None) -> None:
    """Refuse a body of ``size`` bytes that RocketMQ refuses: empty, or over 4 MiB.

    Raises:
        InvalidMessageError: it is.
    """
    if size == 0:
        raise InvalidMessageError("body is empty; a message needs 1 byte to 4 MiB", topic=topic)
    if size > MAX_BODY_BYTES:
        raise InvalidMessageError(
            f"body is {size} bytes; at most {MAX_BODY_BYTES} (4 MiB) are allowed", topic=topic
        )


def validate_message_fields(
    topic: object,
    body: object,
    tags: object,
    keys: object,
    properties: object,
    deliver_at_ms: object = None,
    *,
    allowed: frozenset[str] = frozenset(),
) -> None:
    """Check one message against RocketMQ's client- and broker-side rules.

    Args:
        topic, body, tags, keys, properties, deliver_at_ms: the message's fields.
        allowed: reserved property names this message may carry (a broker-side resend).

    Raises:
        InvalidTopicError: bad topic name.
        InvalidMessageError: empty or over 4 MiB body, tags containing ``||``, non-string keys or
            properties, a property name in :data:`RESERVED_PROPERTIES`, or properties (keys
            included) longer than :data:`MAX_PROPERTIES_BYTES` encoded, as RocketMQ's broker.
    """
    validate_topic_name(topic)
    if type(body) is not bytes and not isinstance(body, bytearray | memoryview):
        raise InvalidMessageError("body must be bytes", topic=topic)
    check_body_size(len(body), topic)
    if tags is not None:
        if not isinstance(tags, str) or not tags:
            raise InvalidMessageError("tags must be a non-empty string or None", topic=topic)
        if "||" in tags:
            raise InvalidMessageError(
                f"tags {tags!r} contain '||', which separates tags in subscriptions", topic=topic
            )
    if isinstance(keys, str) or not isinstance(keys, tuple | list | Sequence | frozenset | set):
        raise InvalidMessageError("keys must be a sequence of strings, e.g. ('order-1',)", topic=topic)
    for key in keys:
        if not isinstance(key, str) or not key or any(c.isspace() for c in key):
            raise InvalidMessageError(
                f"key {key!r} must be a non-empty string without whitespace", topic=topic
            )
    if type(properties) is not dict and not isinstance(properties, Mapping):
        raise InvalidMessageError("properties must be a mapping of strings to strings", topic=topic)
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessageError(
                f"property {name!r}={value!r} is not a string pair; properties are strings only",
                topic=topic,
            )
        if not name or "\x01" in name or "\x02" in name or "\x01" in value or "\x02" in value:
            raise InvalidMessageError(
                f"property {name!r} is empty or holds the reserved separators \\x01 / \\x02", topic=topic
            )
        if name in RESERVED_PROPERTIES and name not in allowed:
            raise InvalidMessageError(
                f"property {name!r} is reserved for the broker; reserved names: "
                f"{', '.join(sorted(RESERVED_PROPERTIES))}",
                topic=topic,
            )
    encoded = properties_bytes(properties, list(keys))
    if encoded > MAX_PROPERTIES_BYTES:
        raise InvalidMessageError(
            f"properties take {encoded} bytes encoded (name\\x01value\\x02, keys included); at most "
            f"{MAX_PROPERTIES_BYTES} are allowed",
            topic=topic,
        )
    if deliver_at_ms is not None and (
        isinstance(deliver_at_ms, bool) or not isinstance(deliver_at_ms, int) or deliver_at_ms < 0
    ):
        raise InvalidMessageError("deliver_at_ms must be a non-negative epoch-millisecond int", topic=topic)


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """RocketMQ's wire form of properties (``name\\x01value\\x02``…)."""
    return "".join(f"{k}\x01{v}\x02" for k, v in properties.items()).encode()


def properties_bytes(properties: Mapping[str, str], keys: Sequence[str] = ()) -> int:
    """Bytes of a message's properties in RocketMQ's wire form, with KEYS as the producer adds it."""
    size = len(encode_properties(properties)) if properties else 0
    if keys:
        size += len(f"KEYS\x01{' '.join(keys)}\x02".encode())
    return size


def batch_bytes(body: bytes, tags: str | None, properties: Mapping[str, str], keys: Sequence[str]) -> int:
    """What one message adds to a batch's size, as RocketMQ counts a batch (``MessageBatch``):
    its body and its properties, tags and keys included (it carries them as TAGS / KEYS)."""
    size = len(body) + properties_bytes(properties, keys)
    if tags:
        size += len(f"TAGS\x01{tags}\x02".encode())
    return size


def record_size(topic: str, body_len: int, properties: Mapping[str, str]) -> int:
    """Stored size of a message, as RocketMQ's ``CommitLog.calMsgLength``.

    The physical offset advances by this much per message.
    """
    props = len(encode_properties(properties)) if properties else 0
    return _RECORD_HEADER_BYTES + body_len + len(topic.encode()) + props


class RecordSizes:
    """:func:`record_size` over the messages of one pass, each distinct properties mapping encoded
    once (the messages of a client's batch share one: ``WireProducer.prepare_client_batch``). Keyed
    by the mapping's identity: use one for messages that stay alive meanwhile, then drop it."""

    def __init__(self) -> None:
        self._fixed: dict[tuple[str, int], int] = {}

    def __call__(self, topic: str, body_len: int, properties: Mapping[str, str]) -> int:
        key = (topic, id(properties))
        fixed = self._fixed.get(key)
        if fixed is None:
            fixed = self._fixed[key] = record_size(topic, 0, properties)
        return fixed + body_len


def select_queue_by_hash(sharding_key: str, queues: int) -> int:
    """Stable queue for a sharding key, as RocketMQ's ``SelectMessageQueueByHash``.

    Java computes ``key.hashCode() % n`` (the remainder takes the dividend's sign) and then
    ``Math.abs`` of a negative remainder; ``|h| mod n`` is the same number, also for
    ``Integer.MIN_VALUE`` (whose remainder is small, so Java's abs never overflows there).
    """
    if queues <= 0:
        raise InvalidArgumentError("a topic needs at least one queue", queues=queues)
    return abs(java_string_hashcode(sharding_key)) % queues


def message_group_queue(message_group: str, queues: int) -> int:
    """The queue of a topic with ``queues`` queues that every message of ``message_group`` goes
    to (FIFO message groups): the rule of RocketMQ 5's Python client (SHA-256 of the UTF-8 group,
    big-endian, modulo the queues), so that a group sent by that client and by lakemq's producer or
    gRPC door lands in one queue. (RocketMQ 5's Java client uses SipHash-2-4 instead.)

    Raises:
        InvalidArgumentError: a blank group or no queue.
    """
    if not isinstance(message_group, str) or not message_group.strip():
        raise InvalidArgumentError("a message group must be a non-blank string", message_group=message_group)
    if queues <= 0:
        raise InvalidArgumentError("a topic needs at least one queue", queues=queues)
    digest = hashlib.sha256(message_group.encode("utf-8")).digest()
    return int.from_bytes(digest, "big") % queues
