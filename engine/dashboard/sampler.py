"""A short in-memory history of the store for the dashboard: per topic the number of dispatched
messages, per group its lag, sampled every few seconds. Rates and charts are drawn from it; nothing
is written to the store."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.client.admin import Admin
from engine.store.store import now_ms

MAX_SAMPLES = 360  # 30 minutes at the default 5 s


@dataclass(frozen=True)
class Sample:
    """What the store looked like at ``ts_ms``."""

    ts_ms: int
    topic_messages: dict[str, int] = field(default_factory=dict)
    group_lag: dict[str, int] = field(default_factory=dict)


class Sampler:
    """Samples an :class:`Admin`'s topics and groups; :meth:`start` does it every ``interval_s``.

    Args:
        admin: what to sample.
        lock: held while the admin is used (the dashboard's pages share it).
        interval_s: seconds between samples of the background thread.
        clock: epoch milliseconds (tests pass their own).
    """

    def __init__(
        self,
        admin: Admin,
        lock: threading.Lock,
        interval_s: float = 5.0,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._admin = admin
        self._lock = lock
        self._interval_s = interval_s
        self._clock = clock
        self.samples: deque[Sample] = deque(maxlen=MAX_SAMPLES)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Sample:
        """Take one sample now and keep it."""
        with self._lock:
            topics = self._admin.message_counts()  # cheap with 10,000 topics: no entry is read
            lag: dict[str, int] = {}
            for row in self._admin.consumer_lag():
                lag[row.group] = lag.get(row.group, 0) + row.lag
        taken = Sample(self._clock(), topics, lag)
        self.samples.append(taken)
        return taken

    def rate(self, topic: str) -> float | None:
        """Messages per second dispatched to ``topic`` between the last two samples that know it."""
        known = [s for s in self.samples if topic in s.topic_messages]
        if len(known) < 2 or known[-1].ts_ms <= known[-2].ts_ms:
            return None
        added = known[-1].topic_messages[topic] - known[-2].topic_messages[topic]
        return max(0, added) * 1000 / (known[-1].ts_ms - known[-2].ts_ms)

    def lag_series(self, group: str) -> list[tuple[int, int]]:
        """``(ts_ms, lag)`` of ``group`` over the kept samples."""
        return [(s.ts_ms, s.group_lag[group]) for s in self.samples if group in s.group_lag]

    def _run(self) -> None:
        while not self._stop.is_set():
            # A busy or damaged store: skip this sample, try again next time.
            with contextlib.suppress(Exception):
                self.sample()
            self._stop.wait(self._interval_s)

    def start(self) -> Sampler:
        """Sample in a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="mq-dashboard-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the background thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
