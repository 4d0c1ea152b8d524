"""Pure protocol rules shared by clients and the broker: permissions, topic settings, the schedule
envelope, the retry policy and transaction records. No disk, no JVM."""

from __future__ import annotations

import pytest

from engine.errors import InvalidArgumentError, StoreError
from engine.model import PullStatus, SysFlag, TopicConfig
from engine.protocol.actions import ACTIONS, EXPIRED, NACK, ROUTED_ACTIONS
from engine.protocol.delays import (
    DELAY_LEVELS_MS,
    is_dead_letter,
    max_reconsume_times,
    validate_max_reconsume,
)
from engine.protocol.names import (
    PROPERTY_DELAY,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    retry_topic,
)
from engine.protocol.permissions import DEFAULT_PERM, Perm, is_readable, is_writeable
from engine.protocol.pull import pull_status
from engine.protocol.schedule import (
    SCHEDULE_PROPERTIES,
    SCHEDULE_QUEUES,
    TIMER_QUEUE_ID,
    real_destination,
    schedule_envelope,
    schedule_queue_id,
    without_schedule_properties,
)
from engine.protocol.topics import system_topic_config, system_topic_queues, validate_topic_settings
from engine.protocol.transactions import (
    EVENT_COMMIT,
    GUARD_TRUSTED_MS,
    PROPERTY_HALF_OFFSET,
    PROPERTY_PRODUCER_GROUP,
    HalfMessage,
    LocalTransactionState,
    committed_properties,
    decides,
    guard_may_have_expired,
    half_properties,
    local_state,
    rollback_properties,
    transaction_record,
)
from engine.store.commit_markers import transaction_app


# ----------------------------------------------------------------- permissions and topics
def test_perm_flags_are_rocketmq_permname_values() -> None:
    assert (int(Perm.INHERIT), int(Perm.WRITE), int(Perm.READ)) == (1, 2, 4)
    assert DEFAULT_PERM == 6 and type(DEFAULT_PERM) is int


@pytest.mark.parametrize(
    ("perm", "readable", "writeable"), [(2, False, True), (4, True, False), (6, True, True)]
)
def test_perm_reads_as_bit_flags(perm: int, readable: bool, writeable: bool) -> None:
    assert is_readable(perm) is readable
    assert is_writeable(perm) is writeable


@pytest.mark.parametrize("perm", [2, 4, 6, Perm.READ | Perm.WRITE])
def test_topic_settings_accept_write_read_or_both(perm: int) -> None:
    validate_topic_settings("t", 4, "NORMAL", perm)


@pytest.mark.parametrize(
    ("queues", "type_", "perm"),
    [
        (0, "NORMAL", 6),
        (1025, "NORMAL", 6),
        (True, "NORMAL", 6),
        (4, "BIG", 6),
        (4, "NORMAL", 1),
        (4, "NORMAL", [6]),
    ],
)
def test_topic_settings_refuse_what_rocketmq_refuses(queues: object, type_: object, perm: object) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_topic_settings("t", queues, type_, perm)


def test_system_topics_get_one_queue_but_the_schedule_topic_one_per_level_and_timer() -> None:
    assert system_topic_queues(SCHEDULE_TOPIC) == SCHEDULE_QUEUES == 19
    assert system_topic_queues(retry_topic("g")) == 1
    assert system_topic_config("%DLQ%g", 5) == TopicConfig("%DLQ%g", 1, 6, "NORMAL", 5)


# ----------------------------------------------------------------- the schedule envelope
def test_a_delay_level_waits_in_its_level_queue_with_the_real_destination() -> None:
    env = schedule_envelope("T", 3, {"a": "1"}, sent_ms=1_000, delay_level=3)
    assert env.topic == SCHEDULE_TOPIC
    assert env.queue_id == 2
    assert env.delay_level == 3
    assert env.deliver_at_ms == env.tags_code == 1_000 + DELAY_LEVELS_MS[2]
    assert env.properties == {
        "a": "1",
        PROPERTY_DELAY: "3",
        PROPERTY_REAL_TOPIC: "T",
        PROPERTY_REAL_QUEUE_ID: "3",
    }


def test_a_timer_waits_in_the_timer_queue_until_its_time() -> None:
    env = schedule_envelope("T", 0, {}, sent_ms=1_000, deliver_at_ms=5_000)
    assert (env.queue_id, env.delay_level, env.deliver_at_ms, env.tags_code) == (
        TIMER_QUEUE_ID,
        0,
        5_000,
        5_000,
    )
    assert env.properties[PROPERTY_TIMER_DELIVER_MS] == "5000"
    assert PROPERTY_DELAY not in env.properties


