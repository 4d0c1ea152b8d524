"""Futures of the engine's worker threads, awaited on an event loop with one wake-up per burst.

``asyncio.wrap_future`` wakes the loop once per future (a write to its self-pipe from the worker
thread, and a hand-over of the GIL each way). A group commit resolves several sends' futures one
after another, so the loop was woken once per send while the commit thread wanted the GIL back for
its next commit. :class:`Landings` gathers the futures that finish while a wake-up is pending and
hands them all to the loop in that one call.

Unlike ``wrap_future``, cancelling the awaiting side does not cancel the worker's future: a send
queued for a commit is committed (or not) whatever became of its waiter.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_Landed = tuple["asyncio.Future[Any]", "Future[Any]"]


class Landings:
    """Brings finished worker futures onto their waiters' event loops, in bursts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[asyncio.AbstractEventLoop, list[_Landed]] = {}

    def wait(self, future: Future[T]) -> asyncio.Future[T]:
        """An awaitable of the running loop that takes ``future``'s outcome once it has one.

        Raises:
            RuntimeError: no event loop is running in this thread.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()
        future.add_done_callback(lambda done: self._landed(loop, waiter, done))
        return waiter

    def _landed(
        self, loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[Any], done: Future[Any]
    ) -> None:
        with self._lock:
            ready = self._ready.get(loop)
            if ready is not None:  # a wake-up is pending: it takes this one too
                ready.append((waiter, done))
                return
            self._ready[loop] = [(waiter, done)]
        try:
            loop.call_soon_threadsafe(self._deliver, loop)
        except RuntimeError:  # the loop is closed: nobody waits any more
            with self._lock:
                self._ready.pop(loop, None)

    def _deliver(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            ready = self._ready.pop(loop, [])
        for waiter, done in ready:
            if waiter.done():  # its handler was cancelled meanwhile
                continue
            if done.cancelled():
                waiter.cancel()
                continue
            error = done.exception()
            if error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(done.result())
