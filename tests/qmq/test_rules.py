"""QMQ's pure client-visible rules: retry and dead-letter subjects, tag filters (OR, AND)."""

from __future__ import annotations

import pytest

from engine.protocol.names import validate_group_name
from engine.protocol.qmq import (
    TAG_AND,
    TAG_OR,
    qmq_dead_subject,
    qmq_delayed_retry_subject,
    qmq_retry_due_ms,
    qmq_retry_subject,
    qmq_store_group,
    qmq_store_subject,
    qmq_tags_match,
)


def test_retry_and_dead_subjects_are_named_as_qmq_names_them() -> None:
    assert qmq_retry_subject("order.changed", "billing") == "%RETRY%order.changed%billing"
    assert qmq_dead_subject("order.changed", "billing") == "%DEAD_RETRY%order.changed%billing"


@pytest.mark.parametrize(
    ("kind", "wanted", "tags", "passes"),
    [
        (TAG_OR, {"a", "b"}, {"b"}, True),
        (TAG_OR, {"a", "b"}, {"c"}, False),
        (TAG_OR, {"a"}, set(), False),
        (TAG_AND, {"a", "b"}, {"a", "b", "c"}, True),
        (TAG_AND, {"a", "b"}, {"a"}, False),
        (TAG_AND, set(), set(), True),
        (0, {"a"}, set(), True),  # NO_TAG: every message
    ],
)
def test_tag_filters_keep_what_or_and_and_ask_for(
    kind: int, wanted: set[str], tags: set[str], passes: bool
) -> None:
    assert qmq_tags_match(kind, wanted, tags) is passes


@pytest.mark.parametrize(
    ("subject", "delayed", "group", "goes_to"),
    [
        ("orders", True, "g1", "%RETRY%orders%g1"),  # a listener's NeedRetryException(next)
        ("orders", True, None, None),  # a producer's delayed message
        ("orders", True, "", None),
        ("orders", False, "g1", None),  # not delayed: stored where it was sent
        ("%RETRY%orders%g1", True, "g1", None),
        ("%DEAD_RETRY%orders%g1", True, "g1", None),
    ],
)
def test_a_delayed_message_carrying_its_group_is_that_groups_delayed_retry(
    subject: str, delayed: bool, group: str | None, goes_to: str | None
) -> None:
    assert qmq_delayed_retry_subject(subject, delayed, group) == goes_to


def test_a_nack_is_due_the_retry_delay_after_it_was_stored_anything_else_at_once() -> None:
    assert qmq_retry_due_ms("%RETRY%orders%g1", 1_000, 5_000) == 6_000
    assert qmq_retry_due_ms("%RETRY%orders%g1", 1_000, 0) is None
    assert qmq_retry_due_ms("orders", 1_000, 5_000) is None
    assert qmq_retry_due_ms("%DEAD_RETRY%orders%g1", 1_000, 5_000) is None


def test_a_group_the_store_can_name_is_its_own_store_group() -> None:
    assert qmq_store_group("billing.v2") == "billing.v2"
    assert qmq_store_group("") == ""


def test_a_broadcast_consumers_client_id_gets_a_storable_group_of_its_own() -> None:
    one, other = qmq_store_group("host-1@@0a1b"), qmq_store_group("host-1@@0a1c")
    assert one.startswith("host-1__0a1b-") and other.startswith("host-1__0a1c-")
    assert qmq_store_group("host-1__0a1b") != one  # the CRC keeps a replaced name apart
    assert qmq_store_group("a@b") != qmq_store_group("a:b")
    long_id = "h" * 300 + "@@x"
    for group in (one, other, qmq_store_group(long_id)):
        assert validate_group_name(group) == group
    assert qmq_store_group("host-1@@0a1b") == one  # the same every time


def test_a_retry_subjects_group_part_is_stored_under_its_store_group_name() -> None:
    group = qmq_store_group("box@@a1")
    assert qmq_store_subject("%RETRY%order.changed%box@@a1") == f"%RETRY%order.changed%{group}"
    assert qmq_store_subject("%DEAD_RETRY%orders%box@@a1") == f"%DEAD_RETRY%orders%{group}"
    for subject in ("%RETRY%orders%billing", "orders", "a@b", "%RETRY%nogroup"):
        assert qmq_store_subject(subject) == subject