def test_a_delay_level_wins_over_a_timer_and_the_input_is_not_changed() -> None:
    props = {"a": "1"}
    env = schedule_envelope("T", 0, props, sent_ms=0, delay_level=1, deliver_at_ms=99)
    assert env.queue_id == 0 and env.deliver_at_ms == DELAY_LEVELS_MS[0]
    assert props == {"a": "1"}


@pytest.mark.parametrize("level", [-1, 19, True])
def test_an_envelope_needs_a_valid_level_or_a_timer(level: int) -> None:
    with pytest.raises(InvalidArgumentError):
        schedule_envelope("T", 0, {}, sent_ms=0, delay_level=level)
    with pytest.raises(InvalidArgumentError):
        schedule_envelope("T", 0, {}, sent_ms=0)


def test_schedule_queue_ids() -> None:
    assert [schedule_queue_id(level) for level in (0, 1, 18)] == [TIMER_QUEUE_ID, 0, 17]


def test_unwrapping_an_envelope_gives_back_destination_and_properties() -> None:
    env = schedule_envelope("T", 2, {"a": "1"}, sent_ms=0, delay_level=4)
    # A delay-level message keeps REAL_TOPIC / REAL_QID in its real topic, as RocketMQ's schedule does.
    assert real_destination(env.properties) == (
        "T",
        2,
        {"a": "1", PROPERTY_REAL_TOPIC: "T", PROPERTY_REAL_QUEUE_ID: "2"},
    )
    assert without_schedule_properties(env.properties) == {"a": "1"}
    timer = schedule_envelope("T", 2, {"a": "1", "TIMER_DELAY_SEC": "9"}, sent_ms=0, deliver_at_ms=5)
    assert real_destination(timer.properties) == ("T", 2, {"a": "1"})  # a timer keeps none of them
    assert SCHEDULE_PROPERTIES.isdisjoint(real_destination(timer.properties).properties)  # type: ignore[union-attr]


def test_unwrapping_folds_a_vanished_queue_and_refuses_a_missing_topic() -> None:
    assert real_destination({PROPERTY_REAL_TOPIC: "T", PROPERTY_REAL_QUEUE_ID: "9"}, 4) == ("T", 1, {})
    assert real_destination({PROPERTY_REAL_TOPIC: "T", PROPERTY_REAL_QUEUE_ID: "x"}) == ("T", 0, {})
    assert real_destination({PROPERTY_REAL_TOPIC: "T", PROPERTY_REAL_QUEUE_ID: "-1"}) is None
    assert real_destination({PROPERTY_REAL_QUEUE_ID: "0"}) is None


# ----------------------------------------------------------------- retry policy and actions
def test_the_message_limit_wins_then_the_group_then_the_setting_then_the_default() -> None:
    assert max_reconsume_times({PROPERTY_MAX_RECONSUME_TIMES: "2"}, "g", 5, 16) == 2
    assert max_reconsume_times({}, "g", {"g": 3}, 16) == 3
    assert max_reconsume_times({}, "h", {"g": 3}, 16) == 16
    assert max_reconsume_times({}, "g", 5, 16) == 5


def test_a_message_is_dead_once_its_next_attempt_exceeds_the_limit() -> None:
    assert not is_dead_letter(15, 16)
    assert is_dead_letter(16, 16)
    assert is_dead_letter(0, 0)


@pytest.mark.parametrize("setting", [-2, True, "3", {"g": -2}, {1: 2}])
def test_bad_reconsume_settings_are_refused(setting: object) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_max_reconsume(setting)  # type: ignore[arg-type]


def test_good_reconsume_settings_pass() -> None:
    assert validate_max_reconsume(None) is None
    assert validate_max_reconsume(3) == 3
    assert validate_max_reconsume({"g": 0}) == {"g": 0}
    assert validate_max_reconsume(-1) == -1


def test_a_reconsume_setting_of_minus_one_means_the_default_as_in_rocketmq() -> None:
    assert max_reconsume_times({}, "g", -1, 16) == 16
    assert max_reconsume_times({}, "g", {"g": -1}, 16) == 16


def test_retry_routes_nacks_and_expired_leases() -> None:
    assert {NACK, EXPIRED} == ROUTED_ACTIONS
    assert EXPIRED not in ACTIONS  # not an action a consumer records through the writer


# ----------------------------------------------------------------- transaction records
def _half(**overrides: object) -> HalfMessage:
    props = half_properties({"u": "1"}, "T", 2, "pg")
    row = {
        "topic": TRANS_HALF_TOPIC,
        "physical_offset": 100,
        "msg_id": "M",
        "uniq_key": "U",
        "body": b"x",
        "tags": "t",
        "keys": ["k"],
        "properties": list(props.items()),
        "born_ts_ms": 1,
        "store_ts_ms": 2,
        **overrides,
    }
    return HalfMessage.from_row(row)


