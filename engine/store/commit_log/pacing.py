"""When a commit-log writer racing without the host lock waits, so that racing writers take turns.

Writers that append optimistically (:mod:`engine.store.commit_log`) all aim at the same next
version; one wins, the others lose and must catch up and stamp again. Left alone, the winner keeps
winning: its handle is current, while every loser first pays a catch-up that costs about as much as
an append. :class:`RacePacer` evens this out with three rules, all measured by the writer itself:

* **A loser waits, then catches up**: a jittered pause drawn from a window of as many commit times
  as it has rivals (the distinct other writers whose commits it saw land within the last
  :data:`RIVALS_WINDOW_S`), halved for every further race it lost in a row, so the longest-waiting
  writer goes first.
* **A winner gives way**: after winning while the contention is hot (it lost a race within its
  last :data:`HOT_APPENDS` appends), it holds its next append back by about one commit time per
  rival, so that the writers it beat get their turn.
* Every pause is capped at :data:`MAX_PAUSE_S`, and none is taken without a rival: a lone writer
  never waits.

Pure bookkeeping: the pacer returns how long to wait and the writer sleeps; the randomness is
injectable for tests.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

# The commit time assumed before the writer has measured one (a one-message append on a small table).
INITIAL_COMMIT_S = 0.005
# Weight of the newest sample in the moving average of the commit time.
_NEW = 0.25
# A writer counts as a rival while a commit of it was seen within this many seconds.
RIVALS_WINDOW_S = 2.0
# A winner gives way while it lost a race within this many of its latest appends.
HOT_APPENDS = 4
# Rivals counted at most (the wait windows grow with them).
MAX_RIVALS = 32
# Longest single pause, whatever the measurements say.
MAX_PAUSE_S = 1.0


class RacePacer:
    """A writer's view of the race for the next version: its commit time, its rivals, its streak.

    Not thread-safe: one per writer, used under the writer's lock.

    Args:
        rng: the source of the jitter (a seeded :class:`random.Random` in tests).
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()
        self.commit_s = INITIAL_COMMIT_S  # moving average of one winning attempt (stamp to commit)
        self._seen: dict[str, float] = {}  # other writer -> when a commit of it was last seen
        self._hot = 0  # appends left during which a winner gives way
        self._hold_until = 0.0  # a winner's next append starts no earlier (time.monotonic())

    def saw(self, writers: Iterable[str], me: str, now: float) -> None:
        """Record the writers of the commits that landed since this writer last looked (a catch-up
        at ``now``, ``time.monotonic()``)."""
        for writer in writers:
            if writer != me:
                self._seen[writer] = now
        if len(self._seen) > MAX_RIVALS:
            self._forget(now)

    @property
    def rivals(self) -> int:
        """The other writers seen committing within the last :data:`RIVALS_WINDOW_S`."""
        return min(MAX_RIVALS, len(self._seen))

    def _forget(self, now: float) -> None:
        self._seen = {w: t for w, t in self._seen.items() if now - t <= RIVALS_WINDOW_S}

    def lost(self, streak: int, now: float) -> float:
        """Seconds to wait before catching up after losing ``streak`` races in a row (1 or more) at
        ``now``: a random point in a window of ``rivals`` commit times, halved per further loss."""
        self._hot = HOT_APPENDS
        self._forget(now)
        window = self.commit_s * max(1.0, self.rivals) / 2 ** min(max(streak - 1, 0), 6)
        return min(MAX_PAUSE_S, self._rng.uniform(0.0, window))

    def won(self, attempt_s: float, now: float) -> None:
        """Record a winning attempt that took ``attempt_s`` seconds and ended at ``now``
        (``time.monotonic()``); while the race is hot, the next append is held back."""
        self.commit_s += _NEW * (min(attempt_s, MAX_PAUSE_S) - self.commit_s)
        self._forget(now)
        if self._hot <= 0 or not self.rivals:
            self._hot = max(0, self._hot - 1)
            return
        self._hot -= 1
        hold = self.commit_s * self.rivals * self._rng.uniform(0.5, 1.0)
        self._hold_until = now + min(MAX_PAUSE_S, hold)

    def hold(self, now: float) -> float:
        """Seconds the next append should wait before it starts (0 unless it just won a hot race)."""
        wait = self._hold_until - now
        self._hold_until = 0.0
        return max(0.0, wait)
