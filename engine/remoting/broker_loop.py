"""The broker's background work in-process, for ``mq serve`` without Spark: dispatch (so a send
becomes pullable), delays and timers, retries and dead letters, the key index and the transaction
check. The same engine functions the Spark jobs run (``dispatch_pending``, ``deliver_due``,
``route_retries``, ``index_pending``, ``check_transactions``), on a thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.broker.retry import route_retries
from engine.broker.schedule import deliver_due
from engine.broker.transactions import check_transactions
from engine.store.store import Store

_log = logging.getLogger(__name__)


class BrokerLoop:
    """Runs the broker's passes until stopped: dispatch every ``dispatch_ms``, the rest every ``other_ms``.

    Args:
        store: the store.
        dispatch_ms: pause between dispatch passes (what bounds send-to-pullable latency).
        other_ms: pause between passes of the other jobs.
    """

    def __init__(self, store: Store, *, dispatch_ms: int = 20, other_ms: int = 500) -> None:
        self.store = store
        self.dispatch_ms = dispatch_ms
        self.other_ms = other_ms
        self.passes = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mq-serve-broker-loop", daemon=True)

    def start(self) -> BrokerLoop:
        """Start the thread."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        """Stop after the pass under way."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _step(self, name: str, fn: Callable[[Store], object]) -> None:
        try:
            fn(self.store)
        except Exception as exc:
            self.errors += 1
            _log.warning("broker loop: %s failed: %s", name, exc)

    def run_once(self, *, everything: bool = True) -> None:
        """One pass: dispatch, and (``everything``) the other jobs, then dispatch what they re-put."""
        self._step("dispatch", dispatch_pending)
        if everything:
            self._step("schedule", deliver_due)
            self._step("retry", route_retries)
            self._step("transaction check", check_transactions)
            self._step("dispatch", dispatch_pending)
            self._step("index", index_pending)
        self.passes += 1

    def _run(self) -> None:
        next_other = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            everything = now >= next_other
            if everything:
                next_other = now + self.other_ms / 1000
            self.run_once(everything=everything)
            self._stop.wait(self.dispatch_ms / 1000)
