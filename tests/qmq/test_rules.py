"""QMQ's pure client-visible rules: retry and dead-letter subjects, tag filters (OR, AND)."""

from __future__ import annotations

import pytest

from engine.protocol.qmq import TAG_AND, TAG_OR, qmq_dead_subject, qmq_retry_subject, qmq_tags_match


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
