"""AsyncCommits, alone: what one worker commits together, and what each queued send is told."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from engine.client.async_commits import AsyncCommits, Outcome
from engine.client.sending import PreparedSend
from engine.errors import InvalidArgumentError, StoreError
from engine.model import SendResult, SendStatus
from engine.store.commit_log import PendingMessage


def send(n: int, size: int = 1) -> PreparedSend:
    return PreparedSend(PendingMessage("T", 0, b"x" * size, f"u{n}"))


def result(p: PreparedSend) -> SendResult:
    return SendResult(SendStatus.SEND_OK, p.pending.uniq_key, p.pending.uniq_key, "T", 0, 0, 0)


class Recorder:
    """A commit that records the groups it was given, and can be held or fail."""

    def __init__(self) -> None:
        self.commits: list[list[list[str]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail: StoreError | None = None

    def __call__(self, groups: Sequence[Sequence[PreparedSend]]) -> list[Outcome]:
        self.gate.wait(10)
        self.commits.append([[p.pending.uniq_key for p in g] for g in groups])
        if self.fail is not None:
            return [self.fail] * len(groups)
        return [[result(p) for p in g] for g in groups]


def commits(recorder: Recorder, **kwargs: int) -> AsyncCommits:
    options = {"linger_ms": 200, "batch_size": 100, "regroup_ms": 0, "max_bytes": 1 << 20, **kwargs}
    return AsyncCommits(recorder, **options)


def test_sends_queued_while_a_commit_runs_go_together_into_the_next_one_within_batch_size() -> None:
    recorder = Recorder()
    worker = commits(recorder, linger_ms=0, batch_size=3)
    recorder.gate.clear()  # the first commit is held while the others queue
    first = worker.put((send(0),), single=True)
    rest = [worker.put((send(n),), single=True) for n in range(1, 6)]
    recorder.gate.set()
    assert first.result(10).msg_id == "u0"
    assert [f.result(10).msg_id for f in rest] == ["u1", "u2", "u3", "u4", "u5"]
    worker.flush(10)
    sizes = [sum(len(g) for g in c) for c in recorder.commits]
    assert sum(sizes) == 6 and max(sizes) <= 3 and len(sizes) <= 3  # 1, then groups of up to 3
    worker.stop()


def test_a_batch_stays_whole_and_resolves_to_its_results_in_order() -> None:
    recorder = Recorder()
    worker = commits(recorder, linger_ms=50, batch_size=2)
    batch = worker.put((send(0), send(1), send(2)), single=False)  # more than batch_size: alone, whole
    assert [r.msg_id for r in batch.result(10)] == ["u0", "u1", "u2"]
    assert recorder.commits == [[["u0", "u1", "u2"]]]
    worker.stop()


def test_bodies_past_max_bytes_wait_for_the_next_commit() -> None:
    recorder = Recorder()
    worker = commits(recorder, linger_ms=0, max_bytes=250)
    recorder.gate.clear()
    futures = [worker.put((send(n, 100),), single=True) for n in range(5)]
    recorder.gate.set()
    assert [f.result(10).msg_id for f in futures] == [f"u{n}" for n in range(5)]
    assert all(sum(len(g) for g in c) <= 2 for c in recorder.commits)  # 100 + 100 <= 250 < 300
    worker.stop()


def test_a_failed_commit_fails_every_future_of_it_and_a_cancelled_one_does_not_stop_the_others() -> None:
    recorder = Recorder()
    recorder.fail = StoreError("disk gone")
    worker = commits(recorder, linger_ms=0)
    recorder.gate.clear()
    futures = [worker.put((send(n),), single=True) for n in range(3)]
    futures[1].cancel()
    recorder.gate.set()
    for n in (0, 2):
        with pytest.raises(StoreError, match="disk gone"):
            futures[n].result(10)
    worker.flush(10)
    worker.stop()


def test_flush_waits_for_the_commit_or_times_out_and_refuses_a_bad_timeout() -> None:
    recorder = Recorder()
    worker = commits(recorder, linger_ms=0)
    recorder.gate.clear()
    future = worker.put((send(0),), single=True)
    with pytest.raises(TimeoutError, match="1 async sends still in flight"):
        worker.flush(0.2)
    with pytest.raises(InvalidArgumentError):
        worker.flush(-1)
    recorder.gate.set()
    worker.flush(10)
    assert future.done()
    worker.stop()


def test_stop_commits_what_is_queued_and_ends_the_worker() -> None:
    recorder = Recorder()
    worker = commits(recorder, linger_ms=1000)  # lingers: only the stop ends the wait
    future = worker.put((send(0),), single=True)
    before = {t.name for t in threading.enumerate()}
    assert "mq-producer" in before
    worker.stop()
    assert future.result(0).msg_id == "u0"
    assert all(t.name != "mq-producer" or not t.is_alive() for t in threading.enumerate())
