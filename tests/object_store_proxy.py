"""The S3 test proxy (:class:`bench.s3proxy.S3Proxy`) run in a process of its own.

Why not in the test's process: delta-rs's storage handler (the kernel's side files,
:mod:`engine.store.delta.objects`) holds the GIL while some requests are in flight (the HEAD before a
read, the start of an upload, a listing). An in-process proxy is Python threads, which then cannot
answer: the request never completes. A proxy in another process has its own GIL, as a real network
has.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.managers import BaseManager
from types import TracebackType
from typing import Any

from bench.s3proxy import S3Proxy


class _Proxy(S3Proxy):
    """What the manager serves: the proxy, with its attributes behind methods (a manager's proxy
    object forwards method calls only)."""

    seen: list[str] | None = None

    def _take(self, method: str, target: str) -> Any:
        if self.seen is not None:
            self.seen.append(f"{method} {target}")
        return super()._take(method, target)

    def count(self) -> int:
        return self.requests

    def record(self, on: bool) -> list[str]:
        seen, self.seen = self.seen or [], ([] if on else None)
        return seen

    def endpoint_url(self) -> str:
        return self.endpoint

    def set_delay(self, delay_ms: float) -> None:
        self.delay_ms = delay_ms

    def hits(self) -> list[list[str]]:
        return [list(rule.hits) for rule in self.rules]

    def fail_rule(self, path: str, method: str | None, status: int, after: bool, times: int) -> int:
        self.fail(path, method=method, status=status, after=after, times=times)
        return len(self.rules) - 1

    def slow_rule(self, path: str, hold_ms: float, method: str | None, times: int) -> int:
        self.slow(path, hold_ms, method=method, times=times)
        return len(self.rules) - 1


class _Manager(BaseManager):
    pass


def _make(upstream: str, delay_ms: float) -> _Proxy:
    return _Proxy(upstream, delay_ms).start()  # type: ignore[return-value]


_Manager.register("Proxy", _make)


class ProxyProcess:
    """An :class:`S3Proxy` in a child process, with the same faults: ``requests`` (a count),
    ``fail``, ``slow``, ``clear``, ``delay_ms`` and ``hits(rule)`` (the requests a rule hit)."""

    def __init__(self, upstream: str, delay_ms: float = 0.0) -> None:
        self._manager = _Manager(ctx=multiprocessing.get_context("spawn"))
        self._manager.start()
        self._proxy: Any = self._manager.Proxy(upstream, delay_ms)  # type: ignore[attr-defined]
        self.endpoint: str = self._proxy.endpoint_url()

    @property
    def requests(self) -> int:
        return int(self._proxy.count())

    @property
    def delay_ms(self) -> float:
        raise AttributeError("write-only")

    @delay_ms.setter
    def delay_ms(self, value: float) -> None:
        self._proxy.set_delay(value)

    def fail(
        self, path: str, *, method: str | None = None, status: int = 503, after: bool = False, times: int = 1
    ) -> int:
        """As :meth:`S3Proxy.fail`; returns the rule's number, for :meth:`hits`."""
        return int(self._proxy.fail_rule(path, method, status, after, times))

    def slow(self, path: str, hold_ms: float, *, method: str | None = None, times: int = 1) -> int:
        """As :meth:`S3Proxy.slow`; returns the rule's number, for :meth:`hits`."""
        return int(self._proxy.slow_rule(path, hold_ms, method, times))

    def hits(self, rule: int) -> list[str]:
        """The requests rule number ``rule`` hit."""
        return list(self._proxy.hits()[rule])

    def clear(self) -> None:
        self._proxy.clear()

    def record(self, on: bool = True) -> list[str]:
        """Start (or stop) recording every request; returns what was recorded until now."""
        return list(self._proxy.record(on))

    def stop(self) -> None:
        self._manager.shutdown()

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
