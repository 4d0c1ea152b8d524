"""What the doors (RocketMQ's, QMQ's) share: the read side of a connection (length-prefixed frames
read in order, each within its time limits, until the peer hangs up or breaks the protocol) and
the event loop on a thread of its own that serves them (:class:`LoopThread`).

Both protocols prefix a frame with its length (int32, big endian, excluding itself); what the
length may be and how the rest decodes is the door's own (``check``, ``decode``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from engine.errors import RemotingProtocolError

F = TypeVar("F")
_log = logging.getLogger(__name__)


class _Watch:
    """The time limits of one connection's reads, kept by one timer: a wait under way since
    :attr:`since` (loop time; None while no read waits) for longer than :attr:`limit` ends the reads
    (the reader is given a TimeoutError). The timer fires at the end of the current wait, or sooner,
    every ``shortest`` limit at most, so a shorter limit set after it was armed is kept to time.

    Two ``asyncio.timeout`` per frame (a timer made and cancelled each) cost about 11 us a frame, as
    much again as the reads themselves; marking the start of a wait costs a clock read.
    """

    __slots__ = ("_handle", "_loop", "_reader", "_shortest", "limit", "since")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, reader: asyncio.StreamReader, shortest: float
    ) -> None:
        self._loop = loop
        self._reader = reader
        self._shortest = shortest
        self.since: float | None = None
        self.limit = shortest
        self._handle = loop.call_at(loop.time() + shortest, self._fire)

    def _fire(self) -> None:
        now = self._loop.time()
        if self.since is not None and now - self.since >= self.limit:
            self._reader.set_exception(TimeoutError())
            return
        end = (
            now + self._shortest if self.since is None else min(self.since + self.limit, now + self._shortest)
        )
        self._handle = self._loop.call_at(end, self._fire)

    def cancel(self) -> None:
        self._handle.cancel()


async def read_frames(
    reader: asyncio.StreamReader,
    check: Callable[[int], int],
    decode: Callable[[bytes], F],
    *,
    idle_timeout_s: float,
    frame_timeout_s: float,
    peer: str = "",
) -> AsyncIterator[F]:
    """Yield a connection's frames until it closes, stays silent ``idle_timeout_s``, leaves a frame
    unfinished for ``frame_timeout_s``, or sends a frame that ``check`` (its length) or ``decode``
    (its bytes) refuses: the caller then closes the connection. Never raises for what a peer sends.
    """
    loop = asyncio.get_running_loop()
    watch = _Watch(loop, reader, min(idle_timeout_s, frame_timeout_s))
    try:
        while True:
            try:
                watch.since, watch.limit = loop.time(), idle_timeout_s
                head = await reader.readexactly(4)
                length = check(int.from_bytes(head, "big", signed=True))
                watch.since, watch.limit = loop.time(), frame_timeout_s
                payload = await reader.readexactly(length)
                watch.since = None
                frame = decode(payload)
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                return
            except RemotingProtocolError as exc:
                _log.info("closing %s: %s", peer, exc)
                return
            except Exception as exc:  # an undecodable frame of a kind not foreseen: drop the peer
                _log.warning("closing %s: unreadable frame: %r", peer, exc)
                return
            yield frame
    finally:
        watch.cancel()


class LoopThread:
    """A door's event loop on a thread of its own, running one coroutine (``main``) that binds its
    servers, calls :meth:`ready`, then waits for :attr:`stopped`.

    :meth:`start` returns once ``main`` is ready, or raises what it failed with (a port that could
    not be bound); :meth:`stop` sets :attr:`stopped` from any thread and waits for the end.
    """

    def __init__(self, name: str, main: Callable[[], Awaitable[None]]) -> None:
        self._name = name
        self._main = main
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.stopped: asyncio.Event | None = None

    def start(self) -> None:
        """Run ``main`` on a new thread; returns once it called :meth:`ready`.

        Raises:
            BaseException: what ``main`` raised before it was ready (OSError: a port in use).
        """
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def ready(self) -> None:
        """Called by ``main`` once its servers are bound."""
        self._ready.set()

    def stop(self, timeout: float | None = None) -> None:
        """Ask ``main`` to end (sets :attr:`stopped`) and wait up to ``timeout`` for its thread."""
        loop, stopped = self._loop, self.stopped
        if loop is not None and stopped is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(stopped.set)
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread's end."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self.stopped = asyncio.Event()
            loop.run_until_complete(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()
            loop.close()
