"""The binary message layouts RocketMQ clients read and write.

* The stored-message layout (``MessageDecoder.decode``): what a pull response's body holds, one
  record after another, and what a transaction check-back carries. IPv4 hosts only.
* The batch layout (``MessageDecoder.encodeMessages``): the body of SEND_BATCH_MESSAGE.
* Properties travel as ``name\\x01value\\x02`` pairs.
* The offset message id: store host (ip, port) + commit-log physical offset, 16 bytes of hex.
"""

from __future__ import annotations

import functools
import socket
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from engine.errors import RemotingProtocolError

MESSAGE_MAGIC_CODE = -626843481  # MessageDecoder.MESSAGE_MAGIC_CODE (stored messages, v1)
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_BYTES = 32_767  # the properties length travels as a signed short
MAX_TOPIC_BYTES = 127  # the topic length travels as a signed byte

_HEAD = struct.Struct(
    ">iiiiiqqiq"
)  # size, magic, body crc, queue id, flag, queue off, phys off, sysflag, born ts
_BATCH_HEAD = struct.Struct(">iiiii")  # size, magic, body crc, flag, body length
# A stored record up to its body: _HEAD, then born host (ip, port), store time, store host (ip, port),
# reconsume times, prepared transaction offset, body length.
_STORED_HEAD = struct.Struct(">iiiiiqqiq4siq4siiqi")
_LENGTHS = struct.Struct(">b")
_PROPS_LENGTH = struct.Struct(">h")


def encode_properties(properties: Mapping[str, str]) -> str:
    """``name\\x01value\\x02`` for each property (RocketMQ's ``messageProperties2String``)."""
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in properties.items())


def decode_properties(text: str) -> dict[str, str]:
    """Inverse of :func:`encode_properties`; a pair without a separator is skipped, as Java does."""
    out: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        name, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[name] = value
    return out


def body_crc(body: bytes) -> int:
    """RocketMQ's body CRC: CRC32 with the sign bit cleared (``UtilAll.crc32``)."""
    return zlib.crc32(body) & 0x7FFFFFFF


@functools.lru_cache(maxsize=1024)
def _ip4(host: str) -> bytes:
    try:
        return socket.inet_aton(host)
    except OSError:
        return socket.inet_aton(socket.gethostbyname(host))


def offset_msg_id(host: str, port: int, physical_offset: int) -> str:
    """The offset message id of a stored message: ip (4 bytes), port (4), physical offset (8), hex."""
    return (_ip4(host) + struct.pack(">iq", port, physical_offset)).hex().upper()


def offset_msg_ids(host: str, port: int, physical_offsets: Iterable[int]) -> list[str]:
    """:func:`offset_msg_id` of each physical offset (a batch's answer names every message)."""
    prefix = (_ip4(host) + struct.pack(">i", port)).hex().upper()
    return [f"{prefix}{p & 0xFFFFFFFFFFFFFFFF:016X}" for p in physical_offsets]


def parse_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """``(ip, port, physical_offset)`` of an offset message id (32 hex characters).

    Raises:
        RemotingProtocolError: not 32 hex characters.
    """
    try:
        raw = bytes.fromhex(msg_id)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != 16:
        raise RemotingProtocolError(f"offset msg id {msg_id!r} is not 32 hex characters", field="msgId")
    port, offset = struct.unpack(">iq", raw[4:])
    return socket.inet_ntoa(raw[:4]), port, offset


