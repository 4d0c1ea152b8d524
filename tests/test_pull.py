"""PullConsumer: every status and offset correction, tag filters, long polling, offsets."""

from __future__ import annotations

import threading
import time

import pytest

from engine import (
    InvalidArgumentError,
    Message,
    Producer,
    PullConsumer,
    PullResult,
    PullStatus,
    Store,
    TopicNotFoundError,
)
from engine.broker.dispatch import dispatch_pending
from engine.store import schemas
from engine.store.commit_markers import CQ_KEY
from engine.store.consume_queue import QueueIndex, queue_marks
from tests.helpers import versions


def _fill(store: Store, topic: str, n: int, queue_id: int = 0, tags: list[str | None] | None = None) -> None:
    with Producer(store) as p:
        for i in range(n):
            tag = tags[i % len(tags)] if tags else None
            p.send(Message(topic, f"m{i}".encode(), tags=tag), queue_id=queue_id)
    dispatch_pending(store)


def test_found_returns_messages_and_next_offset(store: Store, topic: str) -> None:
    _fill(store, topic, 5)
    r = PullConsumer(store, "g").pull(topic, 0, 1, max_nums=3)
    assert r.status is PullStatus.FOUND
    assert [m.queue_offset for m in r.messages] == [1, 2, 3]
    assert [m.body for m in r.messages] == [b"m1", b"m2", b"m3"]
    assert (r.next_begin_offset, r.min_offset, r.max_offset) == (4, 0, 5)
    m = r.messages[0]
    assert (m.topic, m.queue_id, m.reconsume_times) == (topic, 0, 0)
    assert m.store_ts_ms >= m.born_ts_ms > 0 and len(m.msg_id) == 32


def test_a_message_is_pullable_once_its_commit_lands_and_dispatch_commits_the_same_entries(
    store: Store, topic: str
) -> None:
    consumer = PullConsumer(store, "g")
    with Producer(store) as p:
        p.send(Message(topic, b"x"), queue_id=0)
        before = consumer.pull(topic, 0, 0)  # the consume queue does not cover it yet: the tail does
        assert (before.status, before.next_begin_offset, before.max_offset) == (PullStatus.FOUND, 1, 1)
        assert [m.body for m in before.messages] == [b"x"]
        p.send(Message(topic, b"y"), queue_id=0)
    assert dispatch_pending(store) == 2
    after = PullConsumer(store, "g").pull(topic, 0, 0)  # from the consume queue alone
    assert [m.body for m in after.messages] == [b"x", b"y"]
    assert [(m.msg_id, m.physical_offset, m.queue_offset) for m in after.messages[:1]] == [
        (m.msg_id, m.physical_offset, m.queue_offset) for m in before.messages
    ]
    assert consumer.pull(topic, 0, 1).messages[0].body == b"y"  # the tail gave way to the queue


def test_offset_equal_to_max_is_no_new_msg(store: Store, topic: str) -> None:
    _fill(store, topic, 3)
    r = PullConsumer(store, "g").pull(topic, 0, 3)
    assert (r.status, r.next_begin_offset, r.messages) == (PullStatus.NO_NEW_MSG, 3, [])


def test_pull_past_max_offset_returns_offset_illegal_with_max(store: Store, topic: str) -> None:
    _fill(store, topic, 3)
    r = PullConsumer(store, "g").pull(topic, 0, 10)
    assert (r.status, r.next_begin_offset) == (PullStatus.OFFSET_ILLEGAL, 3)


def test_pull_empty_queue_at_zero_is_no_new_msg(store: Store, topic: str) -> None:
    r = PullConsumer(store, "g").pull(topic, 0, 0)
    assert (r.status, r.next_begin_offset, r.max_offset) == (PullStatus.NO_NEW_MSG, 0, 0)


def test_pull_empty_queue_at_nonzero_is_offset_illegal_to_zero(store: Store, topic: str) -> None:
    r = PullConsumer(store, "g").pull(topic, 0, 7)
    assert (r.status, r.next_begin_offset) == (PullStatus.OFFSET_ILLEGAL, 0)


