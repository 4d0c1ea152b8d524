"""Pure protocol rules: names, ids, tag codes, filters, queue selection, delays."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest

import engine.protocol.messages as messages
from engine.errors import InvalidArgumentError, InvalidMessageError, InvalidTopicError
from engine.protocol import (
    RecordSizes,
    UniqKeyGenerator,
    is_system_topic,
    java_string_hashcode,
    make_msg_id,
    parse_msg_id,
    parse_tag_expression,
    record_size,
    select_queue_by_hash,
    tags_code,
    uniq_key_time_ms,
    validate_group_name,
    validate_message_fields,
    validate_topic_name,
)
from engine.protocol.delays import DELAY_LEVELS_MS, delay_due_ms, retry_delay_level, validate_delay_level


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("a", 97), ("TagA", 2598919), ("hello world", 1794106052), ("中文", 646394)],
)
def test_java_string_hashcode_matches_java(text: str, expected: int) -> None:
    assert java_string_hashcode(text) == expected


def test_java_string_hashcode_wraps_to_signed_int() -> None:
    assert java_string_hashcode("polygenelubricants") == -2147483648


def test_tags_code_of_no_tag_is_zero() -> None:
    assert tags_code(None) == 0
    assert tags_code("TagA") == java_string_hashcode("TagA")


@pytest.mark.parametrize(
    "name",
    ["T", "Topic_1-a", "%RETRY%g", "a|b", "x" * 127, "order.changed", "%RETRY%order.changed%billing.v2"],
)
def test_valid_topic_names(name: str) -> None:
    assert validate_topic_name(name) == name


@pytest.mark.parametrize("name", ["order.changed", "billing.team-1", "%RETRY%a.b"])
def test_group_names_may_hold_dots_as_qmq_groups_do(name: str) -> None:
    assert validate_group_name(name) == name


@pytest.mark.parametrize("name", ["a b", "a/b", "a:b", "x" * 256, ""])
def test_invalid_group_names_raise(name: str) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_group_name(name)


@pytest.mark.parametrize("name", ["", "a b", "topic/name", "topic:name", "x" * 128, "名字", None, 5])
def test_invalid_topic_names_raise(name: object) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


@pytest.mark.parametrize(
    "name",
    ["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_anything", "%RETRY%g", "%DLQ%g", "TBW102"],
)
def test_system_topics_are_recognised(name: str) -> None:
    assert is_system_topic(name)


def test_user_topic_is_not_system() -> None:
    assert not is_system_topic("orders")


def test_tag_expression_star_matches_everything() -> None:
    f = parse_tag_expression("*")
    assert f.matches_all and f.match_code(123) and f.match_tag(None)


def test_tag_expression_or_matches_listed_tags_only() -> None:
    f = parse_tag_expression("TagA || TagB")
    assert f.tags == {"TagA", "TagB"}
    assert f.match_code(java_string_hashcode("TagA")) and f.match_code(java_string_hashcode("TagB"))
    assert not f.match_code(java_string_hashcode("TagC"))
    assert f.match_tag("TagB") and not f.match_tag("TagC") and not f.match_tag(None)


@pytest.mark.parametrize("expr", ["TagA ||", "|| TagA", "A |||| B", 3])
def test_bad_tag_expression_raises(expr: object) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_tag_expression(expr)  # type: ignore[arg-type]


def test_msg_id_round_trip() -> None:
    msg_id = make_msg_id("0a0b0c0d0e0f1011", 123456)
    assert len(msg_id) == 32 and msg_id == msg_id.upper()
    assert parse_msg_id(msg_id) == ("0A0B0C0D0E0F1011", 123456)


@pytest.mark.parametrize("bad", ["", "XYZ", "G" * 32, None])
def test_parse_bad_msg_id_raises(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_msg_id(bad)  # type: ignore[arg-type]


def test_uniq_keys_are_unique_and_32_hex() -> None:
    gen = UniqKeyGenerator()
    keys = [gen.next() for _ in range(5000)]
    assert len(set(keys)) == 5000
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in keys)


def test_record_size_counts_body_topic_and_properties() -> None:
    base = record_size("T", 10, {})
    assert record_size("T", 11, {}) == base + 1
    assert record_size("TT", 10, {}) == base + 1
    assert record_size("T", 10, {"k": "v"}) == base + len("k\x01v\x02")


def test_record_sizes_of_one_pass_are_record_size_with_each_mapping_encoded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared, other = {"a": "1", "UNIQ": "x"}, {"a": "1", "UNIQ": "x"}
    cases = [("T", 10, shared), ("T", 999, shared), ("TT", 10, shared), ("T", 10, other), ("T", 5, {})]
    expected = [record_size(*c) for c in cases]
    encoded: list[object] = []
    real = messages.encode_properties

    def counted(properties: Mapping[str, str]) -> bytes:
        encoded.append(properties)
        return real(properties)

    monkeypatch.setattr(messages, "encode_properties", counted)
    sizes = RecordSizes()
    assert [sizes(*c) for c in cases] == expected
    assert len(encoded) == 3  # shared once per topic (T, TT), other once; {} encodes nothing


def test_sharding_key_hash_is_stable_and_in_range() -> None:
    assert select_queue_by_hash("order-42", 8) == select_queue_by_hash("order-42", 8)
    assert all(0 <= select_queue_by_hash(f"k{i}", 5) < 5 for i in range(200))
    assert len({select_queue_by_hash(f"k{i}", 4) for i in range(200)}) == 4


@pytest.mark.parametrize(
    ("key", "queues", "java_queue"),
    # Java: int v = key.hashCode() % n; if (v < 0) v = Math.abs(v);
    # "order-1".hashCode() = -1207111310, "polygenelubricants".hashCode() = Integer.MIN_VALUE.
    [
        ("order-1", 3, 2),
        ("order-2", 3, 1),
        ("order-42", 3, 0),
        ("polygenelubricants", 3, 2),
        ("order-1", 8, 6),
    ],
)
def test_sharding_key_queue_matches_java_select_message_queue_by_hash(
    key: str, queues: int, java_queue: int
) -> None:
    assert select_queue_by_hash(key, queues) == java_queue


def test_validate_message_fields_accepts_a_good_message() -> None:
    validate_message_fields("T", b"x", "TagA", ("k1", "k2"), {"a": "b"})


@pytest.mark.parametrize(
    ("body", "tags", "keys", "props"),
    [
        (b"", None, (), {}),
        (b"x" * (4 * 1024 * 1024 + 1), None, (), {}),
        ("text", None, (), {}),
        (b"x", "A||B", (), {}),
        (b"x", "", (), {}),
        (b"x", None, "k1", {}),
        (b"x", None, ("has space",), {}),
        (b"x", None, (), {"a": 1}),
        (b"x", None, (), {1: "a"}),
        (b"x", None, (), {"a\x01": "b"}),
    ],
)
def test_validate_message_fields_rejects_bad_input(
    body: object, tags: object, keys: object, props: object
) -> None:
    with pytest.raises(InvalidMessageError):
        validate_message_fields("T", body, tags, keys, props)


def test_delay_levels_are_rocketmq_defaults() -> None:
    assert len(DELAY_LEVELS_MS) == 18
    assert DELAY_LEVELS_MS[0] == 1000 and DELAY_LEVELS_MS[3] == 30_000 and DELAY_LEVELS_MS[-1] == 7_200_000


@pytest.mark.parametrize("level", list(range(1, 19)))
def test_each_delay_level_due_time(level: int) -> None:
    expected = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]
    assert delay_due_ms(level, 1_000_000) == 1_000_000 + expected[level - 1] * 1000


@pytest.mark.parametrize("level", [-1, 19, True, "3", 2.0])
def test_bad_delay_level_raises(level: object) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_delay_level(level)


def test_retry_delay_level_is_three_plus_reconsume_times_capped() -> None:
    assert retry_delay_level(0) == 3
    assert retry_delay_level(5) == 8
    assert retry_delay_level(40) == 18


def test_uniq_key_time_field_decodes_to_when_it_was_made() -> None:
    before = int(time.time() * 1000)
    key = UniqKeyGenerator().next()
    after = int(time.time() * 1000)
    assert before <= uniq_key_time_ms(key, now_ms=after) <= after


def test_uniq_key_time_decodes_into_the_previous_month_when_the_span_is_ahead_of_now() -> None:
    # 2026-03-01T00:00:00Z; a span of 2 days decoded on 2026-03-01T01:00Z belongs to February.
    march = 1772323200000
    key = "7F000001" + "0001" + "00000000" + f"{2 * 86_400_000:08X}" + "0001"
    assert uniq_key_time_ms(key, now_ms=march + 3_600_000) == 1769904000000 + 2 * 86_400_000
    assert uniq_key_time_ms(key, now_ms=march + 3 * 86_400_000) == march + 2 * 86_400_000


@pytest.mark.parametrize("bad", ["", "XYZ", "G" * 32, 7])
def test_uniq_key_time_of_a_malformed_id_raises(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        uniq_key_time_ms(bad)  # type: ignore[arg-type]


def test_timer_properties_are_reserved_unless_the_writer_takes_timer_requests() -> None:
    props = {"TIMER_DELAY_SEC": "5"}
    with pytest.raises(InvalidMessageError, match="reserved"):
        validate_message_fields("T", b"x", None, (), props)  # e.g. the mq sink: no timers there
    validate_message_fields("T", b"x", None, (), props, allowed=frozenset(props))
