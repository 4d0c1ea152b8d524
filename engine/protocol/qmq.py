"""QMQ's client-visible rules that are pure: subjects of retries and dead letters, tag filters."""

from __future__ import annotations

from collections.abc import Collection

QMQ_RETRY_PREFIX = "%RETRY%"
QMQ_DEAD_PREFIX = "%DEAD_RETRY%"
TAG_OR = 1  # QMQ's TagType codes
TAG_AND = 2


def qmq_retry_subject(subject: str, group: str) -> str:
    """``RetrySubjectUtils.buildRetrySubject``: ``%RETRY%<subject>%<group>``."""
    return f"{QMQ_RETRY_PREFIX}{subject}%{group}"


def qmq_dead_subject(subject: str, group: str) -> str:
    """``RetrySubjectUtils.buildDeadRetrySubject``: ``%DEAD_RETRY%<subject>%<group>``."""
    return f"{QMQ_DEAD_PREFIX}{subject}%{group}"


def qmq_tags_match(kind: int, wanted: Collection[str], tags: Collection[str]) -> bool:
    """Whether a message with ``tags`` passes a QMQ tag filter: OR (``kind`` 1) wants one of
    ``wanted``, AND (2) all of them; an empty filter or another kind passes everything."""
    if not wanted:
        return True
    if kind == TAG_OR:
        return any(t in tags for t in wanted)
    if kind == TAG_AND:
        return all(t in tags for t in wanted)
    return True
