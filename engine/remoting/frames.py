"""RocketMQ remoting frames: the length-prefixed command a client and a server exchange.

A frame is ``total length (4 bytes, big endian, excluding itself) | serialize type (1 byte) and
header length (3 bytes) | header | body``. The header is a JSON object (RocketMQ's default
serialization) or RocketMQ's own binary layout; both carry ``code, language, version, opaque, flag,
remark, extFields``. A response answers the same ``opaque`` and sets bit 0 of ``flag``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.errors import RemotingProtocolError
from engine.remoting.codes import RPC_ONEWAY, RPC_RESPONSE, LanguageCode, SerializeType

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024  # RocketMQ's default frame limit (16 MiB)
SERVER_VERSION = 409  # MQVersion.Version.V4_9_8 ordinal (V4_9_3 is 399): what the broker reports
_LEN = struct.Struct(">i")
_RMQ_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag


@dataclass(frozen=True)
class RemotingCommand:
    """One request or response (RocketMQ's ``RemotingCommand``).

    Attributes:
        code: the request code, or the response code of a response.
        opaque: the request id a response answers.
        flag: bit 0 marks a response, bit 1 a one-way request.
        ext_fields: the custom header, name to string value.
        body: the payload (messages, JSON bodies).
        serialize_type: how the header travels (a response uses its request's).
    """

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: str = "JAVA"
    version: int = SERVER_VERSION
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        """True for a response (flag bit 0)."""
        return bool(self.flag & RPC_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """True for a request that expects no response (flag bit 1)."""
        return bool(self.flag & RPC_ONEWAY)

    def response(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: Mapping[str, object] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """A response to this request: same opaque and serialization, response flag set.

        ``ext_fields`` values are turned into strings (``None`` values are left out), as Java's
        ``makeCustomHeaderToNet`` does."""
        fields = {k: _text(v) for k, v in (ext_fields or {}).items() if v is not None}
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=RPC_RESPONSE,
            remark=remark,
            ext_fields=fields,
            body=body,
            serialize_type=self.serialize_type,
        )


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ----------------------------------------------------------------- encoding
def _json_header(cmd: RemotingCommand) -> bytes:
    header: dict[str, object] = {
        "code": cmd.code,
        "extFields": dict(cmd.ext_fields),
        "flag": cmd.flag,
        "language": cmd.language,
        "opaque": cmd.opaque,
        "serializeTypeCurrentRPC": cmd.serialize_type.name,
        "version": cmd.version,
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()


def _rmq_header(cmd: RemotingCommand) -> bytes:
    try:
        language = LanguageCode[cmd.language]
    except KeyError:
        language = LanguageCode.OTHER
    parts = [_RMQ_FIXED.pack(cmd.code, language, cmd.version, cmd.opaque, cmd.flag)]
    remark = (cmd.remark or "").encode()
    parts += [_LEN.pack(len(remark)), remark]
    fields = b"".join(
        struct.pack(">h", len(k)) + k + _LEN.pack(len(v)) + v
        for k, v in ((k.encode(), v.encode()) for k, v in cmd.ext_fields.items())
    )
    parts += [_LEN.pack(len(fields)), fields]
    return b"".join(parts)


def encode_command(cmd: RemotingCommand) -> bytes:
    """The complete frame of ``cmd``, length prefix included."""
    header = _rmq_header(cmd) if cmd.serialize_type is SerializeType.ROCKETMQ else _json_header(cmd)
    total = 4 + len(header) + len(cmd.body)
    return b"".join(
        (_LEN.pack(total), _LEN.pack((int(cmd.serialize_type) << 24) | len(header)), header, cmd.body)
    )


# ----------------------------------------------------------------- decoding
def check_frame_length(length: int, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> int:
    """Validate a frame's length prefix (the bytes that follow it).

    Raises:
        RemotingProtocolError: shorter than the header-length word, or longer than the limit.
    """
    if length < 4 or length > max_frame_bytes:
        raise RemotingProtocolError(
            f"frame length {length} is outside 4..{max_frame_bytes} bytes", field="length", length=length
        )
    return length


def decode_frame(payload: bytes) -> RemotingCommand:
    """Decode one frame without its 4-byte length prefix (the ``length`` bytes that follow it).

    Raises:
        RemotingProtocolError: a header length past the frame, an unknown serialize type, a header
            that is not a JSON object (or a malformed binary header), fields of the wrong type.
    """
    if len(payload) < 4:
        raise RemotingProtocolError(f"frame of {len(payload)} bytes has no header length", field="length")
    word = _LEN.unpack_from(payload)[0]
    kind, header_len = (word >> 24) & 0xFF, word & 0xFFFFFF
    if header_len > len(payload) - 4:
        raise RemotingProtocolError(
            f"header length {header_len} exceeds the frame ({len(payload) - 4} bytes)", field="headerLength"
        )
    if kind not in SerializeType._value2member_map_:
        raise RemotingProtocolError(
            f"unknown serialize type {kind}; known: 0 (JSON), 1 (ROCKETMQ)", field="type"
        )
    header = payload[4 : 4 + header_len]
    body = bytes(payload[4 + header_len :])
    if kind == SerializeType.ROCKETMQ:
        return _decode_rmq(header, body)
    return _decode_json(header, body)


def _int_field(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RemotingProtocolError(f"header field {name!r} must be an integer, got {value!r}", field=name)
    return value


def _decode_json(header: bytes, body: bytes) -> RemotingCommand:
    try:
        data = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RemotingProtocolError(f"header is not JSON: {exc}", field="header") from None
    if not isinstance(data, dict):
        raise RemotingProtocolError("header must be a JSON object", field="header")
    ext = data.get("extFields") or {}
    if not isinstance(ext, dict):
        raise RemotingProtocolError("header field 'extFields' must be an object", field="extFields")
    remark = data.get("remark")
    language = data.get("language", "JAVA")
    return RemotingCommand(
        code=_int_field(data.get("code"), "code"),
        opaque=_int_field(data.get("opaque", 0), "opaque"),
        flag=_int_field(data.get("flag", 0), "flag"),
        remark=remark if isinstance(remark, str) else None,
        ext_fields={str(k): _text(v) for k, v in ext.items() if v is not None},
        body=body,
        language=language if isinstance(language, str) else "OTHER",
        version=_int_field(data.get("version", 0), "version"),
        serialize_type=SerializeType.JSON,
    )


def _decode_rmq(header: bytes, body: bytes) -> RemotingCommand:
    try:
        code, language, version, opaque, flag = _RMQ_FIXED.unpack_from(header)
        pos = _RMQ_FIXED.size
        (remark_len,) = _LEN.unpack_from(header, pos)
        pos += 4
        remark = header[pos : pos + remark_len].decode() if remark_len > 0 else None
        pos += max(remark_len, 0)
        (fields_len,) = _LEN.unpack_from(header, pos)
        pos += 4
        end = pos + fields_len
        if remark_len < 0 or fields_len < 0 or end > len(header):
            raise ValueError("lengths past the header")
        fields: dict[str, str] = {}
        while pos < end:
            (klen,) = struct.unpack_from(">h", header, pos)
            key = header[pos + 2 : pos + 2 + klen].decode()
            pos += 2 + klen
            (vlen,) = _LEN.unpack_from(header, pos)
            fields[key] = header[pos + 4 : pos + 4 + vlen].decode()
            pos += 4 + vlen
            if klen < 0 or vlen < 0 or pos > end:
                raise ValueError("a field runs past the header")
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise RemotingProtocolError(f"binary header is malformed: {exc}", field="header") from None
    try:
        lang = LanguageCode(language).name
    except ValueError:
        lang = "OTHER"
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=fields,
        body=body,
        language=lang,
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )
