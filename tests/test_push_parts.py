"""The push consumer's rooms (engine.client.push), each on its own: how a listener is called, what a
queue worker's state lets its consumer do, and the offset resets waiting to be applied."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from engine import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeResult,
    MessageExt,
    MessageQueue,
    MessageSelector,
    Store,
    StoreError,
)
from engine.client.push.consume_service import log_failure
from engine.client.push.listener import ListenerCall, listener_view
from engine.client.push.process_queue import ProcessQueue
from engine.client.push.resets import LiveResets
from engine.client.resets import ResetWatcher
from engine.protocol import PROPERTY_RETRY_TOPIC
from engine.store.offset_resets import record_resets

MQ = MessageQueue("T", 1)


def _message(
    topic: str = "T", reconsume_times: int = 0, properties: dict[str, str] | None = None
) -> MessageExt:
    return MessageExt(
        topic=topic,
        queue_id=0,
        queue_offset=0,
        physical_offset=0,
        msg_id="m",
        offset_msg_id="u",
        body=b"x",
        tags=None,
        keys=(),
        properties=properties or {},
        born_ts_ms=0,
        store_ts_ms=0,
        reconsume_times=reconsume_times,
    )


# ----------------------------------------------------------------------------- listener
def test_a_listener_taking_a_context_gets_it_and_one_taking_none_does_not() -> None:
    seen: list[Any] = []

    def with_context(messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeResult:
        seen.append(context)
        context.delay_level_when_next_consume = 5
        return ConsumeResult.SUCCESS

    context = ConsumeConcurrentlyContext(MQ)
    assert ListenerCall(with_context, "c")([], context) is ConsumeResult.SUCCESS
    assert seen == [context] and context.delay_level_when_next_consume == 5
    assert (
        ListenerCall(lambda messages: "SUCCESS", "c")([], ConsumeOrderlyContext(MQ)) is ConsumeResult.SUCCESS
    )


@pytest.mark.parametrize("answer", [None, "NOT_A_RESULT", 3, ValueError("boom")])
def test_a_listener_raising_or_answering_anything_else_means_reconsume_later(answer: object) -> None:
    def listener(messages: list[MessageExt]) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert ListenerCall(listener, "c")([], ConsumeConcurrentlyContext(MQ)) is ConsumeResult.RECONSUME_LATER


def test_a_retried_message_shows_its_original_topic_and_its_attempts_so_far() -> None:
    retried = _message("%RETRY%g", 2, {PROPERTY_RETRY_TOPIC: "Orders"})
    view = listener_view(retried, reconsume_times=3)
    assert (view.topic, view.reconsume_times, view.properties) == ("Orders", 3, retried.properties)
    plain = _message("T", 2)
    assert listener_view(plain) is plain and listener_view(plain, 2) is plain
    assert (
        listener_view(_message("T", properties={PROPERTY_RETRY_TOPIC: "Orders"})).topic == "T"
    )  # not a retry


# ----------------------------------------------------------------------------- queue state
def test_a_process_queue_changes_only_through_its_methods() -> None:
    pq = ProcessQueue(MQ, "*", 7, None)
    assert (pq.mq, pq.expression, pq.consumed, pq.committed) == (MQ, "*", 7, None)
    pq.mark_committed(7)
    selector = MessageSelector.by_tag("A")
    pq.reselect(selector)
    assert (pq.committed, pq.expression, pq.consumed) == (7, selector, 7)


def test_a_process_queue_never_started_has_stopped() -> None:
    pq = ProcessQueue(MQ, "*", 0, None)
    pq.drop()
    assert pq.join_puller(0) and pq.wait_idle(0) and pq.dropped


def test_background_failures_log_a_traceback_only_for_unexpected_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        log_failure("c1", "pull failed", StoreError("table gone"))
        log_failure("c1", "pull failed", KeyError("bug"))
    expected, bug = caplog.records
    assert "c1: pull failed: table gone" in expected.getMessage() and not expected.exc_info
    assert bug.exc_info is not None and bug.exc_info[0] is KeyError


# ----------------------------------------------------------------------------- resets
def test_live_resets_are_kept_until_applied_and_a_newer_one_survives_an_older_application(
    store: Store,
) -> None:
    resets = LiveResets(ResetWatcher(store, "g"))
    assert resets.pending() == {}
    record_resets(store, "g", [("T", 0, 5), ("T", 1, 3)], ts_ms=1_000)
    seen = resets.pending()
    assert seen == {("T", 0): 5, ("T", 1): 3}
    assert resets.pending() == seen  # seen once by the watcher, kept until applied
    record_resets(store, "g", [("T", 1, 9)], ts_ms=2_000)  # reset again while the first is applied
    resets.applied(seen)
    assert resets.pending() == {("T", 1): 9}
    resets.applied({("T", 1): 9})
    assert resets.pending() == {}