def test_a_half_names_its_real_destination_and_group() -> None:
    half = _half()
    assert (half.topic, half.queue_id, half.producer_group) == ("T", 2, "pg")
    assert half.properties[PROPERTY_TRANSACTION_PREPARED] == "true"
    view = half.view_row()
    assert (view["topic"], view["queue_offset"], view["sys_flag"]) == ("T", -1, int(SysFlag.PREPARED))


def test_a_row_of_another_topic_is_not_a_half() -> None:
    with pytest.raises(StoreError):
        _half(topic="T")


def test_decision_records_name_their_half() -> None:
    half = _half()
    committed = committed_properties(half)
    assert committed == {"u": "1", PROPERTY_PRODUCER_GROUP: "pg", PROPERTY_HALF_OFFSET: "100"}
    assert rollback_properties(half) == {PROPERTY_HALF_OFFSET: "100", PROPERTY_PRODUCER_GROUP: "pg"}
    assert decides(committed, 100)
    assert not decides(committed, 101)


def test_a_transactions_row_describes_the_half_and_where_it_went() -> None:
    row = transaction_record(
        _half(), EVENT_COMMIT, ts_ms=7, reason="LOCAL", physical_offset=5, queue_offset=0
    )
    assert row["half_physical_offset"] == 100
    assert (row["topic"], row["queue_id"], row["event"], row["ts_ms"]) == ("T", 2, EVENT_COMMIT, 7)
    assert (row["physical_offset"], row["queue_offset"], row["check_times"]) == (5, 0, 0)


def test_app_ids_and_guard_expiry() -> None:
    assert transaction_app(42) == "mq.tx.42"
    assert not guard_may_have_expired(0, GUARD_TRUSTED_MS)
    assert guard_may_have_expired(0, GUARD_TRUSTED_MS + 1)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (LocalTransactionState.COMMIT, LocalTransactionState.COMMIT),
        ("ROLLBACK", LocalTransactionState.ROLLBACK),
        ("commit", None),
        (None, None),
        (1, None),
    ],
)
def test_local_state_reads_the_enum_or_its_name(
    value: object, expected: LocalTransactionState | None
) -> None:
    assert local_state(value) is expected


# ----------------------------------------------------------------- pull offset checks
@pytest.mark.parametrize(
    ("offset", "bounds", "expected"),
    [
        (0, (0, 0), (PullStatus.NO_NEW_MSG, 0)),
        (3, (0, 0), (PullStatus.OFFSET_ILLEGAL, 0)),
        (1, (2, 5), (PullStatus.OFFSET_ILLEGAL, 2)),
        (5, (2, 5), (PullStatus.NO_NEW_MSG, 5)),
        (9, (2, 5), (PullStatus.OFFSET_ILLEGAL, 5)),
        (3, (2, 5), (None, 3)),
    ],
)
def test_pull_status_corrects_offsets_as_rocketmq_does(
    offset: int, bounds: tuple[int, int], expected: tuple[PullStatus | None, int]
) -> None:
    assert pull_status(offset, *bounds) == expected


def test_nack_plan_follows_send_message_back() -> None:
    from engine.protocol.delays import DELAY_LEVELS_MS, nack_plan

    # 0: the retry job chooses the delay; the count is the message's own.
    assert nack_plan(2, 16, 0, 16, 1_000) == (2, None)
    # A level: retry after it (a level past the last is the last).
    assert nack_plan(0, 16, 3, 16, 1_000) == (0, 1_000 + DELAY_LEVELS_MS[2])
    assert nack_plan(0, 16, 99, 16, 1_000) == (0, 1_000 + DELAY_LEVELS_MS[-1])
    # -1, or a count at the consumer's max: carried up to the job's limit, so the job dead-letters it.
    assert nack_plan(0, 16, -1, 16, 1_000) == (16, None)
    assert nack_plan(3, 3, 0, 16, 1_000) == (16, None)
    assert nack_plan(20, 16, 0, 16, 1_000) == (20, None)


def test_uniq_key_time_reads_a_java_id_made_on_an_ipv6_host() -> None:
    import datetime

    from engine.protocol.message_ids import uniq_key_time_ms

    month = int(datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC).timestamp() * 1000)
    span = 123_456
    ipv6_id = "FD" + "00" * 15 + "1234" + "ABCDEF01" + f"{span:08X}" + "0007"  # 16+2+4+4+2 bytes
    ipv4_id = "7F000001" + "1234" + "ABCDEF01" + f"{span:08X}" + "0007"
    assert len(ipv6_id) == 56 and len(ipv4_id) == 32
    assert uniq_key_time_ms(ipv6_id, now_ms=month + 10_000_000) == month + span
    assert uniq_key_time_ms(ipv4_id, now_ms=month + 10_000_000) == month + span
