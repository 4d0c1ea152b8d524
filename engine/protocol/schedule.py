"""The schedule envelope: how a delayed, timer or retried message waits in ``SCHEDULE_TOPIC_XXXX``.

A message that must wait is stored in the schedule topic instead of its real topic: its real
destination goes into the properties ``REAL_TOPIC`` / ``REAL_QID``, its delay level into ``DELAY``
(queue = level - 1) or its timer into ``TIMER_DELIVER_MS`` (queue 18, the timer queue), and its due
time into the tags-code slot of its consume-queue entry, so deciding what is due reads no body.
The producer (delays and timers) and the retry job (retries) wrap messages with
:func:`schedule_envelope`; the schedule job unwraps them with :func:`real_destination`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from engine.errors import InvalidArgumentError, InvalidMessageError
from engine.protocol.delays import MAX_DELAY_LEVEL, delay_due_ms, validate_delay_level
from engine.protocol.names import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    SCHEDULE_TOPIC,
)

TIMER_QUEUE_ID = MAX_DELAY_LEVEL  # queue 18: arbitrary-time timers
LEVEL_QUEUES = range(MAX_DELAY_LEVEL)  # queues 0..17: delay levels 1..18
SCHEDULE_QUEUES = MAX_DELAY_LEVEL + 1  # queues of the schedule topic
# Timer messages: how far ahead they may be due (RocketMQ 5's timerMaxDelaySec default, 3 days);
# the setting is EngineConfig.timer_max_delay_sec.
DEFAULT_TIMER_MAX_DELAY_SEC = 3 * 24 * 3600
MAX_TIMER_DELAY_MS = DEFAULT_TIMER_MAX_DELAY_SEC * 1000
# The properties that make a message a timer message (RocketMQ 5's Message.setDelayTimeSec,
# setDelayTimeMs and setDeliverTimeMs set them); the first present wins, in this order.
TIMER_PROPERTIES = (PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS)
# The properties the envelope adds (and the timer requests); delivery to the real topic removes
# them, except that a delay-level message keeps REAL_TOPIC / REAL_QID as in RocketMQ.
SCHEDULE_PROPERTIES = frozenset(
    {PROPERTY_DELAY, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, *TIMER_PROPERTIES}
)
_KEPT_AFTER_DELAY = frozenset({PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID})


def timer_deliver_ms(
    properties: Mapping[str, str], deliver_at_ms: int | None, *, now_ms: int, max_delay_ms: int
) -> int | None:
    """When a timer message is due, as RocketMQ 5's broker reads it (``transformTimerMessage``).

    ``TIMER_DELAY_SEC`` (seconds from now), else ``TIMER_DELAY_MS`` (milliseconds from now), else
    ``TIMER_DELIVER_MS`` or ``deliver_at_ms`` (an epoch-millisecond time; the two must agree when
    both are given).

    Returns:
        The due time, or None when the message is no timer or is already due (sent at once).

    Raises:
        InvalidMessageError: a timer property that is not an integer, ``TIMER_DELIVER_MS`` and
            ``deliver_at_ms`` disagreeing, or a due time more than ``max_delay_ms`` ahead.
    """
    due: int | None = None
    for name in TIMER_PROPERTIES:
        raw = properties.get(name)
        if raw is None:
            continue
        try:
            value = int(raw)
        except ValueError:
            raise InvalidMessageError(f"timer property {name}={raw!r} is not an integer") from None
        if name == PROPERTY_TIMER_DELIVER_MS and deliver_at_ms is not None and deliver_at_ms != value:
            raise InvalidMessageError(
                f"deliver_at_ms {deliver_at_ms} and {name}={raw!r} disagree; give one of them"
            )
        due = now_ms + value * 1000 if name == PROPERTY_TIMER_DELAY_SEC else value
        due = now_ms + value if name == PROPERTY_TIMER_DELAY_MS else due
        break
    if due is None:
        due = deliver_at_ms
    if due is None or due <= now_ms:
        return None
    if due - now_ms > max_delay_ms:
        raise InvalidMessageError(
            f"timer is due {due - now_ms} ms ahead; timers reach at most {max_delay_ms // 1000} s "
            "(timer_max_delay_sec)"
        )
    return due


class ScheduleEnvelope(NamedTuple):
    """Where and how a waiting message is stored: the routing fields of its schedule-topic row."""

    topic: str  # always SCHEDULE_TOPIC
    queue_id: int  # delay level - 1, or TIMER_QUEUE_ID
    properties: dict[str, str]  # the message's, plus REAL_TOPIC, REAL_QID and DELAY or TIMER_DELIVER_MS
    delay_level: int  # 0 for a timer
    deliver_at_ms: int  # when it is due
    tags_code: int  # the due time again: the consume-queue slot the schedule job reads


def schedule_queue_id(delay_level: int) -> int:
    """Schedule-topic queue of a delay level (level - 1), or the timer queue for level 0."""
    return validate_delay_level(delay_level) - 1 if delay_level else TIMER_QUEUE_ID


def schedule_envelope(
    real_topic: str,
    real_queue_id: int,
    properties: Mapping[str, str],
    *,
    sent_ms: int,
    delay_level: int = 0,
    deliver_at_ms: int | None = None,
) -> ScheduleEnvelope:
    """Wrap a message bound for ``real_topic`` / ``real_queue_id`` so that it waits in the schedule topic.

    Args:
        real_topic: where the message goes once due.
        real_queue_id: its queue there.
        properties: the message's properties (not changed; the envelope holds a copy).
        sent_ms: when it was sent: a delay level counts from here.
        delay_level: 1..18 for a delay level (wins over ``deliver_at_ms``); 0 for a timer.
        deliver_at_ms: a timer's due time (epoch ms), used when ``delay_level`` is 0.

    Raises:
        InvalidArgumentError: a bad delay level, or neither a level nor a timer.
    """
    props = {k: v for k, v in properties.items() if k not in TIMER_PROPERTIES}
    if delay_level:
        due = delay_due_ms(delay_level, sent_ms)
        props[PROPERTY_DELAY] = str(delay_level)
    elif deliver_at_ms is not None:
        due = deliver_at_ms
        props[PROPERTY_TIMER_DELIVER_MS] = str(due)
    else:
        raise InvalidArgumentError("a scheduled message needs a delay level 1..18 or a deliver_at_ms")
    props[PROPERTY_REAL_TOPIC] = real_topic
    props[PROPERTY_REAL_QUEUE_ID] = str(real_queue_id)
    return ScheduleEnvelope(SCHEDULE_TOPIC, schedule_queue_id(delay_level), props, delay_level, due, due)


def without_schedule_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties without what :func:`schedule_envelope` added."""
    return {k: v for k, v in properties.items() if k not in SCHEDULE_PROPERTIES}


