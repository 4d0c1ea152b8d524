"""The push consumer's pool of consume threads (RocketMQ's ``consumeExecutor``).

Between ``min_threads`` and ``max_threads`` daemon threads run the tasks submitted, in the order
they become due (a task may be submitted to run after a delay: an orderly queue's pause). A thread
is added when a task arrives and more tasks wait than threads are idle, up to ``max_threads``; one above
``min_threads`` idle for ``keep_alive_s`` ends. RocketMQ's ``ThreadPoolExecutor`` has an unbounded
queue, so it never grows past ``consumeThreadMin``; here it does, up to the max (both default to 20,
so by default the two behave alike).

The threads are daemons, so a listener that never returns neither stops the process from exiting
nor makes :meth:`ConsumePool.shutdown` wait: it keeps its thread until it returns.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

_log = logging.getLogger(__name__)

Task = Callable[[], None]


class ConsumePool:
    """Threads running submitted tasks; thread-safe.

    Args:
        name: the threads' name prefix.
        min_threads: threads kept however idle (created as tasks arrive).
        max_threads: the most threads at once (listener calls at once).
        keep_alive_s: how long a thread above ``min_threads`` waits for work before it ends.
    """

    def __init__(self, name: str, min_threads: int, max_threads: int, keep_alive_s: float = 60.0) -> None:
        self._name = name
        self._min = min_threads
        self._max = max_threads
        self._keep_alive_s = keep_alive_s
        self._cond = threading.Condition(threading.Lock())
        self._tasks: list[tuple[float, int, Task]] = []  # (due, order, task), a heap
        self._order = itertools.count()
        self._threads = 0
        self._busy = 0
        self._peak_busy = 0
        self._closed = False
        self._names = itertools.count()

    @property
    def threads(self) -> int:
        """Threads alive now."""
        with self._cond:
            return self._threads

    @property
    def busy(self) -> int:
        """Threads running a task now."""
        with self._cond:
            return self._busy

    @property
    def peak_busy(self) -> int:
        """The most threads ever running a task at once."""
        with self._cond:
            return self._peak_busy

    def submit(self, task: Task, delay_s: float = 0.0) -> None:
        """Run ``task`` on a pool thread, ``delay_s`` seconds from now at the earliest; after
        :meth:`shutdown` it is dropped."""
        with self._cond:
            if self._closed:
                return
            heapq.heappush(self._tasks, (time.monotonic() + max(0.0, delay_s), next(self._order), task))
            idle = self._threads - self._busy
            if self._threads < self._max and (len(self._tasks) > idle or self._threads < self._min):
                self._threads += 1
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{next(self._names)}", daemon=True
                )
                thread.start()
            self._cond.notify()

    def shutdown(self) -> None:
        """Run nothing more: tasks not started are dropped, idle threads end, a running task keeps
        its thread until it returns. Does not wait."""
        with self._cond:
            self._closed = True
            self._tasks.clear()
            self._cond.notify_all()

    def _next(self) -> Task | None:
        """The next due task (None: this thread ends), counted busy."""
        with self._cond:
            idle_since = time.monotonic()
            while not self._closed:
                now = time.monotonic()
                if self._tasks and self._tasks[0][0] <= now:
                    task = heapq.heappop(self._tasks)[2]
                    self._busy += 1
                    self._peak_busy = max(self._peak_busy, self._busy)
                    if self._tasks:
                        self._cond.notify()  # another may be due: a waiting thread takes it
                    return task
                if not self._tasks and self._threads > self._min and now - idle_since >= self._keep_alive_s:
                    break
                timeout = self._tasks[0][0] - now if self._tasks else self._keep_alive_s
                self._cond.wait(timeout)
            self._threads -= 1
            return None

    def _work(self) -> None:
        while (task := self._next()) is not None:
            try:
                task()
            except Exception:  # a task's own failure is logged; the thread goes on
                _log.exception("consume pool %s: a task failed", self._name)
            finally:
                with self._cond:
                    self._busy -= 1
