"""A producer's async group commits: sends queued from any thread, committed together by one worker.

:meth:`~engine.client.producer.Producer.send_async` and the doors' grouped sends queue here; a
worker thread (started on the first send) takes what waits and commits it in one call, as many
sends as ``batch_size`` messages and ``max_bytes`` of bodies allow, waiting up to ``linger_ms`` for
more to come. ``regroup_ms`` lets the next commit wait, beyond ``linger_ms``, for as many sends as
the last one held plus those that arrived during it: a client that sends synchronously from several
threads has each thread's next send arrive just after its commit, and committing whatever waits at
once splits those threads into two halves that take turns, each commit holding half of them.

A batch queued whole (:meth:`AsyncCommits.put` with ``single=False``) is never split across
commits. The event loop's counterpart, for a door that commits where its sends arrive, is
:class:`~engine.remoting.loop_commits.LoopCommits`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from engine.client.sending import PreparedSend, bodies_bytes
from engine.errors import InvalidArgumentError, MQError
from engine.model import SendResult

Outcome = list[SendResult] | MQError
Commit = Callable[[Sequence[Sequence[PreparedSend]]], list[Outcome]]


@dataclass(frozen=True)
class _Queued:
    """What the worker commits: one send (``single``: its future is the send's result) or a batch
    that goes into one commit whole (its future is the list of results)."""

    sends: tuple[PreparedSend, ...]
    future: Future[Any]
    single: bool

    def body_bytes(self) -> int:
        return bodies_bytes(self.sends)


def _settle(future: Future[Any], result: Any = None, *, error: BaseException | None = None) -> None:
    """Resolve the future of a queued send, unless it is resolved already or its waiter cancelled it
    (a door whose client hung up): the send is in the commit, or in none, all the same, and the
    other sends of the commit are still told how theirs went."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class AsyncCommits:
    """Sends queued for group commits by one worker thread (see the module).

    Args:
        commit: commits groups of prepared sends and returns, for each group, its results or its
            error; it never raises (:meth:`~engine.client.producer.Producer.commit_groups`'s seam).
        linger_ms, batch_size, regroup_ms: how commits are grouped (the producer's arguments).
        max_bytes: at most this many body bytes per commit (a send bigger alone goes alone).
    """

    def __init__(
        self, commit: Commit, *, linger_ms: int, batch_size: int, regroup_ms: int, max_bytes: int
    ) -> None:
        self._commit = commit
        self._linger_s = linger_ms / 1000
        self._regroup_s = regroup_ms / 1000
        self._batch_size = batch_size
        self._max_bytes = max_bytes
        self._queue: queue.Queue[_Queued | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()

    def put(self, sends: tuple[PreparedSend, ...], *, single: bool) -> Future[Any]:
        """Queue checked sends for the next commit: one send (the future resolves to its result) or,
        with ``single`` False, a batch kept whole (the future resolves to its results in order).
        Either resolves to the error of a commit that failed them."""
        future: Future[Any] = Future()
        if self._worker is None:
            with self._worker_lock:
                if self._worker is None:
                    self._worker = threading.Thread(target=self._run, name="mq-producer", daemon=True)
                    self._worker.start()
        self._queue.put(_Queued(sends, future, single))
        return future

    def _run(self) -> None:
        carry: _Queued | None = None
        stop = False
        expected = 0  # queued sends the next group waits for up to regroup_ms (see the module)
        while not stop:
            item = carry if carry is not None else self._queue.get()
            carry = None
            if item is None:
                self._queue.task_done()
                break
            batch = [item]
            count, size = len(item.sends), item.body_bytes()
            began = time.monotonic()
            deadline = began + self._linger_s
            regrouped = max(deadline, began + self._regroup_s)
            while count < self._batch_size:
                timeout = (deadline if len(batch) >= expected else regrouped) - time.monotonic()
                try:
                    nxt = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.task_done()
                    stop = True
                    break
                size += nxt.body_bytes()
                if size > self._max_bytes:  # as send_batch: at most max_batch_bytes of bodies per commit
                    carry = nxt
                    break
                batch.append(nxt)
                count += len(nxt.sends)
            self._commit_batch(batch)
            if self._regroup_s:
                # Those of this commit may send again at once, beside those that came meanwhile.
                expected = len(batch) + self._queue.qsize()

    def _commit_batch(self, batch: list[_Queued]) -> None:
        """Commit a group of queued sends and settle their futures."""
        for item, outcome in zip(batch, self._commit([item.sends for item in batch]), strict=True):
            if isinstance(outcome, MQError):
                _settle(item.future, error=outcome)
            else:
                _settle(item.future, outcome[0] if item.single else outcome)
        self._tasks_done(len(batch))

    def _tasks_done(self, n: int) -> None:
        """``task_done()`` ``n`` times under one lock acquisition (Queue's own counter and condition)."""
        done = self._queue.all_tasks_done
        with done:
            unfinished = self._queue.unfinished_tasks - n
            if unfinished < 0:  # pragma: no cover - as Queue.task_done
                raise ValueError("task_done() called too many times")
            self._queue.unfinished_tasks = unfinished
            if unfinished == 0:
                done.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued send is committed or failed.

        Raises:
            InvalidArgumentError: ``timeout`` is not a number of seconds >= 0.
            TimeoutError: sends are still in flight after ``timeout`` seconds.
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
        ):
            raise InvalidArgumentError(
                f"timeout {timeout!r} must be a number of seconds >= 0", timeout=timeout
            )
        if timeout is None:
            self._queue.join()
            return
        end = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self._queue.unfinished_tasks} async sends still in flight")
                self._queue.all_tasks_done.wait(remaining)

    def stop(self) -> None:
        """Let the worker finish what is queued and end (it is not started again)."""
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=10)
