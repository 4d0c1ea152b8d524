"""A client's SEND_BATCH_MESSAGE prepared shape by shape (WireProducer.prepare_client_batch): the
same rows as splitting and preparing each message on its own, checked the same way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import Admin, Store
from engine.errors import InvalidMessageError
from engine.protocol.messages import MAX_BODY_BYTES
from engine.remoting.message_layout import BatchRecord, decode_properties, encode_properties
from engine.remoting.wire_messages import incoming
from engine.remoting.wire_producer import WireProducer
from engine.store.commit_log.stamping import PendingBatch, PendingMessage

HOST = ("10.1.2.3", 40000)
BORN = 1_700_000_000_000


@pytest.fixture
def wire(store: Store) -> Iterator[WireProducer]:
    Admin(store).create_topic("B", 2)
    producer = WireProducer(store)
    yield producer
    producer.close()


def _record(body: bytes, properties: dict[str, str], flag: int = 0) -> BatchRecord:
    return BatchRecord(body, encode_properties(properties), flag)


def _items() -> list[BatchRecord]:
    """Java's batches share all but the body and UNIQ_KEY; these mix shapes as a client may."""
    out = []
    for i in range(12):
        props = {"TAGS": "even" if i % 2 == 0 else "odd", "WAIT": "true", "UNIQ_KEY": f"ID{i:04d}"}
        if i % 3 == 0:
            props["KEYS"] = "k1 k2"
        if i == 5:
            props["color"] = "red"  # a user property of one message
        if i == 7:
            del props["UNIQ_KEY"]  # a client that sent none: the producer gives one
        if i == 11:  # twice (a hand-made client): the last one holds, as decoding says
            out.append(BatchRecord(b"twice", encode_properties(props) + "UNIQ_KEY\x01LAST\x02"))
            continue
        out.append(_record(f"body-{i}".encode() * (i + 1), props, 4 if i == 9 else 0))
    return out


def _one_by_one(wire: WireProducer, items: list[BatchRecord]) -> list[PendingMessage]:
    split = [
        incoming("B", i.body, decode_properties(i.properties), born_host=HOST, flag=i.flag, born_ts_ms=BORN)
        for i in items
    ]
    return [p.pending for p in wire.prepare_wire_batch(split, 1)]


def test_a_batch_prepared_by_shape_holds_the_rows_of_one_prepared_message_by_message(
    wire: WireProducer,
) -> None:
    items = _items()
    ours = [p.pending for p in wire.prepare_client_batch("B", 1, items, born_host=HOST, born_ts_ms=BORN)]
    theirs = _one_by_one(wire, items)
    assert len(ours) == len(theirs) == 12
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if i == 7:  # generated ids differ from run to run; the rest of the row does not
            assert a.uniq_key and a.uniq_key != b.uniq_key
            a, b = a._replace(uniq_key=""), b._replace(uniq_key="")
        assert a == b, i
    assert (
        ours[0].uniq_key == "ID0000" and ours[9].properties["__FLAG"] == "4" and ours[11].uniq_key == "LAST"
    )
    assert ours[5].properties["color"] == "red" and "color" not in ours[3].properties
    # and the commit stores them with the same record sizes (physical offsets)
    stored = PendingBatch.of(ours).columns.to_pylist()
    for a, b in zip(stored, PendingBatch.of(theirs).columns.to_pylist(), strict=True):
        assert a["size"] == b["size"] and a["properties"] == b["properties"]


def test_messages_without_a_unique_id_each_get_their_own(wire: WireProducer) -> None:
    items = [_record(b"x", {"TAGS": "t"}) for _ in range(50)]
    ids = [p.pending.uniq_key for p in wire.prepare_client_batch("B", 0, items)]
    assert len(set(ids)) == 50 and all(ids)


def test_a_batch_over_max_batch_bytes_is_refused_though_each_shape_alone_fits(store: Store) -> None:
    Admin(store).create_topic("B", 2)
    small = WireProducer(Store.open(store.root, config=store.config.replace(max_batch_bytes=1_000)))
    try:
        fits = [_record(b"y" * 95, {"TAGS": "t", "UNIQ_KEY": f"U{i}"}) for i in range(9)]
        assert len(small.prepare_client_batch("B", 0, fits)) == 9  # 9 x (95 + 7 for TAGS) = 918 bytes
        with pytest.raises(InvalidMessageError, match="batch takes 1020 bytes"):
            small.prepare_client_batch("B", 0, [*fits, _record(b"y" * 95, {"TAGS": "t", "UNIQ_KEY": "U9"})])
    finally:
        small.close()


@pytest.mark.parametrize(
    ("props", "error"),
    [
        ({"DELAY": "3"}, "cannot hold delayed"),
        ({"DELAY": "soon"}, "not an integer"),
        ({"TAGS": "a||b"}, "\\|\\|"),
    ],
)
def test_a_bad_message_of_a_shape_refuses_the_whole_batch(
    wire: WireProducer, props: dict, error: str
) -> None:
    items = [_record(b"ok", {"TAGS": "t", "UNIQ_KEY": f"U{i}"}) for i in range(4)]
    items.insert(2, _record(b"bad", {**props, "UNIQ_KEY": "UB"}))
    with pytest.raises(InvalidMessageError, match=error):
        wire.prepare_client_batch("B", 0, items)


@pytest.mark.parametrize(("body", "error"), [(b"", "is empty"), (b"z" * (MAX_BODY_BYTES + 1), "at most")])
def test_a_bad_body_in_a_copy_of_a_shape_refuses_the_batch(
    wire: WireProducer, body: bytes, error: str
) -> None:
    items = [_record(b"ok", {"TAGS": "t", "UNIQ_KEY": f"U{i}"}) for i in range(3)]
    items.append(_record(body, {"TAGS": "t", "UNIQ_KEY": "U9"}))  # the shape was checked on the first
    with pytest.raises(InvalidMessageError, match=error):
        wire.prepare_client_batch("B", 0, items)


def test_an_empty_batch_is_refused(wire: WireProducer) -> None:
    with pytest.raises(InvalidMessageError, match="at least one message"):
        wire.prepare_client_batch("B", 0, [])
