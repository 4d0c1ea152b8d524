"""The binary layouts RocketMQ clients read and write: stored messages, batches, properties, ids."""

from __future__ import annotations

import struct

import pytest

from engine.errors import RemotingProtocolError
from engine.remoting.message_layout import (
    MESSAGE_MAGIC_CODE,
    BatchItem,
    BatchRecord,
    WireMessage,
    body_crc,
    decode_batch_records,
    decode_properties,
    decode_stored,
    encode_batch,
    encode_properties,
    encode_stored,
    offset_msg_id,
    offset_msg_ids,
    parse_offset_msg_id,
    split_property,
)


def _message(**changes: object) -> WireMessage:
    fields: dict[str, object] = {
        "topic": "Orders",
        "queue_id": 3,
        "queue_offset": 17,
        "physical_offset": 0x1234,
        "body": b"hello",
        "properties": {"TAGS": "A", "UNIQ_KEY": "U1"},
        "flag": 9,
        "sys_flag": 8,
        "born_ts_ms": 1_700_000_000_000,
        "born_host": ("10.0.0.2", 5555),
        "store_ts_ms": 1_700_000_000_123,
        "store_host": ("127.0.0.1", 10911),
        "reconsume_times": 2,
        "prepared_transaction_offset": 77,
    }
    fields.update(changes)
    return WireMessage(**fields)  # type: ignore[arg-type]


def test_stored_layout_puts_each_field_at_messagedecoders_offset() -> None:
    data = encode_stored(_message())
    props = b"TAGS\x01A\x02UNIQ_KEY\x01U1\x02"
    assert struct.unpack_from(">i", data, 0)[0] == len(data) == 88 + 5 + 1 + 6 + 2 + len(props)
    assert struct.unpack_from(">i", data, 4)[0] == MESSAGE_MAGIC_CODE
    assert struct.unpack_from(">i", data, 8)[0] == 907060870  # crc32("hello") & 0x7fffffff
    assert struct.unpack_from(">i", data, 12)[0] == 3  # QUEUEID
    assert struct.unpack_from(">i", data, 16)[0] == 9  # FLAG
    assert struct.unpack_from(">q", data, 20)[0] == 17  # QUEUEOFFSET (MessageDecoder.QUEUE_OFFSET_POSITION)
    assert struct.unpack_from(">q", data, 28)[0] == 0x1234  # PHYSICALOFFSET (PHY_POS_POSITION)
    assert struct.unpack_from(">i", data, 36)[0] == 8  # SYSFLAG (SYSFLAG_POSITION), IPv4 bits clear
    assert struct.unpack_from(">q", data, 40)[0] == 1_700_000_000_000  # BORNTIMESTAMP
    assert data[48:52] == bytes([10, 0, 0, 2]) and struct.unpack_from(">i", data, 52)[0] == 5555  # BORNHOST
    assert struct.unpack_from(">q", data, 56)[0] == 1_700_000_000_123  # STORETIMESTAMP
    assert data[64:68] == bytes([127, 0, 0, 1]) and struct.unpack_from(">i", data, 68)[0] == 10911
    assert struct.unpack_from(">i", data, 72)[0] == 2  # RECONSUMETIMES
    assert struct.unpack_from(">q", data, 76)[0] == 77  # PREPARED TRANSACTION OFFSET
    assert struct.unpack_from(">i", data, 84)[0] == 5 and data[88:93] == b"hello"  # BODY
    assert data[93] == 6 and data[94:100] == b"Orders"  # TOPIC (byte length)
    assert struct.unpack_from(">h", data, 100)[0] == len(props) and data[102:] == props


def test_stored_records_round_trip_back_to_back() -> None:
    first, second = _message(), _message(topic="B", body=b"", properties={}, queue_offset=18)
    assert decode_stored(encode_stored(first) + encode_stored(second)) == [first, second]


def test_msg_id_is_store_host_and_physical_offset() -> None:
    assert _message().msg_id == "7F00000100002A9F0000000000001234"
    assert offset_msg_id("127.0.0.1", 20911, 0x73) == "7F000001000051AF0000000000000073"
    assert parse_offset_msg_id("7F000001000051AF0000000000000073") == ("127.0.0.1", 20911, 0x73)
    offsets = [0, 0x73, 2**40 + 5, 2**63 - 1]  # a batch's ids: each as offset_msg_id makes it
    assert offset_msg_ids("10.1.2.3", 10911, offsets) == [
        offset_msg_id("10.1.2.3", 10911, p) for p in offsets
    ]


