"""Remoting frames: RocketMQ's length-prefixed commands, JSON and binary headers, bad frames."""

from __future__ import annotations

import json
import struct

import pytest

from engine.errors import RemotingProtocolError
from engine.remoting.codes import RPC_ONEWAY, RPC_RESPONSE, RequestCode, ResponseCode, SerializeType
from engine.remoting.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    RemotingCommand,
    check_frame_length,
    decode_frame,
    encode_command,
)


def _frame(header: bytes, body: bytes = b"", kind: int = 0) -> bytes:
    """A frame built by hand as Java's RemotingCommand.encode lays it out."""
    return struct.pack(">ii", 4 + len(header) + len(body), (kind << 24) | len(header)) + header + body


def test_json_frame_is_total_length_then_type_and_header_length_then_header_then_body() -> None:
    cmd = RemotingCommand(code=RequestCode.SEND_MESSAGE, opaque=5, ext_fields={"topic": "T"}, body=b"xy")
    frame = encode_command(cmd)
    total, word = struct.unpack(">ii", frame[:8])
    header_len = word & 0xFFFFFF
    assert word >> 24 == 0  # JSON
    assert total == len(frame) - 4 == 4 + header_len + 2
    header = json.loads(frame[8 : 8 + header_len])
    assert header["code"] == 10 and header["opaque"] == 5 and header["flag"] == 0
    assert header["extFields"] == {"topic": "T"} and header["language"] == "JAVA"
    assert frame[8 + header_len :] == b"xy"


def test_a_frame_as_the_java_client_sends_it_decodes() -> None:
    header = (
        b'{"code":105,"extFields":{"topic":"Orders"},"flag":0,"language":"JAVA",'
        b'"opaque":3,"serializeTypeCurrentRPC":"JSON","version":399}'
    )
    cmd = decode_frame(_frame(header)[4:])
    assert (cmd.code, cmd.opaque, cmd.version, cmd.language) == (105, 3, 399, "JAVA")
    assert cmd.ext_fields == {"topic": "Orders"} and cmd.body == b"" and not cmd.is_response


def test_binary_header_has_rocketmq_field_layout() -> None:
    cmd = RemotingCommand(
        code=105, opaque=1, version=399, ext_fields={"topic": "T"}, serialize_type=SerializeType.ROCKETMQ
    )
    frame = encode_command(cmd)
    expected_header = (
        b"\x00\x69"  # code 105 (short)
        + b"\x00"  # language JAVA
        + b"\x01\x8f"  # version 399 (short)
        + b"\x00\x00\x00\x01"  # opaque
        + b"\x00\x00\x00\x00"  # flag
        + b"\x00\x00\x00\x00"  # remark length 0
        + b"\x00\x00\x00\x0c"  # ext fields: 2 + 5 + 4 + 1 bytes
        + b"\x00\x05topic"
        + b"\x00\x00\x00\x01T"
    )
    assert frame == _frame(expected_header, kind=1)
    assert decode_frame(frame[4:]) == cmd


@pytest.mark.parametrize("kind", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_round_trip_keeps_every_field(kind: SerializeType) -> None:
    cmd = RemotingCommand(
        code=11,
        opaque=2**31 - 1,
        flag=RPC_ONEWAY,
        remark="über",
        ext_fields={"a": "1", "b": "x y"},
        body=bytes(range(256)),
        serialize_type=kind,
    )
    assert decode_frame(encode_command(cmd)[4:]) == cmd


def test_response_answers_the_opaque_with_the_response_bit_and_string_fields() -> None:
    request = RemotingCommand(code=30, opaque=42, serialize_type=SerializeType.ROCKETMQ)
    response = request.response(ResponseCode.SUCCESS, ext_fields={"offset": 7, "flag": True, "gone": None})
    assert response.opaque == 42 and response.flag == RPC_RESPONSE and response.is_response
    assert response.ext_fields == {"offset": "7", "flag": "true"}
    assert response.serialize_type is SerializeType.ROCKETMQ


@pytest.mark.parametrize("length", [-1, 0, 3, DEFAULT_MAX_FRAME_BYTES + 1])
def test_frame_length_outside_limits_is_refused(length: int) -> None:
    with pytest.raises(RemotingProtocolError, match="frame length"):
        check_frame_length(length)


def test_frame_length_at_the_limit_is_accepted() -> None:
    assert check_frame_length(DEFAULT_MAX_FRAME_BYTES) == DEFAULT_MAX_FRAME_BYTES
    assert check_frame_length(100, max_frame_bytes=100) == 100


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"\x00\x00", "no header length"),
        (struct.pack(">i", 50) + b"{}", "exceeds the frame"),
        (struct.pack(">i", (2 << 24) | 2) + b"{}", "unknown serialize type 2"),
        (struct.pack(">i", 5) + b"{nope", "not JSON"),
        (struct.pack(">i", 2) + b"[]", "JSON object"),
        (struct.pack(">i", 12) + b'{"code":"x"}', "'code' must be an integer"),
        (struct.pack(">i", 2) + b"{}", "'code' must be an integer"),
        (struct.pack(">i", (1 << 24) | 3) + b"\x00\x01\x00", "binary header is malformed"),
    ],
)
def test_bad_frames_raise_protocol_errors(payload: bytes, match: str) -> None:
    with pytest.raises(RemotingProtocolError, match=match):
        decode_frame(payload)


def test_binary_header_with_field_past_its_end_is_refused() -> None:
    header = (
        struct.pack(">hbhii", 10, 0, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 4) + b"\x00\x09ab"
    )
    with pytest.raises(RemotingProtocolError, match="malformed"):
        decode_frame(_frame(header, kind=1)[4:])
