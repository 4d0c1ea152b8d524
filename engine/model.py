"""Public value types and statuses (RocketMQ vocabulary).

The statuses and values that pure rules produce (:class:`PullStatus`, :class:`SysFlag`,
:class:`TopicConfig`) are defined with those rules in :mod:`engine.protocol`, which imports nothing of
the engine but its errors; they are part of this vocabulary all the same.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.protocol.pull import PullStatus
from engine.protocol.topics import TopicConfig
from engine.protocol.transactions import UNDISPATCHED_FLAGS, SysFlag

__all__ = [
    "UNDISPATCHED_FLAGS",
    "Message",
    "MessageExt",
    "PullResult",
    "PullStatus",
    "QueueStats",
    "SendResult",
    "SendStatus",
    "SysFlag",
    "TopicConfig",
]


class SendStatus(enum.StrEnum):
    """Outcome of a send, as RocketMQ's ``SendStatus``."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True)
class Message:
    """A message to send.

    Args:
        topic: destination topic.
        body: payload, 1 byte to 4 MiB.
        tags: one tag (no ``||``), used for server-side filtering.
        keys: business keys, indexed for ``query_by_key``.
        properties: user properties, string to string.
        deliver_at_ms: deliver no earlier than this epoch-millisecond time (timer message).
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    deliver_at_ms: int | None = None


@dataclass(frozen=True)
class SendResult:
    """Where a sent message was stored, as RocketMQ's ``SendResult``.

    ``msg_id`` is the client unique id (``getMsgId()``: producer ip, pid, time, counter; see
    :func:`engine.protocol.uniq_key_time_ms`), the id consumers and key queries know the message by;
    ``offset_msg_id`` is the store's offset id (``getOffsetMsgId()``: store id + physical offset),
    found with one point read and no index. Every look-up accepts either.
    """

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    store_ts_ms: int = 0  # when the store took it (the stored message's store timestamp; 0: not told)

    @property
    def uniq_key(self) -> str:
        """The client unique id (the same as :attr:`msg_id`)."""
        return self.msg_id


@dataclass(frozen=True)
class MessageExt:
    """A stored message as a consumer sees it.

    ``msg_id`` is the client unique id the producer got back (:attr:`SendResult.msg_id`, RocketMQ's
    consumer-side ``getMsgId()``): every copy of a message keeps it (a retry, a dead letter, a
    delayed message's re-put, a DLQ resend), so an idempotent consumer keys on it.
    ``offset_msg_id`` is the store's id of this very copy (``getOffsetMsgId()``: store id +
    physical offset), different for every copy. Every look-up accepts either.
    """

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    msg_id: str
    offset_msg_id: str
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    born_ts_ms: int
    store_ts_ms: int
    reconsume_times: int
    sys_flag: int = 0
    size: int = 0

    @property
    def uniq_key(self) -> str:
        """The client unique id (the same as :attr:`msg_id`; RocketMQ's ``UNIQ_KEY`` property)."""
        return self.msg_id

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> MessageExt:
        """Build from a commit-log row (a mapping by column name).

        The commit log stores the offset id in its ``msg_id`` column and the client unique id in
        ``uniq_key``; here they become :attr:`offset_msg_id` and :attr:`msg_id`.
        """
        props = row.get("properties") or {}
        if not isinstance(props, Mapping):  # Arrow maps come back as lists of pairs
            props = dict(props)
        offset_id = row["msg_id"]
        return cls(
            topic=row["topic"],
            queue_id=int(row["queue_id"]),
            queue_offset=int(row["queue_offset"]),
            physical_offset=int(row["physical_offset"]),
            msg_id=row.get("uniq_key") or offset_id,  # rows made before unique ids: the offset id
            offset_msg_id=offset_id,
            body=bytes(row["body"]),
            tags=row.get("tags"),
            keys=tuple(row.get("keys") or ()),
            properties=dict(props),
            born_ts_ms=int(row["born_ts_ms"]),
            store_ts_ms=int(row["store_ts_ms"]),
            reconsume_times=int(row.get("reconsume_times") or 0),
            sys_flag=int(row.get("sys_flag") or 0),
            size=int(row.get("size") or 0),
        )


@dataclass(frozen=True)
class PullResult:
    """Result of :meth:`PullConsumer.pull`, with RocketMQ's offset corrections."""

    status: PullStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class QueueStats:
    """Offsets of one queue: ``max_offset`` is the next offset to be written."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_ts_ms: int | None