@dataclass(frozen=True)
class WireMessage:
    """A message in the stored layout: what a pull returns to a RocketMQ client."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    body: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_ts_ms: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_ts_ms: int = 0
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def msg_id(self) -> str:
        """The offset message id (store host + physical offset)."""
        return offset_msg_id(self.store_host[0], self.store_host[1], self.physical_offset)


def encode_stored(m: WireMessage) -> bytes:
    """One record of the stored-message layout.

    Raises:
        RemotingProtocolError: a topic longer than 127 bytes or properties longer than 32,767.
    """
    return pack_stored(
        m.topic.encode(),
        encode_properties(m.properties).encode(),
        m.body,
        m.queue_id,
        m.flag,
        m.queue_offset,
        m.physical_offset,
        m.sys_flag,
        m.born_ts_ms,
        m.born_host,
        m.store_ts_ms,
        m.store_host,
        m.reconsume_times,
        m.prepared_transaction_offset,
    )


def pack_stored(
    topic: bytes,
    props: bytes,
    body: bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_ts_ms: int,
    born_host: tuple[str, int],
    store_ts_ms: int,
    store_host: tuple[str, int],
    reconsume_times: int,
    prepared_transaction_offset: int = 0,
) -> bytes:
    """One record of the stored-message layout from its fields, the topic and the properties
    already encoded (:func:`encode_stored`; the pull path's read ahead calls it row by row).

    Raises:
        RemotingProtocolError: a topic longer than 127 bytes or properties longer than 32,767.
    """
    if len(topic) > MAX_TOPIC_BYTES or len(props) > MAX_PROPERTIES_BYTES:
        raise RemotingProtocolError(
            f"topic ({len(topic)} bytes) or properties ({len(props)} bytes) too long for the wire layout",
            field="properties",
        )
    return b"".join(
        (
            _STORED_HEAD.pack(
                _STORED_HEAD.size + len(body) + 1 + len(topic) + 2 + len(props),
                MESSAGE_MAGIC_CODE,
                body_crc(body),
                queue_id,
                flag,
                queue_offset,
                physical_offset,
                sys_flag & ~((1 << 4) | (1 << 5)),  # IPv4 born and store hosts
                born_ts_ms,
                _ip4(born_host[0]),
                born_host[1],
                store_ts_ms,
                _ip4(store_host[0]),
                store_host[1],
                reconsume_times,
                prepared_transaction_offset,
                len(body),
            ),
            body,
            _LENGTHS.pack(len(topic)),
            topic,
            _PROPS_LENGTH.pack(len(props)),
            props,
        )
    )


def decode_stored(data: bytes) -> list[WireMessage]:
    """Every record of a stored-layout buffer (a pull response's body), IPv4 hosts.

    Raises:
        RemotingProtocolError: a truncated record, a bad magic code or size.
    """
    out: list[WireMessage] = []
    pos = 0
    try:
        while pos < len(data):
            size, magic, _crc, qid, flag, qoff, phys, sys_flag, born_ts = _HEAD.unpack_from(data, pos)
            if magic != MESSAGE_MAGIC_CODE or size <= _HEAD.size or pos + size > len(data):
                raise RemotingProtocolError(f"bad stored record at byte {pos}", field="body")
            p = pos + _HEAD.size
            born_ip = socket.inet_ntoa(data[p : p + 4])
            born_port, store_ts = struct.unpack_from(">iq", data, p + 4)
            store_ip = socket.inet_ntoa(data[p + 16 : p + 20])
            store_port, reconsume, prepared, body_len = struct.unpack_from(">iiqi", data, p + 20)
            p += 40
            body = bytes(data[p : p + body_len])
            p += body_len
            topic_len = data[p]
            topic = data[p + 1 : p + 1 + topic_len].decode()
            p += 1 + topic_len
            (props_len,) = struct.unpack_from(">h", data, p)
            props = decode_properties(data[p + 2 : p + 2 + props_len].decode())
            if p + 2 + props_len != pos + size:
                raise RemotingProtocolError(
                    f"stored record at byte {pos} has an inconsistent size", field="body"
                )
            out.append(
                WireMessage(
                    topic,
                    qid,
                    qoff,
                    phys,
                    body,
                    props,
                    flag,
                    sys_flag,
                    born_ts,
                    (born_ip, born_port),
                    store_ts,
                    (store_ip, store_port),
                    reconsume,
                    prepared,
                )
            )
            pos += size
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise RemotingProtocolError(f"truncated stored record at byte {pos}: {exc}", field="body") from None
    return out


class BatchItem(NamedTuple):
    """One message of a SEND_BATCH_MESSAGE body: flag, body and properties (a tuple: a request
    holds 32 of them)."""

    body: bytes
    properties: Mapping[str, str] = MappingProxyType({})
    flag: int = 0


def encode_batch(items: list[BatchItem]) -> bytes:
    """The body of SEND_BATCH_MESSAGE (``MessageDecoder.encodeMessages``)."""
    parts = []
    for item in items:
        props = encode_properties(item.properties).encode()
        size = _BATCH_HEAD.size + len(item.body) + 2 + len(props)
        parts.append(_BATCH_HEAD.pack(size, 0, 0, item.flag, len(item.body)) + item.body)
        parts.append(struct.pack(">h", len(props)) + props)
    return b"".join(parts)


class BatchRecord(NamedTuple):
    """One message of a SEND_BATCH_MESSAGE body as it came: its properties still encoded."""

    body: bytes
    properties: str
    flag: int = 0


def split_property(text: str, name: str) -> tuple[str | None, str] | None:
    """The value of property ``name`` in the encoded ``text`` and ``text`` without that property,
    without decoding the others: ``(None, text)`` when it is not there, and None when it is there
    more than once (decode the text then: the last one holds)."""
    head = name + NAME_VALUE_SEPARATOR
    inner = PROPERTY_SEPARATOR + head
    if text.startswith(head):
        start = 0
    else:
        found = text.find(inner)
        if found < 0:
            return None, text
        start = found + 1
    if text.find(inner, start) >= 0:
        return None
    value_at = start + len(head)
    end = text.find(PROPERTY_SEPARATOR, value_at)
    if end < 0:
        return text[value_at:], text[:start]
    return text[value_at:end], text[:start] + text[end + 1 :]


def decode_batch_records(data: bytes) -> list[BatchRecord]:
    """The messages of a SEND_BATCH_MESSAGE body (inverse of :func:`encode_batch`), properties left
    encoded (:func:`decode_properties` decodes them).

    Raises:
        RemotingProtocolError: a truncated or inconsistent record.
    """
    out: list[BatchRecord] = []
    pos = 0
    try:
        while pos < len(data):
            size, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(data, pos)
            p = pos + _BATCH_HEAD.size
            if body_len < 0 or p + body_len + 2 > len(data):
                raise RemotingProtocolError(f"batch record at byte {pos} is truncated", field="body")
            body = bytes(data[p : p + body_len])
            p += body_len
            (props_len,) = struct.unpack_from(">h", data, p)
            if props_len < 0 or p + 2 + props_len > len(data):
                raise RemotingProtocolError(f"batch record at byte {pos} is truncated", field="body")
            props = data[p + 2 : p + 2 + props_len].decode()
            end = p + 2 + props_len
            if size != end - pos:
                raise RemotingProtocolError(
                    f"batch record at byte {pos} has an inconsistent size", field="body"
                )
            out.append(BatchRecord(body, props, flag))
            pos = end
    except (struct.error, UnicodeDecodeError) as exc:
        raise RemotingProtocolError(f"truncated batch record at byte {pos}: {exc}", field="body") from None
    return out
