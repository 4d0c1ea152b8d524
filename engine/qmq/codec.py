"""QMQ's wire codec, as its client (``com.qunar.qmq:qmq`` 1.1.43) writes and reads it.

Read from QMQ's own source (``qmq-remoting``: ``EncodeHandler``/``DecodeHandler``, ``RemotingHeader``,
``CommandCode``, ``QMQSerializer``, ``MessagesPayloadHolder``, ``PullRequestSerde``,
``AckRequestPayloadHolder``, ``MetaInfoRequestPayloadHolder``; ``qmq-client``: ``PullService``,
``MetaInfoClientHandler``, ``NettyConnection``); the published 1.1.43 sources are the same files.

A frame is ``total (int32, excluding itself) | header size (int16) | header | body`` with the
header ``magic 0xdec10ade (int32) | code (int16) | version (int16) | opaque (int32) | flag (int32)
| request code (int16)``; ``total = 2 + header size + len(body)``. Flag bit 0 marks a response,
bit 1 a one-way request. Strings are ``int16 length | UTF-8``; every integer is big endian.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from engine.errors import RemotingProtocolError
from engine.remoting.frames import check_frame_length

MAGIC = 0xDEC10ADE
HEADER = struct.Struct(">Ihhiih")  # magic, code, version, opaque, flag, request code
MIN_HEADER_SIZE = HEADER.size  # 18, RemotingHeader.MIN_HEADER_SIZE
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
VERSION_8 = 8  # tags in the message header; one tag filter in a pull request
VERSION_9 = 9  # a list of pull filters (what the 1.1.43 client sends)
FLAG_RESPONSE = 1
FLAG_ONEWAY = 2


class Code:
    """``CommandCode``: response codes, then request codes."""

    SUCCESS = 0
    UNKNOWN_CODE = 3
    NO_MESSAGE = 4
    BROKER_ERROR = 51
    BROKER_REJECT = 52
    PARAM_ERROR = 53
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    ACK_REQUEST = 12
    CLIENT_REGISTER = 35
    HEARTBEAT = 100


class ProducerCode:
    """``MessageProducerCode``: the per-message result of a send."""

    SUCCESS = 0
    BROKER_BUSY = 1
    MESSAGE_DUPLICATE = 2
    SUBJECT_NOT_ASSIGNED = 3
    BROKER_READ_ONLY = 4
    BLOCK = 5
    STORE_ERROR = 6


class ClientType:
    """``ClientType`` codes of a CLIENT_REGISTER."""

    PRODUCER = 1
    CONSUMER = 2
    OTHER = 3
    DELAY_PRODUCER = 4


class RequestType:
    """``ClientRequestType`` codes of a CLIENT_REGISTER."""

    ONLINE = 1
    HEARTBEAT = 2


BROKER_STATE_RW = 1  # BrokerState.RW
ONLINE = 0  # OnOfflineState.ONLINE
OFFLINE = 1
MESSAGE_FLAG_DELAY = 2  # Flags: bit 1 a delayed message (its "expire time" is the schedule time)
MESSAGE_FLAG_TAGS = 4  # bit 2: a tag list follows the message id
TAG_FILTER = 1  # PullFilterType.TAG
SUB_ENV_FILTER = 2  # PullFilterType.SUB_ENV_ISOLATION
TAG_NONE, TAG_OR, TAG_AND = 0, 1, 2  # TagType codes


@dataclass(frozen=True)
class Frame:
    """One QMQ datagram: its header fields and its body."""

    code: int
    opaque: int = 0
    flag: int = 0
    version: int = VERSION_9
    request_code: int = -1
    body: bytes = b""

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code: int, body: bytes = b"") -> Frame:
        """The answer to this request (``RemotingBuilder.buildResponseDatagram``): same opaque and
        version, the request's code as request code, the response flag."""
        return Frame(code, self.opaque, FLAG_RESPONSE, self.version, self.code, body)


def encode_frame(frame: Frame) -> bytes:
    """The bytes of ``frame``, length prefix included."""
    header = HEADER.pack(MAGIC, frame.code, frame.version, frame.opaque, frame.flag, frame.request_code)
    total = 2 + len(header) + len(frame.body)
    return b"".join((struct.pack(">ih", total, len(header)), header, frame.body))


