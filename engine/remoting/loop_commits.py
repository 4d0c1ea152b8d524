"""Group commits made on the event loop's own thread, for a store on a local disk.

A send of a RocketMQ client is acknowledged once the commit that holds it lands. Through the
producer's async worker (a thread) every commit cost two hand-overs of the interpreter lock and a
wake-up of the loop, and the loop and the commit thread took the lock from each other all the way
through: profiled in ``mq serve``, a 4-send commit took about twice its time alone, and the loop's
socket writes waited for the commit thread's turn. On a local disk a commit is a millisecond or
two of work with little waiting in it, so :class:`LoopCommits` makes it where the sends arrive: the
sends that reached the loop meanwhile are committed together in one call on the loop, and their
handlers resume with the results. The loop answers nothing else during that call, as a single
threaded server does; requests wait in their sockets meanwhile. That includes a wait for the host
lock (:mod:`engine.store.delta.hostlock`): a writer of another process on the host holding it (a
producer for a commit, a compaction for its refresh and commit) holds the loop up as long, so the
door's producer queues for it at most :data:`LOOP_LOCK_WAIT_S` and then commits without it; a
stopped holder holds the loop up that long once, and then not until it lets go. On object storage
a commit waits for round trips, so the doors keep the worker thread there (and with
``SYNC_FLUSH``, whose fsyncs wait on the disk).

Grouping follows the async worker's (:data:`~engine.client.producer.DOOR_REGROUP_MS`): a commit is
made as soon as as many sends are waiting as the fullest of the last :data:`REGROUP_COMMITS` commits
held (its clients' next sends), or ``regroup_ms`` after the first one arrived, whichever comes first;
at most ``batch_size`` messages and ``max_batch_bytes`` of bodies go into one commit, the rest into the
next. The worker counts the sends that arrived during its commit as well; on the loop they are still
in their sockets then, and waiting only for as many as the last commit held let a synchronous
client's threads fall into two halves taking turns, each commit holding half of them (profiled in
``mq serve`` with 4 client threads: 2 sends in most commits, 4 in a third of them).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from engine.client.async_commits import Commit
from engine.client.sending import PreparedSend, bodies_bytes
from engine.errors import MQError
from engine.model import SendResult

# Longest a commit on the loop queues for the host lock before it commits without it (the
# optimistic protocol, still correct): longer than a compaction's commit on a busy table holds it
# (a refresh and a commit, up to a few hundred milliseconds), far below the 10 s other writers wait.
LOOP_LOCK_WAIT_S = 0.5

REGROUP_COMMITS = 8
"""How many of the last commits the next one looks back at for how many sends to wait for: a client
that has fewer threads sending is waited for ``regroup_ms`` at most this many commits."""


class LoopCommits:
    """Sends gathered on one event loop and committed there, together (see the module).

    Args:
        commit: commits groups of prepared sends and returns each group's results or error
            (:meth:`~engine.remoting.wire_producer.WireProducer.commit_groups`).
        regroup_ms: how long the first waiting send waits for the others expected.
        batch_size: at most this many messages per commit.
        max_bytes: at most this many body bytes per commit (a group bigger alone goes alone).
    """

    def __init__(self, commit: Commit, *, regroup_ms: int, batch_size: int, max_bytes: int) -> None:
        self._commit = commit
        self._regroup_s = regroup_ms / 1000
        self._batch_size = batch_size
        self._max_bytes = max_bytes
        self._waiting: list[tuple[Sequence[PreparedSend], asyncio.Future[list[SendResult]]]] = []
        self._held: deque[int] = deque(maxlen=REGROUP_COMMITS)  # sends each of the last commits held
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False
        self.commits = 0  # commits asked of ``commit`` (tests and statistics)

    def submit(self, sends: Sequence[PreparedSend]) -> asyncio.Future[list[SendResult]]:
        """Queue prepared sends (one client send, or a batch that goes into one commit whole) for
        the next commit on the running loop; the future resolves to their results in order, or to
        the error that kept them out of every commit. Call it on the loop's thread only."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[SendResult]] = loop.create_future()
        self._waiting.append((sends, future))
        if self._soon:
            return future
        if len(self._waiting) >= max(self._held, default=0):
            self._commit_soon(loop)
        elif self._timer is None:
            self._timer = loop.call_later(self._regroup_s, self._commit_soon, loop)
        return future

    def _commit_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commit at the loop's next turn: the sends whose requests were read in this turn are
        queued by then."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._soon:
            self._soon = True
            loop.call_soon(self._commit_waiting, loop)

    def _commit_waiting(self, loop: asyncio.AbstractEventLoop) -> None:
        self._soon = False
        taken, count, size = 0, 0, 0
        for sends, _ in self._waiting:
            body = bodies_bytes(sends)
            if taken and (count + len(sends) > self._batch_size or size + body > self._max_bytes):
                break
            taken, count, size = taken + 1, count + len(sends), size + body
        group, self._waiting = self._waiting[:taken], self._waiting[taken:]
        live = [(sends, future) for sends, future in group if not future.cancelled()]
        if live:
            try:
                outcomes = self._commit([sends for sends, _ in live])
            except MQError as exc:  # a closed producer: nothing was stored
                outcomes = [exc] * len(live)
            self.commits += 1
            for (_, future), outcome in zip(live, outcomes, strict=True):
                if future.done():
                    continue
                if isinstance(outcome, MQError):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        if taken:
            self._held.append(taken)
        if self._waiting:  # what did not fit: the next commit, at the next turn
            self._commit_soon(loop)
