"""Times as people type them (``mq --timestamp``, the dashboard's search), as epoch milliseconds."""

from __future__ import annotations

import datetime as _dt
import re

from engine.errors import InvalidArgumentError

_RELATIVE = re.compile(r"^now(?:-(\d+)([smhd]))?$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_time(text: str, now_ms: int | None = None) -> int:
    """A time as epoch milliseconds: an integer (ms), ``now``, ``now-30m`` (s, m, h, d) or an ISO
    8601 date-time (local time unless it names an offset).

    Args:
        text: the time as typed.
        now_ms: the clock for ``now`` (default: the system clock).

    Raises:
        InvalidArgumentError: none of those.
    """
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    relative = _RELATIVE.match(text)
    if relative:
        clock = now_ms if now_ms is not None else int(_dt.datetime.now().timestamp() * 1000)
        amount, unit = relative.groups()
        return clock - (int(amount) * _UNIT_MS[unit] if amount else 0)
    try:
        return int(_dt.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise InvalidArgumentError(
            f"{text!r} is not a time: give epoch milliseconds, now, now-30m or 2026-01-31T12:00:00", time=text
        ) from None
