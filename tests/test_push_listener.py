"""Which push listeners get a context: only those that ask for one unmistakably (a second required
positional parameter, RocketMQ's ``consume_message(messages, context)``, or ``with_context=True``).

A listener binding a loop variable with a default argument (``lambda msgs, i=i: ...``) must keep
working: given the context in ``i`` it used to raise, and its messages were dropped (broadcasting)
or retried to the DLQ (clustering).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from engine import (
    ConsumeConcurrentlyContext,
    ConsumeFrom,
    ConsumeOrderlyContext,
    ConsumeResult,
    InvalidArgumentError,
    MessageExt,
    MessageModel,
    MessageQueue,
    Store,
)
from engine.client.push.listener import ListenerCall, MessageListener, takes_context
from engine.protocol.actions import NACK
from engine.store.action_log import read_actions
from tests.test_push_consumer import committed, consumer, dispatcher, eventually, send

__all__ = ["dispatcher"]  # the fixture, used by name

MQ = MessageQueue("T", 0)


def _two(messages: list[MessageExt], context: Any) -> str:
    return "SUCCESS" if context is not None else "RECONSUME_LATER"


def _three(tag: str, messages: list[MessageExt], context: Any) -> str:
    return "SUCCESS" if context is not None else "RECONSUME_LATER"


def _messages_and_tag(messages: list[MessageExt], tag: str = "x") -> str:
    return "SUCCESS" if tag == "x" else "RECONSUME_LATER"


class _Handler:
    def __init__(self) -> None:
        self.contexts: list[Any] = []

    def on(self, messages: list[MessageExt], context: Any) -> str:
        self.contexts.append(context)
        return "SUCCESS"

    def on_messages(self, messages: list[MessageExt], i: int = 3) -> str:
        return "SUCCESS" if i == 3 else "RECONSUME_LATER"


class _CallableWithContext:
    def __call__(self, messages: list[MessageExt], context: Any) -> str:
        return "SUCCESS" if isinstance(context, ConsumeConcurrentlyContext | ConsumeOrderlyContext) else "NO"


class _CallableWithDefault:
    def __call__(self, messages: list[MessageExt], i: int = 7) -> str:
        return "SUCCESS" if i == 7 else "NO"


class _RocketMQStyle:
    """RocketMQ's MessageListenerConcurrently: not callable, a consume_message method."""

    def __init__(self) -> None:
        self.contexts: list[Any] = []

    def consume_message(self, messages: list[MessageExt], context: Any) -> ConsumeResult:
        self.contexts.append(context)
        return ConsumeResult.SUCCESS


def _star_args(*args: Any) -> str:
    return "SUCCESS" if len(args) == 1 else "RECONSUME_LATER"


@pytest.mark.parametrize(
    ("listener", "expected"),
    [
        (_two, True),
        (lambda msgs, ctx: "SUCCESS", True),
        (lambda msgs, i=3: "SUCCESS", False),  # binding a loop variable
        (lambda msgs: "SUCCESS", False),
        (functools.partial(_three, "tag"), True),  # both left unbound
        (functools.partial(_two, context=None), False),  # the second bound by keyword
        (functools.partial(_messages_and_tag, tag="y"), False),
        (_Handler().on, True),  # a bound method: self is not counted
        (_Handler().on_messages, False),
        (_CallableWithContext(), True),
        (_CallableWithDefault(), False),
        (_star_args, False),  # *args is not a required parameter
        (print, False),
    ],
)
def test_a_listener_gets_a_context_only_when_its_second_parameter_is_required(
    listener: Any, expected: bool
) -> None:
    assert takes_context(listener) is expected
    assert ListenerCall(listener, "c").with_context is expected


@pytest.mark.parametrize(
    "listener",
    [
        lambda msgs, i=3: "SUCCESS" if i == 3 else "RECONSUME_LATER",
        functools.partial(_messages_and_tag, tag="x"),
        _Handler().on_messages,
        _CallableWithDefault(),
        _star_args,
    ],
)
def test_a_listener_asking_no_context_is_called_with_the_messages_alone(listener: Any) -> None:
    for context in (ConsumeConcurrentlyContext(MQ), ConsumeOrderlyContext(MQ)):
        assert ListenerCall(listener, "c")([], context) is ConsumeResult.SUCCESS


