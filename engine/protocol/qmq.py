"""QMQ's client-visible rules that are pure: subjects of retries and dead letters, where a consumer's
delayed retry goes, tag filters."""

from __future__ import annotations

import re
import zlib
from collections.abc import Collection

from engine.protocol.names import MAX_GROUP_LENGTH

QMQ_RETRY_PREFIX = "%RETRY%"
QMQ_DEAD_PREFIX = "%DEAD_RETRY%"
QMQ_GROUP_ATTRIBUTE = "qmq_consumerGroupName"  # BaseMessage.keys: the group a message was pulled by
QMQ_RETRY_DELAY_MS = 5_000  # BrokerConstants.DEFAULT_RETRY_DELAY_SECONDS: a nack waits this long
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


def qmq_delayed_retry_subject(subject: str, delayed: bool, group: str | None) -> str | None:
    """Where a consumer's delayed retry goes: the group's retry subject, or None for a send that is
    not one (stored where it was sent).

    A listener that throws ``NeedRetryException(next)`` makes QMQ's client send the message back
    as a delayed message (``AckEntry.ackDelay`` -> ``DelayMessageService``) on its real subject,
    carrying the group that pulled it (``qmq_consumerGroupName``), due at ``next``. QMQ's delay
    server puts it back on the real subject, where other groups' clients drop it; the door puts it,
    once due, on ``%RETRY%<subject>%<group>``, which only that group pulls.
    """
    if not delayed or not group or subject.startswith((QMQ_RETRY_PREFIX, QMQ_DEAD_PREFIX)):
        return None
    return qmq_retry_subject(subject, group)


def qmq_retry_due_ms(subject: str, stored_ms: int, retry_delay_ms: int) -> int | None:
    """When a send to ``subject`` is due to its consumers: a nack to a retry subject ``retry_delay_ms``
    after it was stored (QMQ's ``ConsumeQueue.isDelayReached``), anything else at once (None)."""
    if retry_delay_ms <= 0 or not subject.startswith(QMQ_RETRY_PREFIX):
        return None
    return stored_ms + retry_delay_ms


_NOT_IN_NAMES = re.compile(r"[^%|a-zA-Z0-9_.-]")


def qmq_store_group(group: str) -> str:
    """The store's name of a QMQ consumer group: the group itself when the store can name it; else
    (a broadcast consumer's group is its client id, ``<hostname>@@<md5>`` by default:
    ``MessageConsumerProvider.addListener``) each character the store does not allow as ``_``,
    then ``-`` and the CRC-32 of the group in hex, so that two such groups stay two. Pure."""
    if not group or (len(group) <= MAX_GROUP_LENGTH and not _NOT_IN_NAMES.search(group)):
        return group
    tail = f"-{zlib.crc32(group.encode()):08x}"
    return _NOT_IN_NAMES.sub("_", group)[: MAX_GROUP_LENGTH - len(tail)] + tail


def qmq_store_subject(subject: str) -> str:
    """The store's name of a QMQ subject: a retry or dead subject's group part under its
    :func:`qmq_store_group` name (a broadcast consumer's retry subject ends in its client id), any
    other subject as it is. Pure."""
    for prefix in (QMQ_RETRY_PREFIX, QMQ_DEAD_PREFIX):
        if subject.startswith(prefix) and "%" in subject[len(prefix) :]:
            real, group = subject[len(prefix) :].rsplit("%", 1)
            return f"{prefix}{real}%{qmq_store_group(group)}"
    return subject
