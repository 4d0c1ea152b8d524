"""Between a RocketMQ client's message and the engine's: properties in, stored layout out.

A client's message arrives as topic, body and a properties string; the system properties in it
(TAGS, KEYS, UNIQ_KEY, DELAY, TRAN_MSG, PGROUP, WAIT, ...) become the engine's fields, the rest stay
user properties. A stored message leaves in the stored-message layout, its tags, keys and unique id
put back as the properties the client's decoder reads.
"""

from __future__ import annotations

import functools
import ipaddress
import zlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from engine.errors import InvalidMessageError
from engine.model import Message, MessageExt
from engine.protocol.messages import MAX_BODY_BYTES
from engine.protocol.names import (
    PROPERTY_BORN_HOST,
    PROPERTY_DELAY,
    PROPERTY_FLAG,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    RESERVED_PROPERTIES,
    TIMER_REQUEST_PROPERTIES,
)
from engine.remoting.codes import MessageSysFlag
from engine.remoting.message_layout import WireMessage, encode_properties, pack_stored

if TYPE_CHECKING:
    import pyarrow as pa

PROPERTY_PRODUCER_GROUP = "PGROUP"
# The one cluster this endpoint is; RocketMQ's broker stamps every message with its cluster, which a
# request's responder names its reply topic after (``MessageUtil.createReplyMessage``).
CLUSTER_NAME = "lakemq"
PROPERTY_CLUSTER = "CLUSTER"
REPLY_TOPIC = f"{CLUSTER_NAME}_REPLY_TOPIC"
PROPERTY_REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
PROPERTY_PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
# Reserved names a client sets itself for request-reply (``DefaultMQProducer.request``): kept.
REQUEST_REPLY_PROPERTIES = frozenset({"CORRELATION_ID", PROPERTY_REPLY_TO_CLIENT, "TTL", "MSG_TYPE"})


_NOTHING: Mapping[str, str] = MappingProxyType({})


class IncomingMessage(NamedTuple):
    """A client's message, split into the engine's fields (a tuple: a batch makes 32 a request, and
    a frozen dataclass took a third of the door's work per message to build)."""

    message: Message
    uniq_key: str | None = None
    delay_level: int = 0
    transactional: bool = False
    producer_group: str | None = None
    extra: Mapping[str, str] = _NOTHING
    born_ts_ms: int | None = None  # the client's bornTimestamp (None: unknown, the broker's now)
    broker_properties: Mapping[str, str] = _NOTHING  # born host, flag


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


def incoming(
    topic: str,
    body: bytes,
    properties: Mapping[str, str],
    *,
    born_host: tuple[str, int] | None = None,
    flag: int = 0,
    born_ts_ms: int = 0,
) -> IncomingMessage:
    """Split a client's properties into the engine's message fields.

    System properties the broker owns are dropped (a client may not set them); a delay level that
    is not a number is refused; those a request carries for its reply
    (:data:`REQUEST_REPLY_PROPERTIES`) are kept. What RocketMQ's stored layout keeps outside the
    properties (the producer's address ``born_host``, the message's ``flag``) is kept as
    broker-owned properties (:func:`born_properties`), and a positive ``born_ts_ms`` as the
    message's birth.

    Raises:
        InvalidMessageError: a DELAY that is not an integer.
    """
    props = dict(properties)
    tags = props.pop(PROPERTY_TAGS, None) or None
    keys_text = props.pop(PROPERTY_KEYS, "")
    keys = tuple(k for k in keys_text.split(" ") if k) if keys_text else ()
    uniq = props.pop(PROPERTY_UNIQ_KEY, None) or None
    delay_text = props.pop(PROPERTY_DELAY, None)
    try:
        delay = int(delay_text) if delay_text else 0
    except ValueError:
        raise InvalidMessageError(f"property DELAY {delay_text!r} is not an integer", topic=topic) from None
    transactional = (props.pop(PROPERTY_TRANSACTION_PREPARED, "") or "").lower() == "true"
    group = props.pop(PROPERTY_PRODUCER_GROUP, None)
    # One pass (a message of a batch comes here 32 times a request): the user's own, those kept
    # for a reply, and the rest (the broker's, which a client may not set) dropped.
    user: dict[str, str] = {}
    kept: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for k, v in props.items():
        users = k not in RESERVED_PROPERTIES or k in TIMER_REQUEST_PROPERTIES
        if users:
            user[k] = v
        if k in REQUEST_REPLY_PROPERTIES:
            kept[k] = v
        elif not users:
            dropped[k] = v
    born = born_properties(born_host, flag)
    return IncomingMessage(
        Message(topic, body, tags=tags, keys=keys, properties=user),
        uniq_key=uniq,
        delay_level=max(delay, 0),
        transactional=transactional,
        producer_group=group,
        extra=dropped,
        born_ts_ms=born_ts_ms if born_ts_ms > 0 else None,
        broker_properties={**kept, **born} if kept else born,
    )


@functools.lru_cache(maxsize=4096)
def _ipv4(host: str) -> bool:
    """Whether ``host`` is an IPv4 address (cached: every message a client sends asks it of the
    client's own few addresses, and parsing one took a third of the door's work per message)."""
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False


