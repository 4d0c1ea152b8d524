"""Pure rules of the RocketMQ protocol: names, limits, ids, tag codes and filters.

Nothing here does I/O; every function is tested without a JVM or a disk.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from engine.errors import InvalidArgumentError, InvalidMessageError, InvalidTopicError

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_TOPIC_LENGTH = 127
MAX_QUEUES = 1024
TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SYSTEM_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        "TBW102",
        "BenchmarkTest",
        "OFFSET_MOVED_EVENT",
        "RMQ_SYS_TRACE_TOPIC",
        "SELF_TEST_TOPIC",
    }
)

# System property names (RocketMQ MessageConst) used by the broker.
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_SHARDING_KEY = "SHARDING_KEY"

# Properties the broker acts on (delays, re-put targets, retry lineage, transactions): a user message
# that set them would be re-routed or misread, so producers may not (RocketMQ refuses system property
# names in ``Message.putUserProperty`` too). KEYS, ORIGIN_MESSAGE_ID and MAX_RECONSUME_TIMES stay
# allowed: the producer overwrites KEYS, and a resent dead letter keeps its origin and limit.
RESERVED_PROPERTIES = frozenset(
    {
        PROPERTY_TAGS,
        PROPERTY_DELAY,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_RECONSUME_TIME,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_UNIQ_KEY,
    }
)

# Fixed part of a RocketMQ commit-log record (CommitLog.calMsgLength with IPv4 hosts).
_RECORD_HEADER_BYTES = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2


def validate_topic_name(name: object) -> str:
    """Check a topic name against RocketMQ's rules and return it.

    Raises:
        InvalidTopicError: empty, longer than 127 characters, or with characters outside
            ``[%|a-zA-Z0-9_-]``.
    """
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("topic name must be a non-empty string", topic=name)
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters; at most {MAX_TOPIC_LENGTH} are allowed", topic=name
        )
    if not TOPIC_PATTERN.match(name):
        raise InvalidTopicError(f"topic name {name!r} has characters outside [%|a-zA-Z0-9_-]", topic=name)
    return name


@lru_cache(maxsize=1024)
def is_valid_topic_name(name: str) -> bool:
    """Cached yes/no form of :func:`validate_topic_name` for hot paths."""
    return 0 < len(name) <= MAX_TOPIC_LENGTH and TOPIC_PATTERN.match(name) is not None


def is_system_topic(name: str) -> bool:
    """True for topics the broker owns: schedule, transaction, retry and dead-letter topics."""
    return (
        name in SYSTEM_TOPICS
        or name.lower().startswith("rmq_sys_")
        or name.startswith(RETRY_PREFIX)
        or name.startswith(DLQ_PREFIX)
    )


def retry_topic(group: str) -> str:
    """Name of a group's retry topic."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """Name of a group's dead-letter topic."""
    return DLQ_PREFIX + group


def validate_group_name(group: object) -> str:
    """Check a consumer group name (same character rules as topics)."""
    if not isinstance(group, str) or not group:
        raise InvalidArgumentError("group must be a non-empty string", group=group)
    if len(group) > 255 or not TOPIC_PATTERN.match(group):
        raise InvalidArgumentError(
            f"group {group!r} must be at most 255 characters of [%|a-zA-Z0-9_-]", group=group
        )
    return group


@lru_cache(maxsize=4096)
def java_string_hashcode(s: str) -> int:
    """Java's ``String.hashCode()``: RocketMQ's tags code for a tag."""
    h = 0
    for unit in struct.unpack(f"<{len(s.encode('utf-16-le')) // 2}H", s.encode("utf-16-le")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def tags_code(tags: str | None) -> int:
    """Tags code stored in a consume-queue entry (0 when the message has no tag)."""
    return java_string_hashcode(tags) if tags else 0


@dataclass(frozen=True)
class TagFilter:
    """A parsed subscription expression: ``"*"``, ``"TagA"`` or ``"TagA || TagB"``."""

    expression: str
    tags: frozenset[str]
    codes: frozenset[int]

    @property
    def matches_all(self) -> bool:
        return not self.tags

    def match_code(self, code: int) -> bool:
        """First, cheap check on the consume-queue entry's tags code (hashes may collide)."""
        return self.matches_all or code in self.codes

    def match_tag(self, tag: str | None) -> bool:
        """Second check on the stored tag string."""
        return self.matches_all or (tag is not None and tag in self.tags)


