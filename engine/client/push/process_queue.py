"""One assigned queue's cache of pulled messages (RocketMQ's ``ProcessQueue``).

The queue's pull thread puts what it pulls here; the consume pool's tasks take batches out of it and
remove them once the listener is done (or once ``consume_timeout`` sent them back). The offset a
commit may record is the smallest offset still cached (RocketMQ's ``removeMessage`` answer), or,
when nothing is cached, the next offset to pull: a commit never passes a message not consumed.

Thread-safe: one lock guards the cache; the pull thread waits on it for room (flow control) and the
consumer waits on it for the listener calls to end (drain).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.model import MessageExt
from engine.protocol.rebalance import MessageQueue
from engine.protocol.selectors import MessageSelector

# Called under a queue's lock with the messages of a call that ended (or expired); returns those that
# leave the queue (it records their NACKs first).
Settle = Callable[[list[MessageExt]], list[MessageExt]]


@dataclass(frozen=True)
class ProcessQueueInfo:
    """A snapshot of one queue's process queue (RocketMQ's ``ProcessQueueInfo``, as the console
    shows it in a consumer's running info).

    Attributes:
        cached_msg_count: messages pulled and not yet consumed (in a listener or waiting for one).
        cached_msg_bytes: their body bytes (RocketMQ counts bodies the same way).
        cached_min_offset, cached_max_offset: the smallest and largest cached offsets (-1: none).
        in_flight: messages inside a listener call now.
        flow_control_times: how many times pulling this queue paused for the cache bounds.
        next_pull_offset: where the next pull starts.
        consumed_offset: what a commit records now (every message before it is consumed).
        committed_offset: what was last committed (None: nothing yet).
        dropped: the queue was taken away (rebalance, reset or shutdown).
    """

    cached_msg_count: int
    cached_msg_bytes: int
    cached_min_offset: int
    cached_max_offset: int
    in_flight: int
    flow_control_times: int
    next_pull_offset: int
    consumed_offset: int
    committed_offset: int | None
    dropped: bool


class ProcessQueue:
    """An assigned queue: its cached messages and offsets (RocketMQ's ``ProcessQueue``).

    Args:
        mq: the queue.
        expression: its selector (or a tag expression).
        offset: where pulling starts.
        committed: the group's committed offset of the queue (None: none yet).
    """

    def __init__(
        self, mq: MessageQueue, expression: MessageSelector | str, offset: int, committed: int | None
    ) -> None:
        self.mq = mq
        self._expression = expression
        self._committed = committed
        self._cond = threading.Condition(threading.Lock())
        self._next_pull = offset
        # Queue offset -> message; filled in increasing offset order, so the first key is the smallest.
        self._cache: dict[int, MessageExt] = {}
        self._bytes = 0
        self._started: dict[int, float] = {}  # offset -> monotonic time its listener call began
        self._calls = 0  # listener calls running now
        self._flow_control_times = 0
        self._dropped = threading.Event()
        self._abandoned = False  # after the final commit: results of calls still running are ignored
        self._orderly_busy = False  # orderly: a consume task owns the queue
        self.attempts: dict[int, int] = {}  # orderly: queue offset -> reconsume times so far
        self.no_match: tuple[int, int] | None = None  # the pull side's last NO_MATCHED_MSG (offset, next)
        self._puller: threading.Thread | None = None

    # ----------------------------------------------------------------- the consumer's side
    @property
    def expression(self) -> MessageSelector | str:
        """The selector the next pull uses."""
        return self._expression

    @property
    def consumed(self) -> int:
        """Every message before this offset is consumed (or sent back): what a commit may record.
        The smallest cached offset, or the next offset to pull when nothing is cached."""
        with self._cond:
            return next(iter(self._cache), self._next_pull)

    @property
    def committed(self) -> int | None:
        """The offset last committed for this queue (None: none yet)."""
        return self._committed

    @property
    def dropped(self) -> bool:
        """True once the queue was taken away: its pull thread stops, its waiting batches are not
        consumed and the results of its listener calls still running are ignored."""
        return self._dropped.is_set()

    def reselect(self, expression: MessageSelector | str) -> None:
        """Use a new selector from the next pull on."""
        self._expression = expression

    def mark_committed(self, offset: int) -> None:
        """Record that ``offset`` was committed for this queue."""
        self._committed = offset

    def info(self) -> ProcessQueueInfo:
        """A snapshot of the cache and offsets."""
        with self._cond:
            keys = list(self._cache)
            return ProcessQueueInfo(
                cached_msg_count=len(keys),
                cached_msg_bytes=self._bytes,
                cached_min_offset=keys[0] if keys else -1,
                cached_max_offset=keys[-1] if keys else -1,
                in_flight=len(self._started),
                flow_control_times=self._flow_control_times,
                next_pull_offset=self._next_pull,
                consumed_offset=keys[0] if keys else self._next_pull,
                committed_offset=self._committed,
                dropped=self._dropped.is_set(),
            )

    def start(self, target: Callable[[], None], name: str) -> None:
        """Start the queue's pull thread (once); ``target`` is its loop."""
        self._puller = threading.Thread(target=target, name=name, daemon=True)
        self._puller.start()

    def drop(self) -> None:
        """Take the queue away: the pull thread stops and no listener call on it starts; those
        running are still settled (their messages leave the cache) until :meth:`abandon`."""
        with self._cond:
            self._dropped.set()
            self._cond.notify_all()

    def abandon(self) -> None:
        """After the queue's last commit: what its listener calls still running answer is ignored
        (no NACK, nothing removed), so nothing happens behind the committed offset; those messages
        come again from it to whoever consumes the queue next."""
        with self._cond:
            self._dropped.set()
            self._abandoned = True
            self._cond.notify_all()

    def join_puller(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the pull thread to end (it does within a long poll
        once the queue is dropped); True when it has, or never ran."""
        puller = self._puller
        if puller is not None and puller is not threading.current_thread():
            puller.join(timeout=timeout)
        return puller is None or not puller.is_alive()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every listener call on this queue to return; True
        when none runs."""
        with self._cond:
            return self._cond.wait_for(lambda: self._calls == 0, timeout)

    # ----------------------------------------------------------------- the pull side
    @property
    def next_pull(self) -> int:
        """Where the next pull starts."""
        return self._next_pull

    def has_room(self, max_count: int, max_bytes: int, max_span: int | None) -> bool:
        """False when the cache is over a bound (RocketMQ's flow control: more than ``max_count``
        messages, more than ``max_bytes`` body bytes, or, when ``max_span`` is given, a spread of
        offsets wider than it); each False counts in :attr:`ProcessQueueInfo.flow_control_times`."""
        with self._cond:
            count = len(self._cache)
            span = next(reversed(self._cache)) - next(iter(self._cache)) if count else 0
            if count > max_count or self._bytes > max_bytes or (max_span is not None and span > max_span):
                self._flow_control_times += 1
                return False
            return True

    def pause(self, timeout: float) -> None:
        """Wait until a message leaves the cache, the queue is dropped, or ``timeout`` seconds pass."""
        with self._cond:
            if not self._dropped.is_set():
                self._cond.wait(timeout)

    def put(self, messages: list[MessageExt]) -> None:
        """Cache pulled messages (in queue order, after every cached one); the next pull starts
        after the last."""
        with self._cond:
            for m in messages:
                if m.queue_offset not in self._cache:
                    self._cache[m.queue_offset] = m
                    self._bytes += len(m.body)
            if messages:
                self._next_pull = max(self._next_pull, messages[-1].queue_offset + 1)

    def skip_to(self, offset: int) -> None:
        """Pull from ``offset`` next (the pull said the entries before it are filtered out or
        illegal)."""
        with self._cond:
            self._next_pull = offset

    # ----------------------------------------------------------------- the consume side
    def head(self, size: int) -> list[MessageExt]:
        """The first ``size`` cached messages (orderly: the next batch, in queue order). When none
        is cached the orderly task gives the queue up (:meth:`claim_orderly` hands it out again)."""
        with self._cond:
            batch = [m for _, m in zip(range(size), self._cache.values(), strict=False)]
            if not batch:
                self._orderly_busy = False
            return batch

    def claim_orderly(self) -> bool:
        """True when the caller is to start the queue's orderly consume task: something is cached and
        no task owns the queue (atomic with :meth:`head` giving it up, so no batch is left behind)."""
        with self._cond:
            if self._orderly_busy or not self._cache or self._dropped.is_set():
                return False
            self._orderly_busy = True
            return True

    def release_orderly(self) -> None:
        """The orderly task stops owning the queue (dropped, or its consumer stopping)."""
        with self._cond:
            self._orderly_busy = False

    def begin(self, messages: list[MessageExt]) -> list[MessageExt]:
        """A listener call is about to take ``messages``: those still cached, with their start time
        recorded for ``consume_timeout`` (none once the queue is dropped)."""
        with self._cond:
            if self._dropped.is_set():
                return []
            live = [m for m in messages if m.queue_offset in self._cache]
            if live:
                now = time.monotonic()
                for m in live:
                    self._started[m.queue_offset] = now
                self._calls += 1
            return live

    def end(self, messages: list[MessageExt], settle: Settle) -> list[MessageExt]:
        """A listener call that took ``messages`` returned: ``settle(still_cached)`` runs under the
        queue's lock (records NACKs; returns the messages to remove), then those leave the cache.
        Messages sent back meanwhile (``consume_timeout``) are not passed again; once the queue is
        abandoned nothing is settled (its messages come again from the committed offset). Returns
        the messages removed."""
        with self._cond:
            self._calls -= 1
            for m in messages:
                self._started.pop(m.queue_offset, None)
            live = [m for m in messages if m.queue_offset in self._cache]
            removed: list[MessageExt] = []
            if live and not self._abandoned:
                removed = settle(live)
                self._remove(removed)
            self._cond.notify_all()
            return removed

    def expire(self, timeout_s: float, settle: Settle) -> list[MessageExt]:
        """Messages inside a listener call for longer than ``timeout_s`` seconds: ``settle(expired)``
        runs under the lock (sends them back), then they leave the cache, so the offset moves past
        them (RocketMQ's ``cleanExpireMsg``). Returns them."""
        with self._cond:
            if self._abandoned:
                return []
            limit = time.monotonic() - timeout_s
            expired = [self._cache[o] for o, t in self._started.items() if t <= limit and o in self._cache]
            if not expired:
                return []
            expired.sort(key=lambda m: m.queue_offset)
            settle(expired)
            for m in expired:
                self._started.pop(m.queue_offset, None)
            self._remove(expired)
            self._cond.notify_all()
            return expired

    def _remove(self, messages: list[MessageExt]) -> None:
        for m in messages:
            gone = self._cache.pop(m.queue_offset, None)
            if gone is not None:
                self._bytes -= len(gone.body)
