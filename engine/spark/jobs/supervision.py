"""When the broker restarts a failed job's query, and when it gives up.

A streaming query can fail for reasons that pass: a Python worker that did not connect back in time
on a loaded machine, an object store that timed out, a commit that lost a race it cannot retry. Each
job's sink is idempotent per (job, batch id) and its checkpoint holds its place, so restarting the
query resumes exactly where it failed, as RocketMQ's broker services log an error and carry on. A
job failing again and again is not transient: past ``max_restarts`` failures within ``window_s`` the
broker stops, as before.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from engine.errors import InvalidArgumentError

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
DEFAULT_MAX_RESTARTS = 5
DEFAULT_WINDOW_S = 600.0
# delta-spark refusing a log it listed while a commit was being linked in: a directory listing of a
# local file system is no snapshot (ext4 returns entries in hash order, so a commit file made during
# the listing may be missed while a later one is seen). Reading the log again finds it whole, so such
# a failure is restarted at once and counted apart, against a larger allowance (a log that is really
# missing a commit still stops the broker). The 2026-11-25 soak's index job met 4 in 10 minutes at
# 20 commits per second, one short of stopping the broker.
LISTING_RACE = "DELTA_VERSIONS_NOT_CONTIGUOUS"
DEFAULT_MAX_LISTING_RACES = 30


def is_listing_race(why: str) -> bool:
    """Whether a job's error ``why`` is a listing race (:data:`LISTING_RACE`)."""
    return LISTING_RACE in why


@dataclass
class RestartPolicy:
    """Restarts of failed queries, per job: backoff grows with the failures inside the window.

    Args:
        max_restarts: restarts allowed per job within ``window_s`` (0: never restart, fail at once).
        window_s: how far back failures count.

    Raises:
        InvalidArgumentError: a negative ``max_restarts`` or a ``window_s`` that is not positive.
    """

    max_restarts: int = DEFAULT_MAX_RESTARTS
    window_s: float = DEFAULT_WINDOW_S
    max_listing_races: int = DEFAULT_MAX_LISTING_RACES
    _failures: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque), repr=False)
    _races: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque), repr=False)

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise InvalidArgumentError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if not self.window_s > 0:
            raise InvalidArgumentError(f"the restart window must be > 0 s, got {self.window_s}")

    def failed(self, job: str, now_s: float, why: str = "") -> float | None:
        """Record a failure of ``job`` at ``now_s`` (``why``: its error); the seconds to wait before
        restarting it, or ``None`` when it has failed too often and the broker should stop.

        A listing race (:data:`LISTING_RACE` in ``why``) is counted apart, against
        ``max_listing_races`` within the window, and restarted after the shortest backoff (the
        restart is not counted as a failure unless ``max_restarts`` is 0: nothing is restarted then).
        """
        race = is_listing_race(why) and self.max_restarts > 0
        recent = (self._races if race else self._failures)[job]
        while recent and recent[0] <= now_s - self.window_s:
            recent.popleft()
        recent.append(now_s)
        if len(recent) > (self.max_listing_races if race else self.max_restarts):
            return None
        return BACKOFF_S[0] if race else BACKOFF_S[min(len(recent), len(BACKOFF_S)) - 1]

    def restarts(self, job: str) -> int:
        """Failures of ``job`` still inside the window (listing races left out)."""
        return len(self._failures.get(job, ()))

    def listing_races(self, job: str) -> int:
        """Listing races of ``job`` still inside the window."""
        return len(self._races.get(job, ()))
