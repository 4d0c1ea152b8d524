"""What a simple consumer's receives read from and hand out.

* A :data:`Source` is one queue of a topic with the subscription's selector: :func:`receive_sources`
  lists a consumer's (its subscriptions' queues and its group's retry topic's); :func:`topic_of`
  says which topic a received message counts for.
* A leased message waits in the consumer's buffer as :class:`Leased`, goes to the user as a
  :class:`ReceivedMessage` (:func:`received_message`) and is :class:`Held` until it is acked,
  nacked or its lease ends (the protocol: :mod:`engine.client.simple.leases`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.model import MessageExt
from engine.protocol import retry_topic
from engine.protocol.names import PROPERTY_RETRY_TOPIC, RETRY_PREFIX
from engine.protocol.selectors import MessageSelector
from engine.store.store import Store

Key = tuple[str, int, int]  # topic, queue_id, queue_offset
Source = tuple[str, int, MessageSelector]  # topic, queue_id, the subscription's selector
MATCH_ALL = MessageSelector.by_tag("*")


@dataclass
class Held:
    """A message this consumer handed to its user and that is not acked or nacked yet."""

    sequence: int  # the lease's (the receipt handle's) action sequence
    deadline_ms: int
    reconsume_times: int
    msg_id: str
    physical_offset: int
    version: int  # the action-log version the lease landed at (a reset after it drops it)
    handles: set[str] = field(default_factory=set)  # every receipt handle of this delivery


@dataclass(frozen=True)
class ReceivedMessage(MessageExt):
    """A message returned by :meth:`SimpleConsumer.receive`: a :class:`MessageExt` with its lease.

    ``receipt_handle`` names the lease (consumer id and action sequence); ``invisible_until_ms`` is
    when the message becomes visible to the group again unless acked or extended.
    """

    receipt_handle: str = ""
    invisible_until_ms: int = 0


def received_message(
    message: MessageExt, reconsume_times: int, receipt_handle: str, until_ms: int
) -> ReceivedMessage:
    """``message`` as handed to the consumer that leased it: its delivery count and its lease."""
    # A copy of the frozen dataclass's fields, without __init__ (one per message received: the
    # keyword call cost more than the rest of a receive from the buffer).
    out = object.__new__(ReceivedMessage)
    fields_of = out.__dict__
    fields_of.update(message.__dict__)
    fields_of.update(
        reconsume_times=reconsume_times, receipt_handle=receipt_handle, invisible_until_ms=until_ms
    )
    return out


@dataclass
class Leased:
    """A leased message waiting in the buffer."""

    message: MessageExt
    sequence: int
    deadline_ms: int
    reconsume_times: int
    version: int  # the action-log version the lease landed at (a reset after it drops it)
    recovered: bool = False
    leased_at: float = 0.0  # monotonic


def topic_of(message: MessageExt) -> str:
    """The topic a received message is of: its own, or for a message of a group's retry topic the
    topic it was first sent to."""
    if message.topic.startswith(RETRY_PREFIX):
        return message.properties.get(PROPERTY_RETRY_TOPIC) or message.topic
    return message.topic


def receive_sources(store: Store, group: str, subscriptions: dict[str, MessageSelector]) -> list[Source]:
    """Every (topic, queue, filter) to receive from: the subscriptions and the group's retry topic."""
    configs = store.topic_configs(refresh=True)
    subscribed = dict(subscriptions)
    retry = retry_topic(group)
    if retry in configs and retry not in subscribed:
        subscribed[retry] = MATCH_ALL
    sources: list[Source] = []
    for topic, tag_filter in subscribed.items():
        config = configs.get(topic)
        if config is None:
            continue  # deleted since subscribe
        sources.extend((topic, q, tag_filter) for q in range(config.queues))
    return sources


__all__ = [
    "MATCH_ALL",
    "Held",
    "Key",
    "Leased",
    "ReceivedMessage",
    "Source",
    "receive_sources",
    "received_message",
    "topic_of",
]
