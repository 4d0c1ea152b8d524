"""PushConsumer behaviour as RocketMQ's clients have it: live offset resets, orderly retry in place,
the reconsume limit's defaults, the next delay level chosen by a listener, stable broadcast ids."""

from __future__ import annotations

import pytest

from engine import Admin, ConsumeFrom, InvalidArgumentError, Store
from engine.broker.dispatch import dispatch_pending
from engine.client.resets import ResetWatcher
from engine.store.offset_resets import latest_resets, record_resets
from tests.test_push_consumer import Collector, committed, consumer, dispatcher, eventually, send

__all__ = ["dispatcher"]  # the fixture, used by name


# --------------------------------------------------------------------------- live resets
def test_reset_watcher_reports_only_resets_made_after_it_was_created(store: Store, topic: str) -> None:
    record_resets(store, "g", [("T", 0, 5)], ts_ms=1_000)
    watcher = ResetWatcher(store, "g")
    assert watcher.poll() == {}
    record_resets(store, "other", [("T", 1, 3)], ts_ms=2_000)
    assert watcher.poll() == {}
    record_resets(store, "g", [("T", 0, 2), ("T", 1, 4)], ts_ms=3_000)
    fresh = watcher.poll()
    assert {k: (r.offset, r.ts_ms) for k, r in fresh.items()} == {("T", 0): (2, 3_000), ("T", 1): (4, 3_000)}
    assert watcher.poll() == {}  # each reset is reported once


def test_reset_watcher_refuses_a_bad_group(store: Store) -> None:
    with pytest.raises(InvalidArgumentError):
        ResetWatcher(store, "bad group")


def test_admin_resets_are_recorded_for_running_consumers(store: Store, topic: str) -> None:
    send(store, ["a", "b", "c"], queue_id=1)
    dispatch_pending(store)
    admin = Admin(store)
    admin.reset_offset(
        "g",
        "T",
        1,
        2,
    )
    assert {k: r.offset for k, r in latest_resets(store, "g").items()} == {("T", 1): 2}
    admin.reset_offset_by_time("g", "T", 0)
    assert {k: r.offset for k, r in latest_resets(store, "g").items()} == {("T", q): 0 for q in range(4)}


def test_a_reset_reaches_a_running_consumer_which_consumes_again_and_keeps_the_reset(
    store: Store, topic: str, dispatcher: None
) -> None:
    seen = Collector()
    c = consumer(store, "g", listener=seen, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, [f"m{i}" for i in range(8)])
        eventually(lambda: len(seen.bodies()) == 8, what="first pass consumed")
        eventually(lambda: committed(store, "g") == {q: 2 for q in range(4)}, what="first pass committed")
        Admin(store).reset_offset_by_time("g", "T", 0)
        eventually(lambda: len(seen.bodies()) == 16, what="consumed again after the reset")
        assert sorted(seen.bodies()) == sorted([f"m{i}".encode() for i in range(8)] * 2)
        eventually(lambda: committed(store, "g") == {q: 2 for q in range(4)}, what="committed again")


def test_a_reset_of_one_queue_resumes_that_queue_from_the_new_offset_only(
    store: Store, topic: str, dispatcher: None
) -> None:
    seen = Collector()
    c = consumer(store, "g", listener=seen, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, ["a", "b", "c", "d"], queue_id=2)
        send(store, ["x"], queue_id=0)
        eventually(lambda: len(seen.bodies()) == 5, what="first pass consumed")
        Admin(store).reset_offset("g", "T", 2, 2)
        eventually(lambda: len(seen.bodies()) == 7, what="queue 2 consumed again from offset 2")
        assert sorted(seen.bodies()[5:]) == [b"c", b"d"]
        eventually(lambda: committed(store, "g").get(2) == 4, what="committed again")
