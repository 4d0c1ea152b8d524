"""Landings: worker futures awaited on an event loop, one wake-up for those that finish together."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import pytest

from engine.errors import StoreError
from engine.remoting.landing import Landings


def _counting_wakeups(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    return calls


def test_futures_that_finish_together_wake_the_loop_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        landings = Landings()
        wakeups = _counting_wakeups(asyncio.get_running_loop(), monkeypatch)
        futures: list[Future[int]] = [Future() for _ in range(5)]
        waiters = [landings.wait(f) for f in futures]
        finished = threading.Event()

        def commit() -> None:  # a group commit resolving its sends one after another
            for i, f in enumerate(futures):
                f.set_result(i)
            finished.set()

        threading.Thread(target=commit).start()
        assert finished.wait(10)  # the loop is held here: no wake-up is taken before all finished
        assert await asyncio.gather(*waiters) == [0, 1, 2, 3, 4]
        assert len(wakeups) == 1

        later: Future[int] = Future()
        waiter = landings.wait(later)
        threading.Thread(target=later.set_result, args=(7,)).start()
        assert await waiter == 7
        assert len(wakeups) == 2  # the next burst wakes it again

    asyncio.run(main())


def test_errors_cancellations_and_finished_futures_are_handed_on() -> None:
    async def main() -> None:
        landings = Landings()
        failed: Future[int] = Future()
        cancelled: Future[int] = Future()
        done: Future[int] = Future()
        done.set_result(3)
        waiters = [landings.wait(f) for f in (failed, cancelled, done)]
        failed.set_exception(StoreError("the commit failed"))
        assert cancelled.cancel()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert isinstance(results[0], StoreError) and "the commit failed" in str(results[0])
        assert isinstance(results[1], asyncio.CancelledError)
        assert results[2] == 3

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_the_worker_future_alone() -> None:
    # The send stays queued for its commit: the worker still resolves its future, without an error.
    async def main() -> Future[str]:
        landings = Landings()
        source: Future[str] = Future()
        task = asyncio.ensure_future(landings.wait(source))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not source.cancelled()
        source.set_result("stored")
        await asyncio.sleep(0.05)  # the delivery finds the waiter cancelled and skips it
        return source

    assert asyncio.run(main()).result() == "stored"


def test_a_future_that_finishes_after_its_loop_closed_is_dropped() -> None:
    landings = Landings()
    source: Future[int] = Future()

    async def main() -> None:
        landings.wait(source)

    asyncio.run(main())
    source.set_result(1)  # no loop to wake: nothing raises in the worker
