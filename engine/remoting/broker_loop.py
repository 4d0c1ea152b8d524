"""The broker's background work in-process, for ``mq serve`` without Spark: dispatch (so a send
becomes pullable), delays and timers, retries and dead letters, the key index and the transaction
check. The same engine functions the Spark jobs run (``dispatch_pending``, a long-lived
``Scheduler``, ``route_retries`` with a long-lived ``RetryRouter``, ``index_pending``,
``check_transactions``), on a thread. A pass whose input table has no new version is skipped (one
file-existence probe on a local store), so an idle server costs little."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.broker.retry import RetryRouter, route_retries
from engine.broker.schedule import Scheduler
from engine.broker.transactions import check_transactions
from engine.store import schemas
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
        self._scheduler = Scheduler(store)
        self._router = RetryRouter(store)
        self._seen: dict[str, int] = {}  # "job@table" -> input table version its last pass covered
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

    def _step(self, name: str, fn: Callable[[Store], object], *tables: str) -> None:
        """Run one job's pass; with ``tables``, only when one of them has a version the last pass
        did not cover (the versions are read before the pass, so a commit during it is seen next time)."""
        latest = {
            table: self.store.latest_version_hint(table, self._seen.get(f"{name}@{table}", -1))
            for table in tables
        }
        if tables and all(v <= self._seen.get(f"{name}@{t}", -1) for t, v in latest.items()):
            return
        try:
            fn(self.store)
        except Exception as exc:
            self.errors += 1
            _log.warning("broker loop: %s failed: %s", name, exc)
            return
        for table, version in latest.items():
            self._seen[f"{name}@{table}"] = version

    def run_once(self, *, everything: bool = True) -> None:
        """One pass: dispatch, and (``everything``) the other jobs, then dispatch what they re-put."""
        self._step("dispatch", dispatch_pending, *self.store.commit_logs)
        if everything:
            self._step("schedule", lambda _: self._scheduler.deliver_due())
            self._step("retry", lambda store: route_retries(store, router=self._router), schemas.ACTION_LOG)
            self._step("transaction check", check_transactions)
            self._step("dispatch", dispatch_pending, *self.store.commit_logs)
            self._step("index", index_pending, *self.store.commit_logs)
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