def test_a_listener_asking_a_context_gets_the_context_of_its_mode() -> None:
    handler = _Handler()
    concurrently, orderly = ConsumeConcurrentlyContext(MQ), ConsumeOrderlyContext(MQ)
    assert ListenerCall(handler.on, "c")([], concurrently) is ConsumeResult.SUCCESS
    assert ListenerCall(handler.on, "c")([], orderly) is ConsumeResult.SUCCESS
    assert handler.contexts == [concurrently, orderly]
    assert ListenerCall(functools.partial(_three, "t"), "c")([], orderly) is ConsumeResult.SUCCESS
    assert ListenerCall(_CallableWithContext(), "c")([], concurrently) is ConsumeResult.SUCCESS


def test_a_rocketmq_style_listener_object_always_gets_the_context() -> None:
    listener = _RocketMQStyle()
    assert isinstance(listener, MessageListener)
    context = ConsumeConcurrentlyContext(MQ)
    call = ListenerCall(listener, "c")
    assert call.with_context and call([], context) is ConsumeResult.SUCCESS
    assert listener.contexts == [context]


def test_with_context_opts_in_or_out_explicitly() -> None:
    seen: list[Any] = []

    def opted(messages: list[MessageExt], context: Any = None) -> str:
        seen.append(context)
        return "SUCCESS"

    context = ConsumeConcurrentlyContext(MQ)
    assert ListenerCall(opted, "c")([], context) is ConsumeResult.SUCCESS  # a default: no context
    assert ListenerCall(opted, "c", with_context=True)([], context) is ConsumeResult.SUCCESS
    assert ListenerCall(_star_args, "c", with_context=True).with_context
    assert ListenerCall(_two, "c", with_context=False).with_context is False
    assert seen == [None, context]


@pytest.mark.parametrize(
    ("listener", "with_context"),
    [
        (lambda msgs: "SUCCESS", True),  # cannot take a context
        (42, None),  # not callable, no consume_message
        (_two, "yes"),  # not a bool
    ],
)
def test_a_bad_listener_or_opt_in_is_refused_with_a_typed_error(
    store: Store, topic: str, listener: Any, with_context: Any
) -> None:
    c = consumer(store, "g")
    with pytest.raises(InvalidArgumentError):
        c.register_listener(listener, with_context=with_context)


# --------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("model", [MessageModel.CLUSTERING, MessageModel.BROADCASTING])
@pytest.mark.parametrize("orderly", [False, True])
def test_a_default_argument_lambda_consumes_in_every_mode(
    store: Store, topic: str, dispatcher: None, model: MessageModel, orderly: bool
) -> None:
    seen: dict[int, list[bytes]] = {0: [], 1: []}
    listeners = []
    for i in (0, 1):
        listeners.append(lambda msgs, i=i: seen[i].extend(m.body for m in msgs) or ConsumeResult.SUCCESS)
    kw: dict[str, Any] = {"model": model, "consume_from": ConsumeFrom.FIRST, "instance_id": "inst"}
    c = consumer(store, "g", listener=listeners[1], orderly=orderly, **kw)
    with c.start():
        send(store, ["a", "b", "c"], queue_id=0)
        eventually(lambda: sorted(seen[1]) == [b"a", b"b", b"c"], what="consumed with i bound to 1")
        key = "inst" if model is MessageModel.BROADCASTING else ""
        eventually(lambda: committed(store, "g", consumer_id=key).get(0) == 3, what="committed")
    assert seen[0] == [] and read_actions(store, "g", NACK) == []


@pytest.mark.parametrize("orderly", [False, True])
def test_a_listener_asking_a_context_gets_it_end_to_end(
    store: Store, topic: str, dispatcher: None, orderly: bool
) -> None:
    handler = _Handler()
    c = consumer(store, "g", listener=handler.on, orderly=orderly, consume_from=ConsumeFrom.FIRST)
    with c.start():
        send(store, ["a"], queue_id=2)
        eventually(lambda: len(handler.contexts) == 1, what="consumed")
    expected = ConsumeOrderlyContext if orderly else ConsumeConcurrentlyContext
    [context] = handler.contexts
    assert isinstance(context, expected) and context.message_queue == MessageQueue("T", 2)
