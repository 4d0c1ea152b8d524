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
    _failures: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque), repr=False)

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise InvalidArgumentError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if not self.window_s > 0:
            raise InvalidArgumentError(f"the restart window must be > 0 s, got {self.window_s}")

    def failed(self, job: str, now_s: float) -> float | None:
        """Record a failure of ``job`` at ``now_s``; the seconds to wait before restarting it, or
        ``None`` when it has failed too often and the broker should stop."""
        recent = self._failures[job]
        while recent and recent[0] <= now_s - self.window_s:
            recent.popleft()
        recent.append(now_s)
        if len(recent) > self.max_restarts:
            return None
        return BACKOFF_S[min(len(recent), len(BACKOFF_S)) - 1]

    def restarts(self, job: str) -> int:
        """Failures of ``job`` still inside the window."""
        return len(self._failures.get(job, ()))
