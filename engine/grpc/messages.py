"""Messages between RocketMQ 5's protobuf form (``apache.rocketmq.v2.Message``) and the engine's."""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass

from engine.grpc.v2 import definition_pb2 as pb
from engine.model import Message, MessageExt
from engine.protocol.names import (
    PROPERTY_BORN_HOST,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TIMER_DELIVER_MS,
    RESERVED_PROPERTIES,
)
from engine.protocol.rocketmq5 import check_body, check_tag, check_user_properties, edge_error
from engine.protocol.transactions import PROPERTY_CHECK_IMMUNITY_TIME

# Message types a topic of each lakemq type accepts; an untyped (NORMAL) topic takes every kind, as
# lakemq's other doors do.
ACCEPTED_TYPES: dict[str, tuple[int, ...]] = {
    "NORMAL": (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION),
    "FIFO": (pb.FIFO,),
    "DELAY": (pb.DELAY,),
    "TRANSACTION": (pb.TRANSACTION,),
}


@dataclass(frozen=True)
class IncomingMessage:
    """One message of a SendMessage request, checked, as the engine's producer takes it."""

    message: Message
    uniq_key: str | None
    born_ts_ms: int | None
    message_group: str | None
    message_type: int
    broker_properties: dict[str, str]
    queue_id: int = 0  # the queue the client chose from the route (system_properties.queue_id)


def _ms(ts: object) -> int:
    seconds = getattr(ts, "seconds", 0)
    nanos = getattr(ts, "nanos", 0)
    return int(seconds) * 1000 + int(nanos) // 1_000_000


def _set_ms(ts: object, ms: int) -> None:
    ts.seconds, ts.nanos = divmod(ms, 1000)  # type: ignore[attr-defined]
    ts.nanos *= 1_000_000  # type: ignore[attr-defined]


def from_proto(message: pb.Message) -> IncomingMessage:
    """A client's message, checked against RocketMQ 5's edge rules.

    Raises:
        InvalidArgumentError: a rule broken (its ``status`` names the RocketMQ 5 code).
    """
    system = message.system_properties
    body = bytes(message.body)
    if system.body_encoding == pb.GZIP:
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error):
            raise edge_error("MESSAGE_CORRUPTED", "message body is not valid gzip") from None
    check_body(body)
    tag = system.tag if system.HasField("tag") else None
    if tag is not None:
        check_tag(tag)
    properties = dict(message.user_properties)
    check_user_properties(properties)
    for key in properties:
        if key in RESERVED_PROPERTIES:
            raise edge_error(
                "ILLEGAL_MESSAGE_PROPERTY_KEY", f"property key {key!r} is reserved by the broker", key=key
            )
    keys = tuple(system.keys)
    for key in keys:
        if not key.strip():
            raise edge_error("ILLEGAL_MESSAGE_KEY", "message key cannot be blank")
    group = system.message_group if system.HasField("message_group") else None
    if group is not None and not group.strip():
        raise edge_error("ILLEGAL_MESSAGE_GROUP", "message group cannot be blank")
    deliver_at = _ms(system.delivery_timestamp) if system.HasField("delivery_timestamp") else None
    if system.message_type == pb.DELAY and deliver_at is None:
        raise edge_error("ILLEGAL_DELIVERY_TIME", "a DELAY message needs a delivery timestamp")
    if system.message_type == pb.FIFO and group is None:
        raise edge_error("ILLEGAL_MESSAGE_GROUP", "a FIFO message needs a message group")
    broker_properties: dict[str, str] = {}
    if group is not None:
        broker_properties[PROPERTY_SHARDING_KEY] = group
    if system.message_type == pb.TRANSACTION and system.HasField("orphaned_transaction_recovery_duration"):
        # The first check-back waits this long, as the proxy's CHECK_IMMUNITY_TIME_IN_SECONDS.
        recovery = system.orphaned_transaction_recovery_duration
        broker_properties[PROPERTY_CHECK_IMMUNITY_TIME] = str(max(int(recovery.seconds), 0))
    if system.born_host:
        broker_properties[PROPERTY_BORN_HOST] = system.born_host
    born = _ms(system.born_timestamp) if system.HasField("born_timestamp") else None
    return IncomingMessage(
        Message(message.topic.name, body, tag, keys, properties, deliver_at),
        system.message_id or None,
        born or None,
        group,
        system.message_type,
        broker_properties,
        system.queue_id,
    )


def message_type_of(message: MessageExt) -> int:
    """The RocketMQ 5 message type a stored message was sent as (as far as the store tells)."""
    props = message.properties
    if PROPERTY_SHARDING_KEY in props:
        return int(pb.FIFO)
    if PROPERTY_TIMER_DELIVER_MS in props:
        return int(pb.DELAY)
    return int(pb.NORMAL)


def to_proto(
    message: MessageExt, receipt_handle: str, delivery_attempt: int, invisible_ms: int
) -> pb.Message:
    """A received message as RocketMQ 5's proxy hands it out (its body's CRC32 digest with it)."""
    out = pb.Message()
    out.topic.name = message.topic
    props = message.properties
    for key, value in props.items():
        if key not in RESERVED_PROPERTIES and key != PROPERTY_SHARDING_KEY:
            out.user_properties[key] = value
    system = out.system_properties
    if message.tags:
        system.tag = message.tags
    system.keys.extend(message.keys)
    system.message_id = message.msg_id
    system.body_digest.type = pb.CRC32
    system.body_digest.checksum = format(zlib.crc32(message.body) & 0xFFFFFFFF, "08X")
    system.body_encoding = pb.IDENTITY
    system.message_type = message_type_of(message)  # type: ignore[assignment]
    _set_ms(system.born_timestamp, message.born_ts_ms)
    system.born_host = props.get(PROPERTY_BORN_HOST, "")
    _set_ms(system.store_timestamp, message.store_ts_ms)
    deliver = props.get(PROPERTY_TIMER_DELIVER_MS)
    if deliver is not None and deliver.isdigit():
        _set_ms(system.delivery_timestamp, int(deliver))
    system.receipt_handle = receipt_handle
    system.queue_id = message.queue_id
    system.queue_offset = message.queue_offset
    system.invisible_duration.seconds, ms = divmod(invisible_ms, 1000)
    system.invisible_duration.nanos = ms * 1_000_000
    system.delivery_attempt = delivery_attempt
    group = props.get(PROPERTY_SHARDING_KEY)
    if group:
        system.message_group = group
    out.body = message.body
    return out