@pytest.mark.parametrize("bad", ["", "XYZ", "7F000001000051AF00000000000000", "zz" * 16])
def test_malformed_offset_msg_id_is_refused(bad: str) -> None:
    with pytest.raises(RemotingProtocolError, match="32 hex"):
        parse_offset_msg_id(bad)


def test_properties_are_name_sep1_value_sep2_pairs() -> None:
    assert encode_properties({"a": "1", "KEYS": "k1 k2"}) == "a\x011\x02KEYS\x01k1 k2\x02"
    assert decode_properties("a\x011\x02KEYS\x01k1 k2\x02") == {"a": "1", "KEYS": "k1 k2"}
    assert decode_properties("broken\x02b\x01\x02") == {"b": ""}


@pytest.mark.parametrize(
    "text",
    [
        "UNIQ_KEY\x01A1\x02TAGS\x01t\x02",  # first
        "TAGS\x01t\x02UNIQ_KEY\x01A1\x02WAIT\x01true\x02",  # between
        "TAGS\x01t\x02UNIQ_KEY\x01A1",  # last, without its separator
        "TAGS\x01t\x02UNIQ_KEY\x01\x02",  # empty
        "TAGS\x01t\x02",  # absent
        "XUNIQ_KEY\x01no\x02a\x01UNIQ_KEY\x01in a value\x02",  # only as part of another name or value
        "broken\x02UNIQ_KEY\x01A1\x02b\x01\x02",  # beside pairs decoding skips
    ],
)
def test_a_property_split_off_undecoded_is_what_decoding_finds(text: str) -> None:
    split = split_property(text, "UNIQ_KEY")
    assert split is not None
    value, rest = split
    decoded = decode_properties(text)
    assert value == decoded.pop("UNIQ_KEY", None)
    assert decode_properties(rest) == decoded


def test_a_property_there_twice_is_left_to_decoding() -> None:
    assert split_property("UNIQ_KEY\x01A\x02TAGS\x01t\x02UNIQ_KEY\x01B\x02", "UNIQ_KEY") is None


def test_batch_records_keep_the_properties_encoded() -> None:
    items = [BatchItem(b"one", {"TAGS": "t", "UNIQ_KEY": "U1"}, 3), BatchItem(b"two")]
    records = decode_batch_records(encode_batch(items))
    assert records == [
        BatchRecord(b"one", "TAGS\x01t\x02UNIQ_KEY\x01U1\x02", 3),
        BatchRecord(b"two", "", 0),
    ]


def test_body_crc_clears_the_sign_bit() -> None:
    assert body_crc(b"hello") == 907060870
    assert all(0 <= body_crc(bytes([i]) * 7) <= 0x7FFFFFFF for i in range(256))


def test_oversized_properties_do_not_fit_the_wire_layout() -> None:
    with pytest.raises(RemotingProtocolError, match="too long"):
        encode_stored(_message(properties={"p": "x" * 40_000}))


def test_truncated_or_corrupt_stored_record_is_refused() -> None:
    data = encode_stored(_message())
    with pytest.raises(RemotingProtocolError):
        decode_stored(data[:-1])
    with pytest.raises(RemotingProtocolError, match="bad stored record"):
        decode_stored(data[:4] + b"\x00\x00\x00\x00" + data[8:])


def test_batch_body_as_encode_messages_lays_it_out() -> None:
    props = b"TAGS\x01A\x02"
    by_hand = (
        struct.pack(">iiiii", 20 + 2 + 2 + len(props), 0, 0, 0, 2)
        + b"m1"
        + struct.pack(">h", len(props))
        + props
    )
    by_hand += struct.pack(">iiiii", 20 + 3 + 2, 0, 0, 4, 3) + b"two" + struct.pack(">h", 0)
    items = [BatchItem(b"m1", {"TAGS": "A"}), BatchItem(b"two", {}, flag=4)]
    assert encode_batch(items) == by_hand
    assert decode_batch_records(by_hand) == [BatchRecord(b"m1", "TAGS\x01A\x02"), BatchRecord(b"two", "", 4)]


@pytest.mark.parametrize("cut", [1, 5, 21, 25])
def test_truncated_batch_is_refused(cut: int) -> None:
    data = encode_batch([BatchItem(b"hello", {"a": "b"})])
    with pytest.raises(RemotingProtocolError):
        decode_batch_records(data[:-cut])


def test_batch_record_with_wrong_size_is_refused() -> None:
    data = bytearray(encode_batch([BatchItem(b"hello")]))
    data[3] += 1
    with pytest.raises(RemotingProtocolError, match="inconsistent size"):
        decode_batch_records(bytes(data))
