"""Parked pulls: RocketMQ's PullRequestHoldService, on the event loop instead of a thread each.

A long-polling pull that finds nothing new waits here until its queue grows past what it saw or its
suspension ends. Two things wake it:

* a send through this endpoint, once its commit has landed (:meth:`PullHold.arrived`, as the
  broker's reput notifies ``notifyMessageArriving``): the pull answers within the send's own
  round trip, without waiting for dispatch or a poll;
* one watcher (:meth:`PullHold.watch`), which refreshes the queue index once every interval while
  any pull is parked, for messages other processes wrote (Python producers, Spark jobs, the retry
  and schedule passes, another ``mq serve``).

A parked pull costs a future, not a thread: however many clients long-poll, the store is probed
once per interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from engine.store.consume_queue import QueueIndex

_log = logging.getLogger(__name__)

Queue = tuple[str, int]  # (topic, queue id)


@dataclass(eq=False)
class _Parked:
    seen_max: int
    woken: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class PullHold:
    """Pulls parked until their queue grows (see the module docstring). Used on one event loop.

    Args:
        index: the queue index the watcher refreshes and reads queue ends from.
        run: runs a blocking call off the event loop (the endpoint's ``BrokerContext.run``).
        interval_s: how often the watcher probes the store while a pull is parked.
    """

    def __init__(self, index: QueueIndex, run: Callable[..., Awaitable[object]], interval_s: float) -> None:
        self._index = index
        self._run = run
        self.interval_s = interval_s
        self._parked: dict[Queue, list[_Parked]] = {}
        self._any = asyncio.Event()

    @property
    def parked(self) -> int:
        """How many pulls are parked now."""
        return sum(len(waiters) for waiters in self._parked.values())

    async def wait(
        self, topic: str, queue_id: int, seen_max: int, timeout_s: float, *, check: bool = True
    ) -> bool:
        """Park until queue ``(topic, queue_id)`` holds offsets past ``seen_max`` (the queue end the
        pull saw); True when it does, False when ``timeout_s`` ran out first.

        With ``check`` the index is asked first (a message that landed between the pull and its
        parking is not missed); a pull woken for nothing it can read parks again without it, so a
        view of the queue the pull cannot see yet does not wake it over and over.
        """
        if timeout_s <= 0:
            return False
        if check and self._index.bounds(topic, queue_id)[1] > seen_max:
            return True
        parked = _Parked(seen_max)
        key = (topic, queue_id)
        self._parked.setdefault(key, []).append(parked)
        self._any.set()
        try:
            return await asyncio.wait_for(asyncio.shield(parked.woken), timeout_s)
        except TimeoutError:
            return False
        finally:
            waiters = self._parked.get(key)
            if waiters is not None:
                if parked in waiters:
                    waiters.remove(parked)
                if not waiters:
                    del self._parked[key]

    def arrived(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Messages up to ``max_offset`` (exclusive) of the queue are committed: wake the pulls
        parked on it that saw less. Called on the event loop."""
        for parked in self._parked.get((topic, queue_id), ()):
            if max_offset > parked.seen_max and not parked.woken.done():
                parked.woken.set_result(True)

    async def watch(self) -> None:
        """Refresh the index once per interval while pulls are parked and wake those whose queue
        grew; runs until cancelled."""
        while True:
            if not self._parked:
                self._any.clear()
                await self._any.wait()
            await asyncio.sleep(self.interval_s)
            if not self._parked:
                continue
            try:
                changed = await self._run(self._index.refresh)
            except Exception as exc:  # a failed probe: the pulls wait for the next one or time out
                _log.warning("probing the queues for parked pulls failed: %s", exc)
                continue
            if changed:
                for topic, queue_id in list(self._parked):
                    self.arrived(topic, queue_id, self._index.bounds(topic, queue_id)[1])
