"""What a push consumer's listener is given and returns (RocketMQ's ``MessageListenerConcurrently`` /
``MessageListenerOrderly`` contract), and how one call of it is made.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from engine.errors import InvalidArgumentError
from engine.model import MessageExt
from engine.protocol.names import PROPERTY_RETRY_TOPIC, RETRY_PREFIX
from engine.protocol.rebalance import MessageQueue

_log = logging.getLogger(__name__)


class ConsumeResult(enum.StrEnum):
    """What a listener returns (RocketMQ ``ConsumeConcurrentlyStatus`` / ``ConsumeOrderlyStatus``).

    SUCCESS: the messages are consumed. RECONSUME_LATER: a concurrent listener's messages go to the
    group's retry topic. SUSPEND_CURRENT_QUEUE_A_MOMENT: an orderly listener's queue pauses (about
    1 s) and the same messages come again, in place (an orderly listener's RECONSUME_LATER means the
    same; a concurrent listener's SUSPEND_CURRENT_QUEUE_A_MOMENT means RECONSUME_LATER).
    """

    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclasses.dataclass
class ConsumeConcurrentlyContext:
    """What a concurrent listener may say about a failed batch (RocketMQ's context of the same name).

    A listener gets one per call when it asks for it (see
    :meth:`~engine.client.push.PushConsumer.register_listener`). ``delay_level_when_next_consume``: 0 (the
    default) lets the broker choose the retry delay (level 3 + reconsume times), -1 sends the
    failed messages to the dead-letter queue at once, 1..18 retries after that delay level (a
    higher level is clamped to 18).
    """

    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0


@dataclasses.dataclass
class ConsumeOrderlyContext:
    """What an orderly listener may say about a failed batch (RocketMQ's context of the same name).

    ``suspend_current_queue_time_ms``: how long the queue pauses before the batch comes again;
    -1 (the default) means the consumer's ``suspend_current_queue_ms``.
    """

    message_queue: MessageQueue
    suspend_current_queue_time_ms: int = -1


Listener = Callable[..., "ConsumeResult | str"]


@runtime_checkable
class MessageListener(Protocol):
    """A listener object as RocketMQ's ``MessageListenerConcurrently`` / ``MessageListenerOrderly``:
    its ``consume_message(messages, context)`` is called with every batch and always gets the
    context (:class:`ConsumeConcurrentlyContext` or :class:`ConsumeOrderlyContext`)."""

    def consume_message(self, messages: list[MessageExt], context: Any) -> ConsumeResult | str:
        """Consume one batch; return a :class:`ConsumeResult` (or its name)."""
        ...  # pragma: no cover - a protocol


def takes_context(listener: Callable[..., object]) -> bool:
    """True when ``listener`` asks for a context unmistakably: its second positional parameter is
    required (has no default).

    ``fn(messages, context)``, a bound method ``def on(self, messages, context)``, an object whose
    ``__call__`` takes ``(messages, context)``, a ``functools.partial`` leaving both unbound: yes.
    ``lambda messages, i=i: ...`` (the usual way to bind a loop variable), ``fn(*args)``, a partial
    that bound the second argument, anything without an inspectable signature: no. A listener
    that wants the context any other way says so with ``register_listener(..., with_context=True)``.
    """
    try:
        parameters = list(inspect.signature(listener).parameters.values())
    except (TypeError, ValueError):  # no signature (some builtins): called with the messages only
        return False
    positional = [p for p in parameters if p.kind in _POSITIONAL]
    return len(positional) >= 2 and positional[1].default is inspect.Parameter.empty


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def accepts_context(listener: Callable[..., object]) -> bool:
    """True when ``listener(messages, context)`` is a valid call (what ``with_context=True`` needs);
    True as well when its signature cannot be inspected."""
    try:
        inspect.signature(listener).bind([], None)
    except TypeError:
        return False
    except ValueError:  # no signature: trust the user who opted in
        return True
    return True


def listener_view(message: MessageExt, reconsume_times: int | None = None) -> MessageExt:
    """The message as the listener sees it: a retry shows its original topic, as in RocketMQ (and
    an orderly retry in place its count of attempts so far)."""
    changes: dict[str, object] = {}
    origin = message.properties.get(PROPERTY_RETRY_TOPIC)
    if origin and message.topic.startswith(RETRY_PREFIX):
        changes["topic"] = origin
    if reconsume_times is not None and reconsume_times != message.reconsume_times:
        changes["reconsume_times"] = reconsume_times
    return dataclasses.replace(message, **changes) if changes else message  # type: ignore[arg-type]


class ListenerCall:
    """A registered listener, called the way it takes its arguments; whatever it does, a call ends
    in a :class:`ConsumeResult` (raising, or returning anything else, means RECONSUME_LATER, as in
    RocketMQ).

    Args:
        listener: ``listener(messages)``, ``listener(messages, context)``, or a
            :class:`MessageListener` (its ``consume_message(messages, context)``).
        consumer_id: names the consumer in the warnings logged.
        with_context: pass the context (True), never (False), or when the listener unmistakably
            asks for it (None: :func:`takes_context`; a :class:`MessageListener` always gets it).

    Raises:
        InvalidArgumentError: ``listener`` is neither callable nor a :class:`MessageListener`, or
            ``with_context=True`` names a listener that cannot take two arguments.
    """

    def __init__(
        self, listener: Listener | MessageListener, consumer_id: str, with_context: bool | None = None
    ) -> None:
        if with_context is not None and not isinstance(with_context, bool):
            raise InvalidArgumentError(f"with_context must be True, False or None, got {with_context!r}")
        method = getattr(listener, "consume_message", None)
        if callable(method):
            self._listener: Callable[..., object] = method
            self._with_context = True if with_context is None else with_context
        elif callable(listener):
            self._listener = listener
            self._with_context = takes_context(listener) if with_context is None else with_context
        else:
            raise InvalidArgumentError(
                "listener must be callable, fn(list[MessageExt]) -> ConsumeResult, or have a "
                f"consume_message(messages, context) method; got {type(listener).__name__}"
            )
        if self._with_context and not accepts_context(self._listener):
            raise InvalidArgumentError(
                "with_context=True, but the listener cannot be called as listener(messages, context)"
            )
        self._consumer_id = consumer_id

    @property
    def with_context(self) -> bool:
        """Whether each call passes the context."""
        return self._with_context

    def __call__(
        self, messages: list[MessageExt], context: ConsumeConcurrentlyContext | ConsumeOrderlyContext
    ) -> ConsumeResult:
        """Call the listener once; its answer as a :class:`ConsumeResult`."""
        try:
            result = self._listener(messages, context) if self._with_context else self._listener(messages)
        except Exception as exc:  # a failing listener means "reconsume later", as in RocketMQ
            _log.warning("push consumer %s: listener raised %r; reconsume later", self._consumer_id, exc)
            return ConsumeResult.RECONSUME_LATER
        if isinstance(result, ConsumeResult):
            return result
        if isinstance(result, str) and result in ConsumeResult.__members__:
            return ConsumeResult(result)
        _log.warning("push consumer %s: listener returned %r; reconsume later", self._consumer_id, result)
        return ConsumeResult.RECONSUME_LATER
