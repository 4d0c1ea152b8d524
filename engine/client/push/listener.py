"""What a push consumer's listener is given and returns (RocketMQ's ``MessageListenerConcurrently`` /
``MessageListenerOrderly`` contract), and how one call of it is made.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
from collections.abc import Callable

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

    A listener taking two arguments gets one per call. ``delay_level_when_next_consume``: 0 (the
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


def takes_context(listener: Callable[..., object]) -> bool:
    """True when ``listener`` accepts two positional arguments (the messages and a context)."""
    try:
        inspect.signature(listener).bind([], None)
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): called with the messages only
        return False
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
        listener: ``listener(messages)`` or ``listener(messages, context)``.
        consumer_id: names the consumer in the warnings logged.
    """

    def __init__(self, listener: Listener, consumer_id: str) -> None:
        self._listener = listener
        self._with_context = takes_context(listener)
        self._consumer_id = consumer_id

    def __call__(
        self, messages: list[MessageExt], context: ConsumeConcurrentlyContext | ConsumeOrderlyContext
    ) -> ConsumeResult:
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