def test_pull_below_min_offset_returns_offset_illegal_with_min(store: Store, topic: str) -> None:
    _fill(store, topic, 6)
    # What retention does: raise the queue's minimum offset in the consume queue's marks.
    marks = queue_marks(store.snapshot(schemas.CONSUME_QUEUE))
    marks.set_min(topic, 0, 4)
    store.append(
        schemas.CONSUME_QUEUE,
        schemas.CONSUME_QUEUE_SCHEMA.empty_table(),
        custom_metadata={CQ_KEY: marks.to_json()},
    )
    c = PullConsumer(store, "g")
    r = c.pull(topic, 0, 2)
    assert (r.status, r.next_begin_offset, r.min_offset) == (PullStatus.OFFSET_ILLEGAL, 4, 4)
    assert c.pull(topic, 0, 4).status is PullStatus.FOUND


def test_tag_filter_returns_only_matching_messages(store: Store, topic: str) -> None:
    _fill(store, topic, 9, tags=["TagA", "TagB", "TagC"])
    c = PullConsumer(store, "g")
    r = c.pull(topic, 0, 0, expression="TagA || TagC")
    assert [m.tags for m in r.messages] == ["TagA", "TagC"] * 3
    assert r.next_begin_offset == 9
    r = c.pull(topic, 0, 0, max_nums=2, expression="TagB")
    assert [m.queue_offset for m in r.messages] == [1, 4]
    assert r.next_begin_offset == 5


def test_untagged_messages_match_only_star(store: Store, topic: str) -> None:
    _fill(store, topic, 2, tags=[None])
    c = PullConsumer(store, "g")
    assert c.pull(topic, 0, 0, expression="TagA").status is PullStatus.NO_MATCHED_MSG
    assert len(c.pull(topic, 0, 0, expression="*").messages) == 2


def test_everything_filtered_out_is_no_matched_msg_and_advances(store: Store, topic: str) -> None:
    _fill(store, topic, 4, tags=["TagA"])
    r = PullConsumer(store, "g").pull(topic, 0, 1, expression="TagZ")
    assert (r.status, r.next_begin_offset, r.messages) == (PullStatus.NO_MATCHED_MSG, 4, [])


def test_long_polling_returns_early_when_a_message_arrives(store: Store, topic: str) -> None:
    _fill(store, topic, 1)

    def produce_later() -> None:
        time.sleep(0.5)
        _fill(store, topic, 1)

    t = threading.Thread(target=produce_later)
    t.start()
    started = time.monotonic()
    r = PullConsumer(store, "g").pull(topic, 0, 1, suspend_ms=15_000)
    waited = time.monotonic() - started
    t.join()
    assert r.status is PullStatus.FOUND and r.messages[0].queue_offset == 1
    assert waited < 10  # woke on arrival, not at the 15 s deadline


def test_a_parked_pull_wakes_even_when_another_pull_of_its_consumer_loaded_the_new_version(
    store: Store, topic: str
) -> None:
    # One consumer, many parked pulls (the wire server's case): they share one index, and the pull
    # that refreshes it first must not leave the others asleep until their deadline. Once the pull is
    # parked its refreshes wait at a gate while the new version lands, so the test's own refresh is
    # the one that loads it, whatever the machine's timing.
    refreshed = threading.Semaphore(0)
    armed, at_gate, gate = threading.Event(), threading.Event(), threading.Event()
    parked_thread: list[threading.Thread] = []

    class GatedIndex(QueueIndex):
        def refresh(self, *, tail: bool = True) -> bool:
            if threading.current_thread() in parked_thread:
                refreshed.release()
                if armed.is_set():
                    at_gate.set()
                    gate.wait()
            return super().refresh(tail=tail)

    index = GatedIndex(store)
    consumer = PullConsumer(store, "g", index=index)
    got: list[PullResult] = []
    parked = threading.Thread(target=lambda: got.append(consumer.pull(topic, 1, 0, suspend_ms=15_000)))
    parked_thread.append(parked)
    parked.start()
    # the catch-up before the first read, then a refresh of the long poll: the pull is parked
    assert refreshed.acquire(timeout=30) and refreshed.acquire(timeout=30) and not got
    armed.set()
    assert at_gate.wait(30)
    _fill(store, topic, 1, queue_id=1)
    assert index.refresh()  # as another parked pull of the consumer would, before this one
    gate.set()
    parked.join(20)
    # a pull that slept to its deadline would return what it had: NO_NEW_MSG
    assert got and got[0].status is PullStatus.FOUND and got[0].messages[0].queue_id == 1