def delivered_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties a due message keeps in its real topic: a delay-level message keeps
    ``REAL_TOPIC`` / ``REAL_QID`` (RocketMQ's ScheduleMessageService clears only the delay), a timer
    message keeps neither (its TimerMessageStore clears them)."""
    keep = _KEPT_AFTER_DELAY if PROPERTY_DELAY in properties else frozenset()
    return {k: v for k, v in properties.items() if k not in SCHEDULE_PROPERTIES or k in keep}


class RealDestination(NamedTuple):
    """Where a due schedule-topic message goes, and the properties it keeps there."""

    topic: str
    queue_id: int
    properties: dict[str, str]


def real_destination(properties: Mapping[str, str], queues: int | None = None) -> RealDestination | None:
    """Unwrap a schedule-topic message's properties; None when they name no real topic.

    ``queues`` (the real topic's queue count, when known) folds a ``REAL_QID`` that no longer exists
    onto an existing queue rather than losing the message. A missing or non-numeric ``REAL_QID`` means
    queue 0; a negative one, no destination.
    """
    real_topic = properties.get(PROPERTY_REAL_TOPIC)
    try:
        real_qid = int(properties.get(PROPERTY_REAL_QUEUE_ID, "0"))
    except ValueError:
        real_qid = 0
    if not real_topic or real_qid < 0:
        return None
    if queues is not None and queues > 0 and real_qid >= queues:
        real_qid %= queues
    return RealDestination(real_topic, real_qid, delivered_properties(properties))
