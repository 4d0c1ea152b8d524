"""What a send checks before it is stamped and what it answers after: the produce hot path's
checks of a message (:func:`is_plain`, :func:`is_plain_batch`), the topic it may go to
(:func:`writeable_topic`), a checked send waiting to be appended (:class:`PreparedSend`), and the
:class:`SendResult` of each stored message (:func:`send_results`, :func:`sent_result`). Shared by
the :class:`~engine.client.producer.Producer`, transactions and the wire protocol's producer."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from engine.errors import InvalidMessageError
from engine.model import Message, SendResult, SendStatus, TopicConfig
from engine.protocol.messages import MAX_BODY_BYTES
from engine.protocol.names import is_send_refused_topic, is_valid_topic_name
from engine.protocol.permissions import is_writeable
from engine.protocol.rebalance import MessageQueue
from engine.protocol.schedule import TIMER_PROPERTIES
from engine.store.commit_log import PendingMessage, StampedBatch
from engine.store.store import Store

_SEND_OK = SendStatus.SEND_OK
# SendResult is a frozen dataclass: its __init__ sets every field through object.__setattr__, which
# costs more than the rest of a batch send's Python work put together. Results of a batch fill the
# instance dict directly, which is exactly what __init__ leaves behind (tests compare the two).
_FILL_DICT = "__slots__" not in vars(SendResult)


def send_results(stamped: StampedBatch) -> list[SendResult]:
    """One :class:`SendResult` per message of a committed batch, in input order."""
    rows = zip(
        stamped.msg_ids,
        stamped.uniq_keys,
        stamped.topics,
        stamped.queue_ids,
        stamped.queue_offsets,
        stamped.physical,
        strict=True,
    )
    ts = stamped.store_ts_ms
    if not _FILL_DICT:  # pragma: no cover - a SendResult with slots
        return [SendResult(_SEND_OK, u, m, t, q, o, p, ts) for m, u, t, q, o, p in rows]
    new = object.__new__
    out = []
    for m, u, t, q, o, p in rows:
        r = new(SendResult)
        r.__dict__.update(
            status=_SEND_OK,
            msg_id=u,
            offset_msg_id=m,
            topic=t,
            queue_id=q,
            queue_offset=o,
            physical_offset=p,
            store_ts_ms=ts,
        )
        out.append(r)
    return out


class PreparedSend(NamedTuple):
    """A checked send waiting for its commit (:meth:`~engine.client.producer.Producer.prepare`).

    ``pending`` is the row the commit log stores. ``destination`` is the queue the message was sent
    to when it is stored elsewhere: a delayed or timer message (or a client's retry send) waits in
    the schedule topic, and its :class:`SendResult` names the real topic and queue, as RocketMQ's
    broker answers. It is set where the schedule envelope is made, so nothing reads it back from
    the envelope's properties; None for a message stored where it was sent.
    """

    pending: PendingMessage
    destination: MessageQueue | None = None


def bodies_bytes(sends: Sequence[PreparedSend]) -> int:
    """The bytes of prepared sends' bodies: what ``max_batch_bytes`` bounds in one group commit."""
    return sum(len(p.pending.body) for p in sends)


def sent_result(result: SendResult, destination: MessageQueue | None) -> SendResult:
    """The result a producer reports for a stored message: as stored, or, for a send stored in the
    schedule topic, naming the ``destination`` it was sent to (its queue offset stays the schedule
    queue's, as RocketMQ's broker answers)."""
    if destination is None:
        return result
    return dataclasses.replace(result, topic=destination.topic, queue_id=destination.queue_id)


def has_timer(properties: Mapping[str, str]) -> bool:
    """True when a message's properties ask for a timer (:data:`TIMER_PROPERTIES`)."""
    return any(name in properties for name in TIMER_PROPERTIES)


valid_topic_name = functools.lru_cache(maxsize=1024)(is_valid_topic_name)


def is_plain(m: Message) -> bool:
    """A message that needs no further checks: a valid topic name (cached), a bytes body of allowed
    size, at most a simple tag, no keys, properties or timer. The produce hot path."""
    tag = m.tags
    return (
        type(m.body) is bytes
        and 0 < len(m.body) <= MAX_BODY_BYTES
        and (tag is None or (type(tag) is str and tag != "" and "||" not in tag))
        and not m.keys
        and not m.properties
        and m.deliver_at_ms is None
        and type(m.topic) is str
        and valid_topic_name(m.topic)
    )


def is_plain_batch(messages: Sequence[object], topic: str) -> bool:
    """Every item a plain :class:`Message` (see :func:`is_plain`) of ``topic``, a valid name: the
    batch needs no further checks. One pass, no call per message."""
    for m in messages:
        if type(m) is not Message:
            return False
        body, tag, name = m.body, m.tags, m.topic
        if (
            (name is not topic and (type(name) is not str or name != topic))
            or type(body) is not bytes
            or not 0 < len(body) <= MAX_BODY_BYTES
            or m.keys
            or m.properties
            or m.deliver_at_ms is not None
            or (tag is not None and (type(tag) is not str or tag == "" or "||" in tag))
        ):
            return False
    return True


def writeable_topic(store: Store, name: str) -> TopicConfig:
    """The configuration of a topic producers may send to.

    Raises:
        InvalidMessageError: a system topic (but the message-trace topic), or one without write
            permission.
        TopicNotFoundError: no such topic.
    """
    if is_send_refused_topic(name):
        raise InvalidMessageError(
            f"topic {name!r} is a system topic; producers cannot send to it", topic=name
        )
    topic = store.topic(name)
    if not is_writeable(topic.perm):
        raise InvalidMessageError(
            f"topic {topic.name!r} is not writable (perm {topic.perm})", topic=topic.name
        )
    return topic