def check_length(length: int, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> int:
    """Validate a frame's length prefix: room for the header size and the fixed header, at most
    ``max_frame_bytes``.

    Raises:
        RemotingProtocolError: too short or too long.
    """
    check_frame_length(length, max_frame_bytes)
    if length < 2 + MIN_HEADER_SIZE:
        raise RemotingProtocolError(
            f"QMQ frame length {length} is below {2 + MIN_HEADER_SIZE} bytes", field="length", length=length
        )
    return length


def decode_frame(payload: bytes) -> Frame:
    """Decode one frame without its 4-byte length prefix.

    Raises:
        RemotingProtocolError: a bad magic code, a header size outside the frame or below 18 bytes.
    """
    if len(payload) < 2 + MIN_HEADER_SIZE:
        raise RemotingProtocolError(f"QMQ frame of {len(payload)} bytes has no header", field="length")
    (header_size,) = struct.unpack_from(">h", payload)
    if header_size < MIN_HEADER_SIZE or 2 + header_size > len(payload):
        raise RemotingProtocolError(
            f"header size {header_size} is outside {MIN_HEADER_SIZE}..{len(payload) - 2}", field="headerSize"
        )
    magic, code, version, opaque, flag, request_code = HEADER.unpack_from(payload, 2)
    if magic != MAGIC:
        raise RemotingProtocolError(f"illegal magic code {magic:#x}", field="magic")
    return Frame(code, opaque, flag, version, request_code, bytes(payload[2 + header_size :]))


# ----------------------------------------------------------------- payload primitives
class Reader:
    """Reads a payload; any read past its end raises :class:`RemotingProtocolError`."""

    def __init__(self, data: bytes, what: str = "payload") -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise RemotingProtocolError(
                f"{self.what} is truncated: {n} bytes wanted at {self.pos} of {len(self.data)}",
                field=self.what,
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def _unpack(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        value: int = struct.unpack(fmt, self.take(size))[0]
        return value

    def int8(self) -> int:
        return self._unpack(">b")

    def int16(self) -> int:
        return self._unpack(">h")

    def int32(self) -> int:
        return self._unpack(">i")

    def int64(self) -> int:
        return self._unpack(">q")

    def string(self) -> str:
        raw = self.take(self.int16())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RemotingProtocolError(
                f"{self.what} holds a string that is not UTF-8", field=self.what
            ) from None


def string_bytes(text: str) -> bytes:
    """``PayloadHolderUtils.writeString``: int16 length, UTF-8 bytes."""
    raw = text.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise RemotingProtocolError(f"string of {len(raw)} bytes is too long for QMQ", field="string")
    return struct.pack(">h", len(raw)) + raw


def read_string_map(data: bytes) -> dict[str, str]:
    """``PayloadHolderUtils.readStringMap``: an int16 count, then key and value strings.

    Raises:
        RemotingProtocolError: truncated or not UTF-8.
    """
    reader = Reader(data, "string map")
    return {reader.string(): reader.string() for _ in range(max(reader.int16(), 0))}


def write_string_map(values: Mapping[str, str]) -> bytes:
    return struct.pack(">h", len(values)) + b"".join(
        string_bytes(k) + string_bytes(v) for k, v in values.items()
    )


# ----------------------------------------------------------------- messages
@dataclass(frozen=True)
class QmqMessage:
    """A message as QMQ carries it. ``attrs`` is the message's property map in QMQ's encoding
    (key and value strings, back to back), kept as bytes so that it travels back unchanged."""

    subject: str
    message_id: str
    created_ms: int
    expire_ms: int  # the schedule time of a delayed message
    flag: int = 0
    tags: tuple[str, ...] = ()
    attrs: bytes = b""

    @property
    def is_delay(self) -> bool:
        return bool(self.flag & MESSAGE_FLAG_DELAY)

    def attributes(self) -> dict[str, str]:
        """The property map (``PullService.deserializeMap``).

        Raises:
            RemotingProtocolError: the attrs bytes are not key/value strings.
        """
        return decode_attrs(self.attrs)


def decode_attrs(data: bytes) -> dict[str, str]:
    """QMQ's message property map: key and value strings back to back, as the client reads them
    (while at least 4 bytes are left)."""
    reader = Reader(data, "message attributes")
    out: dict[str, str] = {}
    while reader.remaining() >= 4:
        key = reader.string()
        out[key] = reader.string()
    return out


def encode_attrs(values: Mapping[str, str]) -> bytes:
    return b"".join(string_bytes(k) + string_bytes(v) for k, v in values.items())


def _read_message_header(reader: Reader) -> QmqMessage:
    flag = reader.int8()
    created = reader.int64()
    expire = reader.int64()
    subject = reader.string()
    message_id = reader.string()
    tags: tuple[str, ...] = ()
    if flag & MESSAGE_FLAG_TAGS:
        count = reader.int8()
        tags = tuple(reader.string() for _ in range(max(count, 0)))
    attrs = reader.take(reader.int32())
    return QmqMessage(subject, message_id, created, expire, flag, tags, attrs)


def _message_bytes(message: QmqMessage) -> bytes:
    flag = message.flag | MESSAGE_FLAG_TAGS if message.tags else message.flag & ~MESSAGE_FLAG_TAGS
    parts = [
        struct.pack(">bqq", _signed_byte(flag), message.created_ms, message.expire_ms),
        string_bytes(message.subject),
        string_bytes(message.message_id),
    ]
    if message.tags:
        parts.append(struct.pack(">b", len(message.tags)))
        parts += [string_bytes(t) for t in message.tags]
    parts += [struct.pack(">i", len(message.attrs)), message.attrs]
    return b"".join(parts)


def _signed_byte(value: int) -> int:
    value &= 0xFF
    return value - 256 if value > 127 else value


def decode_send_messages(body: bytes) -> list[QmqMessage]:
    """The messages of a SEND_MESSAGE body: each ``crc (int64) | message`` (``MessagesPayloadHolder``).

    Raises:
        RemotingProtocolError: a truncated or malformed message.
    """
    reader = Reader(body, "SEND_MESSAGE body")
    out = []
    while reader.remaining():
        reader.int64()  # the client's CRC32 of the message, not checked (as QMQ's broker)
        out.append(_read_message_header(reader))
    return out


def encode_send_messages(messages: Iterable[QmqMessage]) -> bytes:
    """A SEND_MESSAGE body (the CRC field written as 0): for tests and tools."""
    return b"".join(struct.pack(">q", 0) + _message_bytes(m) for m in messages)


def encode_send_results(results: Sequence[tuple[str, int, str]]) -> bytes:
    """A SEND_MESSAGE response body: ``message id | code (int32) | remark`` per message."""
    return b"".join(
        string_bytes(mid) + struct.pack(">i", code) + string_bytes(remark) for mid, code, remark in results
    )


def decode_send_results(body: bytes) -> list[tuple[str, int, str]]:
    reader = Reader(body, "send results")
    out = []
    while reader.remaining():
        out.append((reader.string(), reader.int32(), reader.string()))
    return out


def encode_pulled(first_pull_sequence: int, messages: Sequence[QmqMessage]) -> bytes:
    """A PULL_MESSAGE response body: the first message's pull-log sequence, -1, then the messages
    (without CRC); the client numbers them ``first, first + 1, …``."""
    return struct.pack(">qq", first_pull_sequence, -1) + b"".join(_message_bytes(m) for m in messages)


def decode_pulled(body: bytes) -> tuple[int, list[QmqMessage]]:
    reader = Reader(body, "pulled messages")
    first = reader.int64()
    reader.int64()
    out = []
    while reader.remaining():
        out.append(_read_message_header(reader))
    return first, out


# ----------------------------------------------------------------- requests
@dataclass(frozen=True)
class TagFilter:
    """A tag pull filter: ``kind`` is TAG_OR or TAG_AND."""

    kind: int
    tags: tuple[str, ...]


@dataclass(frozen=True)
class PullRequest:
    subject: str
    group: str
    consumer_id: str
    request_num: int
    offset: int
    pull_offset_begin: int
    pull_offset_last: int
    timeout_ms: int
    broadcast: bool
    filters: tuple[TagFilter, ...] = field(default=())


def _read_tag_filter(reader: Reader) -> TagFilter | None:
    kind = reader.int16()
    count = reader.int8()
    tags = []
    for _ in range(max(count, 0)):
        tags.append(reader.take(reader.int16()).decode("utf-8", "replace"))
    return None if kind == TAG_NONE else TagFilter(kind, tuple(tags))


def decode_pull_request(body: bytes, version: int) -> PullRequest:
    """``PullRequestSerde.read``.

    Raises:
        RemotingProtocolError: truncated, or an unknown filter type.
    """
    reader = Reader(body, "PULL_MESSAGE body")
    subject, group, consumer_id = reader.string(), reader.string(), reader.string()
    request_num, offset = reader.int32(), reader.int64()
    begin, last, timeout = reader.int64(), reader.int64(), reader.int64()
    broadcast = reader.int8() != 0
    filters: list[TagFilter] = []
    if version >= VERSION_9:
        for _ in range(max(reader.int32(), 0)):
            kind = reader.int16()
            if kind == TAG_FILTER:
                found = _read_tag_filter(reader)
                if found is not None:
                    filters.append(found)
            elif kind == SUB_ENV_FILTER:
                reader.string()
                reader.string()
            else:
                raise RemotingProtocolError(f"unknown pull filter type {kind}", field="filters")
    elif version >= VERSION_8:
        found = _read_tag_filter(reader)
        if found is not None:
            filters.append(found)
    return PullRequest(
        subject, group, consumer_id, request_num, offset, begin, last, timeout, broadcast, tuple(filters)
    )


def encode_pull_request(request: PullRequest) -> bytes:
    """``PullRequestSerde.write`` (version 9): for tests and tools."""
    parts = [string_bytes(request.subject), string_bytes(request.group), string_bytes(request.consumer_id)]
    parts.append(
        struct.pack(
            ">iqqqqb",
            request.request_num,
            request.offset,
            request.pull_offset_begin,
            request.pull_offset_last,
            request.timeout_ms,
            1 if request.broadcast else 0,
        )
    )
    parts.append(struct.pack(">i", len(request.filters)))
    for f in request.filters:
        parts.append(struct.pack(">hhb", TAG_FILTER, f.kind, len(f.tags)))
        parts += [string_bytes(t) for t in f.tags]
    return b"".join(parts)


@dataclass(frozen=True)
class AckRequest:
    subject: str
    group: str
    consumer_id: str
    pull_offset_begin: int
    pull_offset_last: int
    broadcast: int = -1


def decode_ack_request(body: bytes) -> AckRequest:
    """``AckRequestPayloadHolder``'s layout.

    Raises:
        RemotingProtocolError: truncated.
    """
    reader = Reader(body, "ACK_REQUEST body")
    subject, group, consumer_id = reader.string(), reader.string(), reader.string()
    begin, last = reader.int64(), reader.int64()
    broadcast = reader.int8() if reader.remaining() else -1
    return AckRequest(subject, group, consumer_id, begin, last, broadcast)


def encode_ack_request(request: AckRequest) -> bytes:
    return (
        string_bytes(request.subject)
        + string_bytes(request.group)
        + string_bytes(request.consumer_id)
        + struct.pack(">qqb", request.pull_offset_begin, request.pull_offset_last, request.broadcast)
    )


@dataclass(frozen=True)
class BrokerGroup:
    name: str
    master: str
    update_ms: int
    state: int = BROKER_STATE_RW


def encode_meta_response(
    timestamp_ms: int,
    subject: str,
    consumer_group: str,
    state: int,
    client_type: int,
    groups: Sequence[BrokerGroup],
) -> bytes:
    """A CLIENT_REGISTER response body, as ``MetaInfoClientHandler`` reads it."""
    parts = [
        struct.pack(">q", timestamp_ms),
        string_bytes(subject),
        string_bytes(consumer_group),
        struct.pack(">bbh", state, client_type, len(groups)),
    ]
    for g in groups:
        parts += [string_bytes(g.name), string_bytes(g.master), struct.pack(">qb", g.update_ms, g.state)]
    return b"".join(parts)
