"""QMQ's wire codec: what QMQ's client writes decodes to what it meant, what the door writes is
what the client reads, and a broken frame is a typed error, never a crash."""

from __future__ import annotations

import struct

import pytest

from engine.errors import RemotingProtocolError
from engine.qmq import codec
from engine.qmq.codec import AckRequest, BrokerGroup, Frame, PullRequest, QmqMessage, Reader, TagFilter


def test_a_frame_round_trips_with_its_header_fields() -> None:
    frame = Frame(codec.Code.PULL_MESSAGE, opaque=42, flag=0, version=9, request_code=11, body=b"xyz")
    raw = codec.encode_frame(frame)
    (total,) = struct.unpack_from(">i", raw)
    assert total == len(raw) - 4 == 2 + 18 + 3
    assert raw[6:10] == bytes.fromhex("dec10ade")  # the magic after total and header size
    assert codec.decode_frame(raw[4:]) == frame


def test_a_response_answers_its_request() -> None:
    request = Frame(codec.Code.ACK_REQUEST, opaque=7, version=8, request_code=12)
    response = request.response(codec.Code.SUCCESS, b"ok")
    assert (response.opaque, response.version, response.request_code) == (7, 8, codec.Code.ACK_REQUEST)
    assert response.is_response and not request.is_response
    assert codec.decode_frame(codec.encode_frame(response)[4:]) == response


def test_a_longer_header_is_skipped_by_its_size() -> None:
    header = codec.HEADER.pack(codec.MAGIC, 10, 9, 1, 0, 10) + b"\x00\x00"  # 2 bytes of a future field
    payload = struct.pack(">h", len(header)) + header + b"body"
    assert codec.decode_frame(payload).body == b"body"


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x00\x12" + b"\x00" * 10,  # header cut short
        struct.pack(">h", 18) + codec.HEADER.pack(0x12345678, 10, 9, 1, 0, 10),  # bad magic
        struct.pack(">h", 4) + codec.HEADER.pack(codec.MAGIC, 10, 9, 1, 0, 10),  # header size < 18
        struct.pack(">h", 400) + codec.HEADER.pack(codec.MAGIC, 10, 9, 1, 0, 10),  # past the frame
    ],
)
def test_garbage_and_truncated_frames_raise_a_protocol_error(payload: bytes) -> None:
    with pytest.raises(RemotingProtocolError):
        codec.decode_frame(payload)


@pytest.mark.parametrize("length", [-1, 0, 19, 17 * 1024 * 1024])
def test_frame_lengths_outside_the_limits_are_refused(length: int) -> None:
    with pytest.raises(RemotingProtocolError):
        codec.check_length(length)
    assert codec.check_length(20) == 20


def test_messages_of_a_send_round_trip_with_tags_and_attributes() -> None:
    attrs = codec.encode_attrs({"payload": "héllo", "qmq_createTime": "1"})
    messages = [
        QmqMessage("order.changed", "id-1", 1000, 2000, tags=("a", "b"), attrs=attrs),
        QmqMessage("s", "id-2", 3000, 4000, flag=codec.MESSAGE_FLAG_DELAY, attrs=b""),
    ]
    decoded = codec.decode_send_messages(codec.encode_send_messages(messages))
    assert decoded[0] == QmqMessage(
        "order.changed", "id-1", 1000, 2000, flag=codec.MESSAGE_FLAG_TAGS, tags=("a", "b"), attrs=attrs
    )
    assert decoded[0].attributes() == {"payload": "héllo", "qmq_createTime": "1"}
    assert decoded[1] == messages[1] and decoded[1].is_delay


def test_a_truncated_send_body_raises_a_protocol_error() -> None:
    body = codec.encode_send_messages([QmqMessage("s", "id", 1, 2, attrs=codec.encode_attrs({"k": "v"}))])
    for cut in (1, 9, len(body) - 1):
        with pytest.raises(RemotingProtocolError):
            codec.decode_send_messages(body[:cut])


def test_pulled_messages_carry_the_first_pull_sequence() -> None:
    messages = [QmqMessage("s", f"id-{i}", i, i, attrs=codec.encode_attrs({"i": str(i)})) for i in range(3)]
    first, decoded = codec.decode_pulled(codec.encode_pulled(17, messages))
    assert first == 17 and decoded == messages


def test_pull_requests_of_version_9_round_trip_with_tag_filters() -> None:
    request = PullRequest("s", "g", "c1", 32, -1, 5, 9, 1000, False, (TagFilter(codec.TAG_AND, ("x", "y")),))
    assert codec.decode_pull_request(codec.encode_pull_request(request), codec.VERSION_9) == request


def test_a_pull_request_of_version_8_carries_one_tag_filter() -> None:
    base = PullRequest("s", "g", "c1", 1, -1, -1, -1, 0, True)
    body = codec.encode_pull_request(base)[:-4]  # without the filter count of version 9
    no_tag = body + struct.pack(">hb", codec.TAG_NONE, 0)
    one_tag = body + struct.pack(">hb", codec.TAG_OR, 1) + codec.string_bytes("t")
    assert codec.decode_pull_request(no_tag, codec.VERSION_8).filters == ()
    assert codec.decode_pull_request(one_tag, codec.VERSION_8).filters == (TagFilter(codec.TAG_OR, ("t",)),)
    assert codec.decode_pull_request(body, 4) == base


def test_an_unknown_pull_filter_type_is_a_protocol_error() -> None:
    body = codec.encode_pull_request(PullRequest("s", "g", "c", 1, 0, 0, 0, 0, False))[:-4]
    with pytest.raises(RemotingProtocolError):
        codec.decode_pull_request(body + struct.pack(">ih", 1, 9), codec.VERSION_9)


def test_ack_requests_round_trip() -> None:
    request = AckRequest("s", "g", "c", 3, 8, 0)
    assert codec.decode_ack_request(codec.encode_ack_request(request)) == request
    with pytest.raises(RemotingProtocolError):
        codec.decode_ack_request(codec.encode_ack_request(request)[:10])


def test_send_results_and_string_maps_round_trip() -> None:
    results = [("a", codec.ProducerCode.SUCCESS, ""), ("b", codec.ProducerCode.STORE_ERROR, "disk")]
    assert codec.decode_send_results(codec.encode_send_results(results)) == results
    values = {"subject": "s", "clientTypeCode": "2"}
    assert codec.read_string_map(codec.write_string_map(values)) == values


def test_the_meta_response_is_laid_out_as_the_client_reads_it() -> None:
    body = codec.encode_meta_response(5, "s", "g", codec.ONLINE, 2, [BrokerGroup("b", "h:1", 6)])
    reader = Reader(body)
    assert reader.int64() == 5 and reader.string() == "s" and reader.string() == "g"
    assert (reader.int8(), reader.int8(), reader.int16()) == (codec.ONLINE, 2, 1)
    assert (reader.string(), reader.string(), reader.int64(), reader.int8()) == ("b", "h:1", 6, 1)
    assert reader.remaining() == 0


def test_a_string_that_is_not_utf8_is_a_protocol_error() -> None:
    with pytest.raises(RemotingProtocolError):
        Reader(b"\x00\x02\xff\xfe").string()