def born_properties(born_host: tuple[str, int] | None, flag: int) -> dict[str, str]:
    """The broker-owned properties that keep a client message's born host (an IPv4 peer: the
    stored layout has room for no other) and its flag (when not 0). A new dict each call."""
    return dict(_born_properties(born_host, flag))


@functools.lru_cache(maxsize=4096)
def _born_properties(born_host: tuple[str, int] | None, flag: int) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    if born_host is not None and _ipv4(born_host[0]):
        out.append((PROPERTY_BORN_HOST, f"{born_host[0]}:{born_host[1]}"))
    if flag:
        out.append((PROPERTY_FLAG, str(flag)))
    return tuple(out)


def born_host_of(properties: Mapping[str, str], default: tuple[str, int]) -> tuple[str, int]:
    """The born host a stored message's properties keep, or ``default`` (a message a door did not
    send: the Python API's, a broker re-put)."""
    found = _born_host(properties.get(PROPERTY_BORN_HOST) or "")
    return default if found is None else found


@functools.lru_cache(maxsize=4096)
def _born_host(text: str) -> tuple[str, int] | None:
    host, _, port = text.rpartition(":")
    return (host, int(port)) if _ipv4(host) and port.isdigit() else None


def flag_of(properties: Mapping[str, str]) -> int:
    """The flag a stored message's properties keep (0: none, or not a 32-bit int)."""
    text = properties.get(PROPERTY_FLAG, "0")
    try:
        value = int(text)
    except ValueError:
        return 0
    return value if -(2**31) <= value < 2**31 else 0


def outgoing_properties(m: MessageExt, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The properties a client reads: the stored ones plus TAGS, KEYS, UNIQ_KEY and CLUSTER (the born
    host and flag travel in the layout's own fields)."""
    return _outgoing(m.properties, m.tags, m.keys, m.uniq_key, extra)


def _outgoing(
    stored: Mapping[str, str],
    tags: str | None,
    keys: Sequence[str],
    uniq_key: str,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    props = {k: v for k, v in stored.items() if k != PROPERTY_BORN_HOST and k != PROPERTY_FLAG}
    props[PROPERTY_CLUSTER] = CLUSTER_NAME
    if tags:
        props[PROPERTY_TAGS] = tags
    if keys and PROPERTY_KEYS not in props:
        props[PROPERTY_KEYS] = " ".join(keys)
    if uniq_key:
        props[PROPERTY_UNIQ_KEY] = uniq_key
    if extra:
        props.update(extra)
    return props


_ROW_COLUMNS = (
    "topic",
    "queue_id",
    "queue_offset",
    "physical_offset",
    "msg_id",
    "uniq_key",
    "body",
    "tags",
    "keys",
    "properties",
    "born_ts_ms",
    "store_ts_ms",
    "reconsume_times",
    "sys_flag",
)


def encode_rows(rows: pa.Table, store_host: tuple[str, int]) -> list[bytes]:
    """Each commit-log row as a pull response's body holds it: what
    ``encode_stored(to_wire(MessageExt.from_row(row), store_host))`` makes, column by column and
    without those objects (a read ahead encodes a thousand messages at a time).

    Raises:
        RemotingProtocolError: a topic or properties too long for the layout.
    """
    columns = [rows[name].to_pylist() for name in _ROW_COLUMNS]
    return [
        encode_row(*row, store_host=store_host)  # type: ignore[misc]
        for row in zip(*columns, strict=True)
    ]


def encode_row(
    topic: str,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    offset_id: str,
    uniq_key: str | None,
    body: bytes,
    tags: str | None,
    keys: Sequence[str] | None,
    properties: Mapping[str, str] | Sequence[tuple[str, str]] | None,
    born_ts_ms: int,
    store_ts_ms: int,
    reconsume_times: int | None,
    sys_flag: int | None,
    *,
    store_host: tuple[str, int],
) -> bytes:
    """One stored message, given by the fields of its commit-log row (the properties as a mapping
    or as the pairs a map column reads back), as a pull response's body holds it (:func:`encode_rows`).

    Raises:
        RemotingProtocolError: a topic or properties too long for the layout.
    """
    stored = dict(properties) if properties else {}
    props = _outgoing(stored, tags, keys or (), uniq_key or offset_id)
    return pack_stored(
        _topic_bytes(topic),
        encode_properties(props).encode(),
        body,
        queue_id,
        flag_of(stored),
        queue_offset,
        physical_offset,
        sys_flag or 0,
        born_ts_ms,
        born_host_of(stored, store_host),
        store_ts_ms,
        store_host,
        reconsume_times or 0,
    )


@functools.lru_cache(maxsize=4096)
def _topic_bytes(topic: str) -> bytes:
    return topic.encode()


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
        flag=flag_of(m.properties),
        sys_flag=m.sys_flag if sys_flag is None else sys_flag,
        born_ts_ms=m.born_ts_ms,
        born_host=born_host_of(m.properties, store_host),
        store_ts_ms=m.store_ts_ms,
        store_host=store_host,
        reconsume_times=m.reconsume_times,
    )
