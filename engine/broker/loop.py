"""The broker's passes in-process, for ``mq serve`` without Spark: the steps of the broker's pass plan
(:data:`engine.broker.plan.PLAN`) on a thread, with the same engine functions the Spark jobs run.

Dispatch runs on every tick, so a send becomes pullable within a tick; the other steps but
maintenance run with it every round, in plan order; maintenance runs on a thread of its own at its
own slower cadence (:mod:`engine.broker.plan` says why). A step whose input tables have no new
version is skipped (one file-existence probe per table on a local store), so an idle server costs
little.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing import resource_tracker
from typing import Any

from engine.broker.maintenance import DEFAULT_INTERVAL_S
from engine.broker.plan import PLAN, Cadence, Pass, Step
from engine.collector import tune_for_serving
from engine.config import EngineConfig
from engine.errors import InvalidArgumentError
from engine.store.delta import FileFeed, FileIntake, feed_pair, local_path
from engine.store.store import Store

_log = logging.getLogger(__name__)
_TICK: tuple[Cadence, ...] = ("tick",)
_ROUND: tuple[Cadence, ...] = ("tick", "round")


class BrokerLoop:
    """Runs the broker's pass plan until stopped: dispatch every ``dispatch_ms``, the other steps
    every ``other_ms``, maintenance every ``maintenance_ms`` (on a second thread).

    Args:
        store: the store.
        dispatch_ms: pause between ticks (what bounds send-to-pullable latency).
        other_ms: time between rounds of the other steps.
        maintenance_ms: pause between maintenance passes; the first comes one pause after
            :meth:`start`.
        plan: the steps (default the broker's :data:`~engine.broker.plan.PLAN`).
    """

    def __init__(
        self,
        store: Store,
        *,
        dispatch_ms: int = 20,
        other_ms: int = 500,
        maintenance_ms: int = int(DEFAULT_INTERVAL_S * 1000),
        plan: Sequence[Step] = PLAN,
    ) -> None:
        self.store = store
        self.dispatch_ms = dispatch_ms
        self.other_ms = other_ms
        self.maintenance_ms = maintenance_ms
        self.plan = tuple(plan)
        self.passes = 0  # ticks run (run_once calls)
        self.errors = 0  # passes of a step that raised
        self._errors_lock = threading.Lock()  # both threads count errors
        # job -> its pass, made once (schedule and retry keep state between passes)
        self._passes: dict[str, Pass] = {}
        for step in self.plan:
            self._pass_of(step)
        # (job, input table) -> the table's version the job's last pass covered
        self._seen: dict[tuple[str, str], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mq-serve-broker-loop", daemon=True)
        self._slow_thread = threading.Thread(
            target=self._run_slow, name="mq-serve-broker-maintenance", daemon=True
        )

    def start(self) -> BrokerLoop:
        """Start the threads."""
        self._thread.start()
        if any(step.cadence == "slow" for step in self.plan):
            self._slow_thread.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        """Stop after the passes under way."""
        self._stop.set()
        for thread in (self._thread, self._slow_thread):
            if thread.is_alive():
                thread.join(timeout)

    def run_step(self, step: Step) -> None:
        """Run ``step``'s pass; with input tables, only when one of them has a version its job's last
        pass did not cover (the versions are read before the pass, so a commit during it is seen
        next time). A pass that raises is logged and counted in :attr:`errors`."""
        tables = step.inputs(self.store)
        latest = {t: self.store.latest_version_hint(t, self._seen.get((step.job, t), -1)) for t in tables}
        if tables and all(v <= self._seen.get((step.job, t), -1) for t, v in latest.items()):
            return
        try:
            self._pass_of(step)()
        except Exception as exc:
            with self._errors_lock:
                self.errors += 1
            _log.warning("broker loop: %s failed: %s", step.job, exc)
            return
        for t, v in latest.items():
            self._seen[(step.job, t)] = v

    def run_once(self, *, everything: bool = True) -> None:
        """One tick: dispatch, and (``everything``) the plan's other steps of every round, in plan
        order (so dispatch runs again after schedule and retry and what they re-put is pullable)."""
        self._run_steps(_ROUND if everything else _TICK)
        self.passes += 1

    def run_slow(self) -> None:
        """One pass of the plan's slow steps (maintenance)."""
        self._run_steps(("slow",))

    def _run_steps(self, cadences: Sequence[Cadence]) -> None:
        for step in self.plan:
            if step.cadence in cadences:
                self.run_step(step)

    def _pass_of(self, step: Step) -> Pass:
        run = self._passes.get(step.job)
        if run is None:
            run = self._passes[step.job] = step.make_pass(self.store)
        return run

    def _run(self) -> None:
        next_other = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            everything = now >= next_other
            if everything:
                next_other = now + self.other_ms / 1000
            self.run_once(everything=everything)
            self._stop.wait(self.dispatch_ms / 1000)

    def _run_slow(self) -> None:
        while not self._stop.wait(self.maintenance_ms / 1000):
            self.run_slow()


# What the child ignores: the server's life is its life (BrokerProcess).
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
# A child that lived this long before it died is restarted after the first pause again.
_STEADY_S = 60.0
# A child that died sooner than this after its start likely never ran a pass (the hint says why).
_EARLY_S = 10.0
# How much lower than the server's the broker process's CPU priority is (BrokerProcess).
BROKER_NICENESS = 10

SERVE_DISPATCH_MS = 40
"""The pause between the dispatch ticks of ``mq serve``'s broker passes (twice
:class:`BrokerLoop`'s default). A tick costs about the same whatever number of new commit-log
versions it finds, and under synchronous wire clients the server commits every few milliseconds:
with 4 client threads (the RocketMQ Java client, 4,000 sends, 3 pairs run in alternation) the
broker process spent 1.2-1.4 s of CPU at 40 ms against 1.9-2.1 s at 20 ms, and the server answered
653-760 sends/s against 577-636, p50 4.5-5.3 ms against 5.2-6.0. What the pause delays is the
consume queue, not the door's pulls: a pull reads the commit-log versions dispatch has not covered
yet (the queue tail of :class:`~engine.store.consume_queue.QueueIndex`), and a wire send wakes the
pulls parked on its queue as it lands."""


class BrokerProcess:
    """A :class:`BrokerLoop` in a process of its own (``spawn``), with :class:`BrokerLoop`'s
    ``start``/``stop``: the broker's passes (dispatch, index, schedule …) then take no time from the
    serving process's interpreter lock, so requests and passes do not wait for each other. The child
    opens the same store (root, storage options, config).

    Its life is the server's: it ignores SIGINT and SIGTERM (a Ctrl-C or a stop of the process
    group reaches the server, which stops it after the passes under way) and leaves on its own when
    the server's end of their pipe closes (the server died). A child that dies while the server
    runs (killed, out of memory, a store it cannot open) is logged with its exit code and started
    again after a pause, doubled at every death in a row up to ``max_restart_s`` (a child that ran
    :data:`_STEADY_S` resets it): without it nothing would be dispatched and every consumer would
    stall at the queue ends of its death.

    The child runs at a lower CPU priority than the server (``niceness`` added to its nice value,
    as ``nice -n``): where the cores are all busy, the broker's passes yield to the requests
    instead of taking turns with them. Its work is the same and is done in the cores' idle moments;
    measured on two cores under the Java client's load (``mq serve``, 6 pairs in turn, medians):
    nice 10 against 0 took the sync send p50 from 6.19 to 5.59 ms, sync sends from 529 to 595/s,
    batches from 7,505 to 8,713 msg/s and the push consumer (which waits for dispatch) from 19.3k
    to 21.4k msg/s.

    Args:
        store: the store (its root, storage options and config go to the child).
        dispatch_ms: as :class:`BrokerLoop`.
        restart_s: the first pause before a dead child is started again.
        max_restart_s: the longest pause.
        niceness: added to the child's nice value (0: the server's priority; at most 19 in all).
    """

    def __init__(
        self,
        store: Store,
        *,
        dispatch_ms: int = 20,
        restart_s: float = 1.0,
        max_restart_s: float = 30.0,
        niceness: int = BROKER_NICENESS,
    ) -> None:
        if isinstance(niceness, bool) or not isinstance(niceness, int) or not 0 <= niceness <= 19:
            raise InvalidArgumentError(
                f"niceness must be an int in 0..19, got {niceness!r}", niceness=niceness
            )
        self._context = multiprocessing.get_context("spawn")  # delta-rs does not survive fork()
        self.dispatch_ms = dispatch_ms
        self._args = (store.root, store.storage_options, store.config, dispatch_ms, niceness)
        self.restart_s = restart_s
        self.max_restart_s = max_restart_s
        self.restarts = 0  # children started again after a death
        self._process: Any = None
        self._stopper: Any = None
        # The files this process writes, fed to the child (a local store only): its passes read
        # every new commit-log version, which this process has just written.
        self._local = local_path(store.root) is not None
        self._feed: FileFeed | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # the watch's restart against stop()
        self._watch = threading.Thread(target=self._watch_child, name="mq-serve-broker-watch", daemon=True)

    def start(self) -> BrokerProcess:
        """Start the process, and the thread that starts it again should it die."""
        self._launch()
        self._watch.start()
        return self

    def _launch(self) -> None:
        until, stopper = self._context.Pipe(duplex=False)
        if self._feed is not None:
            self._feed.close()
        self._feed, files = feed_pair() if self._local else (None, None)
        process = self._context.Process(
            target=_serve_loop, args=(*self._args, until, files), name="mq-serve-broker-loop", daemon=True
        )
        # Started with SIGINT and SIGTERM blocked, a mask the child keeps: a Ctrl-C that reaches
        # the process group while the child still imports (before it ignores them) does not end
        # it with a traceback; the server stops it (a child started with Python's default
        # handler printed a KeyboardInterrupt traceback when Ctrl-C came in its first second).
        # Multiprocessing's resource tracker is started first: starting it unblocks both.
        resource_tracker.ensure_running()
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        until.close()  # the child's end: its EOF is ours to give
        if files is not None:
            files.close()
        self._process, self._stopper = process, stopper

    def _watch_child(self) -> None:
        pause = self.restart_s
        while True:
            process, began = self._process, time.monotonic()
            multiprocessing.connection.wait([process.sentinel])
            # Its end of the sentinel closes as it exits, a moment before it can be reaped: wait
            # for that, or its exit code reads None (a child killed at once was logged so).
            process.join(5)
            if self._stopping.is_set():
                return
            lived = time.monotonic() - began
            if lived >= _STEADY_S:
                pause = self.restart_s
            hint = (
                " (see its error above; a script that starts the server must do so under "
                '`if __name__ == "__main__":`, since the broker\'s process is spawned and imports it)'
                if lived < _EARLY_S
                else ""
            )
            _log.warning(
                "the broker loop's process %s exited with code %s after %.0f s%s; starting it again in %g s",
                process.pid, process.exitcode, lived, hint, pause,
            )  # fmt: skip
            if self._stopping.wait(pause):
                return
            pause = min(pause * 2, self.max_restart_s)
            with self._lock:
                if self._stopping.is_set():
                    return
                self._stopper.close()
                self._launch()
                self.restarts += 1

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def pid(self) -> int | None:
        """The running child's process id once started."""
        return None if self._process is None else self._process.pid

    def stop(self, timeout: float = 30) -> None:
        """Stop after the passes under way (killed if it does not end within ``timeout``)."""
        self._stopping.set()
        with self._lock:
            process, stopper = self._process, self._stopper
        if process is None:
            return
        stopper.close()
        if self._feed is not None:
            self._feed.close()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join(5)
        if self._watch.is_alive():
            self._watch.join(5)


def _serve_loop(
    root: str,
    storage_options: dict[str, str] | None,
    config: EngineConfig,
    dispatch_ms: int,
    niceness: int,
    until: Any,
    files: Any = None,
) -> None:
    """The child of :class:`BrokerProcess`: the loop until the server's end of ``until`` closes,
    taking the files the server writes from ``files`` (a file feed's socket) meanwhile, at
    ``niceness`` below the server's priority."""
    for ignored in _STOP_SIGNALS:
        signal.signal(ignored, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # blocked at the start (_launch)
    if niceness:
        with contextlib.suppress(OSError):  # never refused upwards; best effort all the same
            os.nice(niceness)
    store = Store.open(root, storage_options=storage_options, config=config)
    intake = None if files is None else FileIntake(files)
    loop = BrokerLoop(store, dispatch_ms=dispatch_ms).start()
    tune_for_serving()  # a process of its own: its collector is the broker's
    try:
        until.poll(None)  # returns at EOF: stopped, or the server is gone
    finally:
        loop.stop()
        if intake is not None:
            intake.close()