def parse_tag_expression(expression: str | None) -> TagFilter:
    """Parse a RocketMQ TAG subscription expression.

    Raises:
        InvalidArgumentError: the expression is not a string or has an empty alternative.
    """
    if expression is None:
        expression = "*"
    if not isinstance(expression, str):
        raise InvalidArgumentError("expression must be a string like '*' or 'TagA || TagB'")
    text = expression.strip()
    if text in ("", "*"):
        return TagFilter(expression, frozenset(), frozenset())
    parts = [p.strip() for p in text.split("||")]
    if any(not p for p in parts):
        raise InvalidArgumentError(
            f"expression {expression!r} has an empty tag; use '*' or 'TagA || TagB'", expression=expression
        )
    tags = frozenset(parts)
    return TagFilter(expression, tags, frozenset(java_string_hashcode(t) for t in tags))


def validate_message_fields(
    topic: object,
    body: object,
    tags: object,
    keys: object,
    properties: object,
    deliver_at_ms: object = None,
) -> None:
    """Check one message against RocketMQ's client-side rules.

    Raises:
        InvalidTopicError: bad topic name.
        InvalidMessageError: empty or over 4 MiB body, tags containing ``||``, non-string keys or
            properties, or a property name in :data:`RESERVED_PROPERTIES`.
    """
    validate_topic_name(topic)
    if type(body) is not bytes and not isinstance(body, bytearray | memoryview):
        raise InvalidMessageError("body must be bytes", topic=topic)
    size = len(body)
    if size == 0:
        raise InvalidMessageError("body is empty; a message needs 1 byte to 4 MiB", topic=topic)
    if size > MAX_BODY_BYTES:
        raise InvalidMessageError(
            f"body is {size} bytes; at most {MAX_BODY_BYTES} (4 MiB) are allowed", topic=topic
        )
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
        if name in RESERVED_PROPERTIES:
            raise InvalidMessageError(
                f"property {name!r} is reserved for the broker; reserved names: "
                f"{', '.join(sorted(RESERVED_PROPERTIES))}",
                topic=topic,
            )
    if deliver_at_ms is not None and (
        isinstance(deliver_at_ms, bool) or not isinstance(deliver_at_ms, int) or deliver_at_ms < 0
    ):
        raise InvalidMessageError("deliver_at_ms must be a non-negative epoch-millisecond int", topic=topic)


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """RocketMQ's wire form of properties (``name\\x01value\\x02``…)."""
    return "".join(f"{k}\x01{v}\x02" for k, v in properties.items()).encode()


def record_size(topic: str, body_len: int, properties: Mapping[str, str]) -> int:
    """Stored size of a message, as RocketMQ's ``CommitLog.calMsgLength``.

    The physical offset advances by this much per message.
    """
    props = len(encode_properties(properties)) if properties else 0
    return _RECORD_HEADER_BYTES + body_len + len(topic.encode()) + props


def make_msg_id(store_id: str, physical_offset: int) -> str:
    """Offset message id: 8-byte store id + 8-byte physical offset, upper-case hex (32 chars)."""
    return f"{store_id.upper()}{physical_offset:016X}"


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    """Inverse of :func:`make_msg_id`.

    Raises:
        InvalidArgumentError: not 32 hex characters.
    """
    if not isinstance(msg_id, str) or len(msg_id) != 32:
        raise InvalidArgumentError(f"msg_id {msg_id!r} is not 32 hex characters", msg_id=msg_id)
    try:
        return msg_id[:16].upper(), int(msg_id[16:], 16)
    except ValueError as exc:
        raise InvalidArgumentError(f"msg_id {msg_id!r} is not hex", msg_id=msg_id) from exc


class UniqKeyGenerator:
    """Client unique ids as RocketMQ's ``MessageClientIDSetter``: ip, pid, random, time, counter."""

    def __init__(self) -> None:
        try:
            ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
        except OSError:
            ip = b"\x7f\x00\x00\x01"
        self._prefix = (ip + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)).hex().upper()
        self._start = time.time()
        self._counter = itertools.count(1)  # next() on a count is atomic under the GIL

    def next(self) -> str:
        counter = next(self._counter) & 0xFFFF
        elapsed = int((time.time() - self._start) * 1000) & 0xFFFFFFFF
        return f"{self._prefix}{elapsed:08X}{counter:04X}"

    def next_many(self, n: int) -> list[str]:
        """``n`` ids at once (a batch send): one clock reading, consecutive counters."""
        head = f"{self._prefix}{int((time.time() - self._start) * 1000) & 0xFFFFFFFF:08X}"
        counter = self._counter
        return [f"{head}{next(counter) & 0xFFFF:04X}" for _ in range(n)]


def select_queue_by_hash(sharding_key: str, queues: int) -> int:
    """Stable queue for a sharding key (same key, same queue, across processes and runs)."""
    if queues <= 0:
        raise InvalidArgumentError("a topic needs at least one queue", queues=queues)
    return (java_string_hashcode(sharding_key) & 0x7FFFFFFF) % queues
