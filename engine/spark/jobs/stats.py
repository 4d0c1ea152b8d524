"""The counters a job keeps of one run, for its summary line and for tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class JobStats:
    """Counters of one run of a job, updated on the driver once per micro-batch (thread-safe).

    A job's stats subclass this with its own ``int`` counters, all defaulting to 0, and an ``add``
    that names what one micro-batch did. ``errors`` counts what a ``--once`` run survived but must
    report as a failure (exit code 1).
    """

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False, kw_only=True)

    def count(self, **amounts: int) -> None:
        """Add each of ``amounts`` to the counter of that name, atomically."""
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    @property
    def errors(self) -> int:
        return 0
