"""How long the door's puts took: the ``putMessage…`` rows of RocketMQ's broker runtime table.

RocketMQ's broker times every put into its store (``StoreStatsService``) and ``mqadmin brokerStatus``
prints what it counted: the puts and their bytes since the broker started, the longest put, and how
the puts of the last minute spread over thirteen time ranges (``putMessageDistributeTime``). The
door keeps the same figures for the sends it stores: a put is one send request (a message, or a
client's batch whole), timed from the moment the door hands it to the store until its commit
landed (the wait for the group commit it joins included, as RocketMQ's includes the wait for its
put lock).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

_BOUNDS_MS = (0, 10, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 10000)
"""The ends of RocketMQ's ranges: ``<= 0`` ms, then ``< 10`` ms, ``< 50`` ms … ``< 10`` s; a put of
``t`` whole milliseconds (``t`` > 0) falls in the first range whose end is above ``t``, from 10 s on
in ``[10s~]``."""

RANGES = (
    "[<=0ms]", "[0~10ms]", "[10~50ms]", "[50~100ms]", "[100~200ms]", "[200~500ms]", "[500ms~1s]",
    "[1~2s]", "[2~3s]", "[3~4s]", "[4~5s]", "[5~10s]", "[10s~]",
)  # fmt: skip
"""RocketMQ's names of the ranges, in its order."""

MINUTE_S = 60.0
"""How often the distribution starts over: it shows the last whole minute's puts, as RocketMQ's
(before the first minute has passed, the puts so far)."""


def range_of(elapsed_ms: int) -> int:
    """The index in :data:`RANGES` of a put that took ``elapsed_ms`` whole milliseconds."""
    if elapsed_ms <= 0:
        return 0
    return bisect.bisect_right(_BOUNDS_MS, elapsed_ms)


class PutStats:
    """The door's put statistics; the event loop's alone (no lock).

    Args:
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.times_total = 0  # messages put
        self.size_total = 0  # their body bytes
        self.entire_time_max_ms = 0
        self._minute = [0] * len(RANGES)  # the running minute's puts per range
        self._last: list[int] | None = None  # the last whole minute's
        self._minute_ends = self._clock() + MINUTE_S

    def record(self, elapsed_s: float, messages: int, body_bytes: int) -> None:
        """Count one put of ``messages`` messages of ``body_bytes`` bytes that took ``elapsed_s``."""
        self._roll()
        elapsed_ms = int(elapsed_s * 1000)
        self.times_total += messages
        self.size_total += body_bytes
        self.entire_time_max_ms = max(self.entire_time_max_ms, elapsed_ms)
        self._minute[range_of(elapsed_ms)] += 1

    def _roll(self) -> None:
        now = self._clock()
        if now < self._minute_ends:
            return
        # A minute with no put at all after the last one shows as empty.
        idle = now - self._minute_ends >= MINUTE_S
        self._last = [0] * len(RANGES) if idle else self._minute
        self._minute = [0] * len(RANGES)
        self._minute_ends = now + MINUTE_S

    def distribution(self) -> list[int]:
        """The puts per range (:data:`RANGES`) of the last whole minute (the puts so far before it)."""
        self._roll()
        return list(self._minute if self._last is None else self._last)

    def runtime_fields(self) -> dict[str, str]:
        """The rows RocketMQ's ``getRuntimeInfo`` gives the puts, formatted as it does (the average
        size as Java prints a double; "NaN" before the first put)."""
        average = repr(self.size_total / self.times_total) if self.times_total else "NaN"
        spread = " ".join(f"{name}:{count}" for name, count in zip(RANGES, self.distribution(), strict=True))
        return {
            "putMessageEntireTimeMax": str(self.entire_time_max_ms),
            "putMessageTimesTotal": str(self.times_total),
            "putMessageSizeTotal": str(self.size_total),
            "putMessageAverageSize": average,
            "putMessageDistributeTime": spread + " ",
        }
