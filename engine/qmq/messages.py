"""QMQ messages <-> the store's messages.

A QMQ message is stored in the topic named by its subject; its body is QMQ's encoded property map
(what the client sends, kept byte for byte, so that a QMQ consumer gets it back unchanged), its
QMQ message id is its key (``query_by_key`` finds it) and its header travels in properties. A
message from another door reaches a QMQ consumer with its properties as attributes and its body
(as text) under :data:`BODY_ATTRIBUTE`.
"""

from __future__ import annotations

from engine.model import Message, MessageExt
from engine.qmq.codec import MESSAGE_FLAG_DELAY, QmqMessage, decode_attrs, encode_attrs

P_MSG_ID = "QMQ_MSG_ID"
P_FLAG = "QMQ_FLAG"
P_CREATED = "QMQ_CREATED"
P_EXPIRE = "QMQ_EXPIRE"
P_TAGS = "QMQ_TAGS"
TAG_SEPARATOR = "\n"
BODY_ATTRIBUTE = "body"  # where a message of another door puts its body for a QMQ consumer


def to_store(message: QmqMessage) -> Message:
    """The store message of a QMQ message (a delayed one is delivered at its schedule time)."""
    props = {
        P_MSG_ID: message.message_id,
        P_FLAG: str(message.flag),
        P_CREATED: str(message.created_ms),
        P_EXPIRE: str(message.expire_ms),
    }
    if message.tags:
        props[P_TAGS] = TAG_SEPARATOR.join(message.tags)
    return Message(
        topic=message.subject,
        body=message.attrs or encode_attrs({"qmq_createTime": str(message.created_ms)}),
        tags=message.tags[0] if len(message.tags) == 1 else None,
        keys=(message.message_id,),
        properties=props,
        deliver_at_ms=message.expire_ms if message.flag & MESSAGE_FLAG_DELAY else None,
    )


def from_store(message: MessageExt, subject: str | None = None) -> QmqMessage:
    """What a QMQ consumer of ``subject`` (default: the message's topic) receives for a stored message."""
    props = message.properties
    qmq_id = props.get(P_MSG_ID)
    if qmq_id is not None:
        tags = message_tags(message)
        return QmqMessage(
            subject=subject or message.topic,
            message_id=qmq_id,
            created_ms=int(props.get(P_CREATED, message.born_ts_ms)),
            expire_ms=int(props.get(P_EXPIRE, message.store_ts_ms)),
            flag=int(props.get(P_FLAG, "0")) & ~MESSAGE_FLAG_DELAY,
            tags=tags,
            attrs=message.body,
        )
    attrs = {k: v for k, v in props.items()}
    attrs.setdefault("qmq_createTime", str(message.born_ts_ms))
    attrs[BODY_ATTRIBUTE] = message.body.decode("utf-8", "replace")
    return QmqMessage(
        subject=subject or message.topic,
        message_id=message.msg_id,
        created_ms=message.born_ts_ms,
        expire_ms=message.store_ts_ms,
        tags=(message.tags,) if message.tags else (),
        attrs=encode_attrs(attrs),
    )


def message_tags(message: MessageExt) -> tuple[str, ...]:
    """A stored message's QMQ tags (its store tag for a message of another door)."""
    tags = message.properties.get(P_TAGS)
    if tags is not None:
        return tuple(t for t in tags.split(TAG_SEPARATOR) if t)
    return (message.tags,) if message.tags else ()


def attributes(message: MessageExt) -> dict[str, str]:
    """A QMQ-sent message's properties as its producer set them (``Message.getStringProperty``)."""
    return decode_attrs(message.body)
