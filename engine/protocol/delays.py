"""RocketMQ delay levels and retry policy: pure functions."""

from __future__ import annotations

from collections.abc import Mapping

from engine.errors import InvalidArgumentError
from engine.protocol.names import PROPERTY_MAX_RECONSUME_TIMES

# messageDelayLevel = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DELAY_LEVELS_MS: tuple[int, ...] = tuple(
    s * 1000 for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
MAX_DELAY_LEVEL = len(DELAY_LEVELS_MS)


def validate_delay_level(level: object) -> int:
    """Check a delay level: 0 (none) or 1..18.

    Raises:
        InvalidArgumentError: anything else.
    """
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= MAX_DELAY_LEVEL:
        raise InvalidArgumentError(
            f"delay_level {level!r} is invalid; use 0 (no delay) or 1..{MAX_DELAY_LEVEL}", delay_level=level
        )
    return level


def clamp_delay_level(level: object) -> int:
    """The delay level a send uses, as RocketMQ's broker: a level above 18 is clamped to 18.

    Raises:
        InvalidArgumentError: not an int >= 0 (0: no delay).
    """
    if isinstance(level, bool) or not isinstance(level, int) or level < 0:
        raise InvalidArgumentError(
            f"delay_level {level!r} is invalid; use 0 (no delay) or 1..{MAX_DELAY_LEVEL} (higher levels are "
            f"clamped to {MAX_DELAY_LEVEL})",
            delay_level=level,
        )
    return min(level, MAX_DELAY_LEVEL)


def delay_due_ms(level: int, from_ms: int) -> int:
    """When a message sent at ``from_ms`` with ``level`` is due."""
    validate_delay_level(level)
    if level == 0:
        return from_ms
    return from_ms + DELAY_LEVELS_MS[level - 1]


def retry_delay_level(reconsume_times: int) -> int:
    """Delay level of the next retry: 3 + reconsume times, capped at the last level."""
    return min(3 + max(reconsume_times, 0), MAX_DELAY_LEVEL)


# A reconsume limit setting: one int for every group, a mapping group -> int, or None (the default).
MaxReconsume = int | Mapping[str, int] | None


def max_reconsume_times(
    properties: Mapping[str, str], group: str, setting: MaxReconsume, default: int
) -> int:
    """The reconsume limit for one message of ``group``.

    In order of precedence: the message's ``MAX_RECONSUME_TIMES`` property (when it is an int >= 0),
    the group's entry of a mapping ``setting``, an int ``setting``, then ``default``.
    """
    raw = properties.get(PROPERTY_MAX_RECONSUME_TIMES)
    if raw is not None:
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value >= 0:
            return value
    chosen = -1  # -1: RocketMQ's "the default"
    if isinstance(setting, Mapping):
        if group in setting:
            chosen = int(setting[group])
    elif setting is not None:
        chosen = int(setting)
    return default if chosen == -1 else chosen


def validate_max_reconsume(setting: MaxReconsume) -> MaxReconsume:
    """Check a reconsume limit setting; returns it (a mapping as a plain dict).

    Raises:
        InvalidArgumentError: neither None, an int >= -1, nor a mapping of group names to ints >= -1
            (-1 means the default, as RocketMQ's ``maxReconsumeTimes = -1``).
    """

    def ok(value: object) -> bool:
        return not isinstance(value, bool) and isinstance(value, int) and value >= -1

    if setting is None or (not isinstance(setting, Mapping) and ok(setting)):
        return setting
    if isinstance(setting, Mapping) and all(isinstance(g, str) and ok(v) for g, v in setting.items()):
        return dict(setting)
    raise InvalidArgumentError(
        f"max_reconsume_times {setting!r} must be an int >= -1 or a mapping of group to int >= -1",
        max_reconsume_times=setting,
    )


def is_dead_letter(reconsume_times: int, limit: int) -> bool:
    """True when a message that failed for the ``reconsume_times + 1``-th time exceeds ``limit``."""
    return reconsume_times + 1 > limit


def nack_plan(
    reconsume_times: int, consumer_max: int, delay_level: int, job_max: int, now_ms: int
) -> tuple[int, int | None]:
    """The NACK a consumer records for a failed message (RocketMQ's ``sendMessageBack``): its
    reconsume count and retry time; pure.

    ``delay_level`` > 0 retries after that level (above the last: the last), 0 lets the retry job
    choose (3 + reconsume times), -1 dead-letters at once. A message that already failed
    ``consumer_max`` times, or one sent with -1, carries its count up to the retry job's limit
    (``max(count, consumer_max, job_max)``), so the job dead-letters it.
    """
    retry_at = None
    if delay_level > 0:
        retry_at = now_ms + DELAY_LEVELS_MS[min(delay_level, MAX_DELAY_LEVEL) - 1]
    times = reconsume_times
    if delay_level == -1 or times >= consumer_max:
        times = max(times, consumer_max, job_max)
    return times, retry_at
