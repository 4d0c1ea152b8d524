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
from collections.abc import Callable, Sequence

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
        # (job, input table) -> the table's version the job's last pass covered
        self._seen: dict[tuple[str, str], int] = {}
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

    def _step(self, name: str, fn: Callable[[Store], object], tables: Sequence[str] = ()) -> None:
        """Run one job's pass; with input ``tables`` (every commit-log shard, for dispatch and index),
        only when one of them has a version the last pass did not cover (the versions are read
        before the pass, so a commit during it is seen next time)."""
        latest = {t: self.store.latest_version_hint(t, self._seen.get((name, t), -1)) for t in tables}
        if tables and all(v <= self._seen.get((name, t), -1) for t, v in latest.items()):
            return
        try:
            fn(self.store)
        except Exception as exc:
            self.errors += 1
            _log.warning("broker loop: %s failed: %s", name, exc)
            return
        for t, v in latest.items():
            self._seen[(name, t)] = v

    def run_once(self, *, everything: bool = True) -> None:
        """One pass: dispatch, and (``everything``) the other jobs, then dispatch what they re-put."""
        logs = self.store.commit_logs
        self._step("dispatch", dispatch_pending, logs)
        if everything:
            self._step("schedule", lambda _: self._scheduler.deliver_due())
            self._step(
                "retry", lambda store: route_retries(store, router=self._router), (schemas.ACTION_LOG,)
            )
            self._step("transaction check", check_transactions)
            self._step("dispatch", dispatch_pending, logs)
            self._step("index", index_pending, logs)
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