def test_long_polling_times_out_with_no_new_msg(store: Store, topic: str) -> None:
    started = time.monotonic()
    r = PullConsumer(store, "g").pull(topic, 0, 0, suspend_ms=300)
    assert r.status is PullStatus.NO_NEW_MSG
    assert time.monotonic() - started >= 0.3


def test_long_polling_ignores_non_matching_arrivals(store: Store, topic: str) -> None:
    def produce_later() -> None:
        time.sleep(0.2)
        _fill(store, topic, 1, tags=["Other"])

    t = threading.Thread(target=produce_later)
    t.start()
    r = PullConsumer(store, "g").pull(topic, 0, 0, expression="Wanted", suspend_ms=1500)
    t.join()
    assert r.status is PullStatus.NO_MATCHED_MSG and r.next_begin_offset == 1


def test_commit_and_read_offsets(store: Store, topic: str) -> None:
    c = PullConsumer(store, "g")
    assert c.committed_offset(topic, 0) is None
    c.commit_offset(topic, 0, 5)
    c.commit_offset(topic, 0, 7)
    c.commit_offset(topic, 1, 2)
    assert c.committed_offset(topic, 0) == 7
    assert PullConsumer(store, "g").committed_offset(topic, 1) == 2
    assert PullConsumer(store, "other").committed_offset(topic, 0) is None


def test_commit_offset_moving_backwards_wins_when_latest(store: Store, topic: str) -> None:
    c = PullConsumer(store, "g")
    c.commit_offset(topic, 0, 9)
    c.commit_offset(topic, 0, 3)
    assert c.committed_offset(topic, 0) == 3


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"topic": "Missing", "queue_id": 0, "offset": 0}, TopicNotFoundError),
        ({"topic": "T", "queue_id": 9, "offset": 0}, InvalidArgumentError),
        ({"topic": "T", "queue_id": 0, "offset": "0"}, InvalidArgumentError),
        ({"topic": "T", "queue_id": 0, "offset": 0, "max_nums": 0}, InvalidArgumentError),
        ({"topic": "T", "queue_id": 0, "offset": 0, "max_nums": 5000}, InvalidArgumentError),
        ({"topic": "T", "queue_id": 0, "offset": 0, "suspend_ms": -1}, InvalidArgumentError),
        ({"topic": "T", "queue_id": 0, "offset": 0, "expression": "A ||"}, InvalidArgumentError),
    ],
)
def test_bad_pull_arguments_raise(
    store: Store, topic: str, kwargs: dict[str, object], error: type[Exception]
) -> None:
    before = versions(store)
    with pytest.raises(error):
        PullConsumer(store, "g").pull(**kwargs)  # type: ignore[arg-type]
    assert versions(store) == before


@pytest.mark.parametrize("offset", [-1, True])
def test_bad_commit_offset_raises_and_writes_nothing(store: Store, topic: str, offset: object) -> None:
    before = versions(store)
    with pytest.raises(InvalidArgumentError):
        PullConsumer(store, "g").commit_offset(topic, 0, offset)  # type: ignore[arg-type]
    assert versions(store) == before


@pytest.mark.parametrize("group", ["", "bad group", None])
def test_bad_group_raises(store: Store, group: object) -> None:
    with pytest.raises(InvalidArgumentError):
        PullConsumer(store, group)  # type: ignore[arg-type]


def test_concurrent_dispatchers_on_one_store_never_duplicate_entries(store: Store, topic: str) -> None:
    errors: list[BaseException] = []

    def dispatch_loop() -> None:
        try:
            for _ in range(15):
                dispatch_pending(store)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    with Producer(store) as p:
        threads = [threading.Thread(target=dispatch_loop) for _ in range(2)]
        for t in threads:
            t.start()
        for i in range(40):
            p.send(Message(topic, f"{i}".encode()), queue_id=i % 2)
        for t in threads:
            t.join()
    dispatch_pending(store)
    assert not errors
    rows = store.read(schemas.CONSUME_QUEUE).to_pylist()
    keys = [(r["queue_id"], r["queue_offset"]) for r in rows]
    assert len(keys) == len(set(keys)) == 40
    for qid in (0, 1):
        assert sorted(o for q, o in keys if q == qid) == list(range(20))
