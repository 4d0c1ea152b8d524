"""RocketMQ delay levels and retry policy: pure functions."""

from __future__ import annotations

from engine.errors import InvalidArgumentError

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


def delay_due_ms(level: int, from_ms: int) -> int:
    """When a message sent at ``from_ms`` with ``level`` is due."""
    validate_delay_level(level)
    if level == 0:
        return from_ms
    return from_ms + DELAY_LEVELS_MS[level - 1]


def retry_delay_level(reconsume_times: int) -> int:
    """Delay level of the next retry: 3 + reconsume times, capped at the last level."""
    return min(3 + max(reconsume_times, 0), MAX_DELAY_LEVEL)
