"""The counters a job keeps of one run, for its summary line and for tests."""

from __future__ import annotations

import threading
from typing import ClassVar


class JobStats:
    """Counters of one run of a job, updated on the driver once per micro-batch (thread-safe).

    A job's stats class names its counters in :attr:`COUNTERS` (each starts at 0 and reads as an
    attribute: ``stats.entries``); :meth:`count` adds to them, :meth:`peak` keeps a maximum.
    :attr:`errors` counts what a ``--once`` run survived but must report as a failure (exit code 1).
    """

    COUNTERS: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = dict.fromkeys(self.COUNTERS, 0)

    def __getattr__(self, name: str) -> int:
        values = self.__dict__.get("_values", {})
        if name in values:
            return int(values[name])
        raise AttributeError(f"{type(self).__name__} has no counter {name!r}")

    def count(self, **amounts: int) -> None:
        """Add each of ``amounts`` to the counter of that name, atomically."""
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def peak(self, name: str, value: int) -> None:
        """Raise counter ``name`` to ``value`` if it is lower."""
        with self._lock:
            self._values[name] = max(self._values[name], value)

    def counters(self) -> dict[str, int]:
        """Every counter's value, by name."""
        with self._lock:
            return dict(self._values)

    @property
    def errors(self) -> int:
        return 0

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v}" for k, v in self._values.items())
        return f"{type(self).__name__}({values})"
