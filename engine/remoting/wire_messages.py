"""Between a RocketMQ client's message and the engine's: properties in, stored layout out.

A client's message arrives as topic, body and a properties string; the system properties in it
(TAGS, KEYS, UNIQ_KEY, DELAY, TRAN_MSG, PGROUP, WAIT, ...) become the engine's fields, the rest stay
user properties. A stored message leaves in the stored-message layout, its tags, keys and unique id
put back as the properties the client's decoder reads.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.errors import InvalidMessageError
from engine.model import Message, MessageExt
from engine.protocol.messages import MAX_BODY_BYTES
from engine.protocol.names import (
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    RESERVED_PROPERTIES,
    TIMER_REQUEST_PROPERTIES,
)
from engine.remoting.codes import MessageSysFlag
from engine.remoting.message_layout import WireMessage

PROPERTY_PRODUCER_GROUP = "PGROUP"


@dataclass(frozen=True)
class IncomingMessage:
    """A client's message, split into the engine's fields."""

    message: Message
    uniq_key: str | None = None
    delay_level: int = 0
    transactional: bool = False
    producer_group: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def inflate(body: bytes, sys_flag: int) -> bytes:
    """The body a client sent, decompressed when its sysFlag says so (Java's producer zips bodies
    over 4 KiB). At most 4 MiB comes out, however small the compressed input.

    Raises:
        InvalidMessageError: a body flagged compressed that does not inflate, or inflates past 4 MiB.
    """
    if not sys_flag & MessageSysFlag.COMPRESSED:
        return body
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, MAX_BODY_BYTES + 1)
    except zlib.error as exc:
        raise InvalidMessageError(f"body is flagged compressed but does not inflate: {exc}") from None
    if len(out) > MAX_BODY_BYTES or inflater.unconsumed_tail:
        raise InvalidMessageError(f"compressed body inflates past {MAX_BODY_BYTES} bytes", size=len(out))
    return out


def incoming(topic: str, body: bytes, properties: Mapping[str, str]) -> IncomingMessage:
    """Split a client's properties into the engine's message fields.

    System properties the broker owns are dropped (a client may not set them); a delay level that
    is not a number is refused.

    Raises:
        InvalidMessageError: a DELAY that is not an integer.
    """
    props = dict(properties)
    tags = props.pop(PROPERTY_TAGS, None) or None
    keys = tuple(k for k in (props.pop(PROPERTY_KEYS, "") or "").split(" ") if k)
    uniq = props.pop(PROPERTY_UNIQ_KEY, None) or None
    delay_text = props.pop(PROPERTY_DELAY, None)
    try:
        delay = int(delay_text) if delay_text else 0
    except ValueError:
        raise InvalidMessageError(f"property DELAY {delay_text!r} is not an integer", topic=topic) from None
    transactional = (props.pop(PROPERTY_TRANSACTION_PREPARED, "") or "").lower() == "true"
    group = props.pop(PROPERTY_PRODUCER_GROUP, None)
    user = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES or k in TIMER_REQUEST_PROPERTIES}
    dropped = {k: v for k, v in props.items() if k not in user}
    return IncomingMessage(
        Message(topic, body, tags=tags, keys=keys, properties=user),
        uniq_key=uniq,
        delay_level=max(delay, 0),
        transactional=transactional,
        producer_group=group,
        extra=dropped,
    )


def outgoing_properties(m: MessageExt, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The properties a client reads: the stored ones plus TAGS, KEYS and UNIQ_KEY."""
    props = dict(m.properties)
    if m.tags:
        props[PROPERTY_TAGS] = m.tags
    if m.keys and PROPERTY_KEYS not in props:
        props[PROPERTY_KEYS] = " ".join(m.keys)
    if m.uniq_key:
        props[PROPERTY_UNIQ_KEY] = m.uniq_key
    if extra:
        props.update(extra)
    return props


def to_wire(
    m: MessageExt,
    store_host: tuple[str, int],
    *,
    topic: str | None = None,
    queue_id: int | None = None,
    extra: Mapping[str, str] | None = None,
    sys_flag: int | None = None,
) -> WireMessage:
    """A stored message in the layout a client decodes (``topic`` / ``queue_id`` override what the
    row says, for a half message shown in its real queue)."""
    return WireMessage(
        topic=topic if topic is not None else m.topic,
        queue_id=queue_id if queue_id is not None else m.queue_id,
        queue_offset=m.queue_offset,
        physical_offset=m.physical_offset,
        body=m.body,
        properties=outgoing_properties(m, extra),
        sys_flag=m.sys_flag if sys_flag is None else sys_flag,
        born_ts_ms=m.born_ts_ms,
        born_host=store_host,
        store_ts_ms=m.store_ts_ms,
        store_host=store_host,
        reconsume_times=m.reconsume_times,
    )
