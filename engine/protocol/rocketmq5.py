"""RocketMQ 5's rules at the edge of its gRPC door (what its proxy checks before a broker sees a
request), and the door's receipt handles. Pure: no I/O.

A rule broken raises :class:`~engine.errors.InvalidArgumentError` whose ``status`` names RocketMQ 5's
``apache.rocketmq.v2.Code`` (``ILLEGAL_MESSAGE_TAG``, ``ILLEGAL_INVISIBLE_TIME``, ...): the door
answers with that code.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass

from engine.errors import InvalidArgumentError, InvalidReceiptHandleError

# The proxy's defaults (ProxyConfig).
MIN_INVISIBLE_MS_FOR_RECEIVE = 10_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MIN_LONG_POLLING_MS = 5_000
MAX_LONG_POLLING_MS = 20_000
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_USER_PROPERTIES_BYTES = 16 * 1024
MAX_USER_PROPERTIES = 128
MAX_GROUP_LENGTH = 120
# The 5.x clients that send no queue in a message (their x-mq-language): RocketMQ's Python and Go
# clients leave ``system_properties.queue_id`` unset (0); Java, C++, C#, Rust and Node.js name the
# queue they chose from the route.
QUEUE_BLIND_LANGUAGES = frozenset({"PYTHON", "GOLANG"})


def edge_error(status: str, message: str, **context: object) -> InvalidArgumentError:
    """The error for a request RocketMQ 5 refuses with ``status`` (a ``Code`` name)."""
    return InvalidArgumentError(message, status=status, **context)


def check_group(name: str) -> str:
    """A consumer or producer group name as the proxy accepts it (1..120 characters of
    ``[%|a-zA-Z0-9_-]``, not a system group).

    Raises:
        InvalidArgumentError: ``status`` ``ILLEGAL_CONSUMER_GROUP``.
    """
    if not name or len(name) > MAX_GROUP_LENGTH:
        raise edge_error(
            "ILLEGAL_CONSUMER_GROUP", f"group {name!r} must have 1..{MAX_GROUP_LENGTH} characters", group=name
        )
    if any(not (c.isascii() and (c.isalnum() or c in "%|_-")) for c in name):
        raise edge_error("ILLEGAL_CONSUMER_GROUP", f"group {name!r} has a character outside [%|a-zA-Z0-9_-]")
    return name


def check_tag(tag: str) -> None:
    """A message tag: not blank, no ``|``, no control character.

    Raises:
        InvalidArgumentError: ``status`` ``ILLEGAL_MESSAGE_TAG``.
    """
    if not tag.strip():
        raise edge_error("ILLEGAL_MESSAGE_TAG", "tag cannot be whitespace only", tag=tag)
    if "|" in tag:
        raise edge_error("ILLEGAL_MESSAGE_TAG", f"tag {tag!r} cannot contain '|'", tag=tag)
    if any(ord(c) < 32 or ord(c) == 127 for c in tag):
        raise edge_error("ILLEGAL_MESSAGE_TAG", f"tag {tag!r} cannot contain a control character", tag=tag)


def check_body(body: bytes) -> None:
    """A message body: 1 byte .. 4 MiB.

    Raises:
        InvalidArgumentError: ``status`` ``MESSAGE_BODY_EMPTY`` or ``MESSAGE_BODY_TOO_LARGE``.
    """
    if not body:
        raise edge_error("MESSAGE_BODY_EMPTY", "message body is empty")
    if len(body) > MAX_BODY_BYTES:
        raise edge_error(
            "MESSAGE_BODY_TOO_LARGE", f"message body of {len(body)} bytes exceeds {MAX_BODY_BYTES}"
        )


def check_user_properties(properties: Mapping[str, str]) -> None:
    """User properties: at most 128, 16 KiB of keys and values together, no empty key.

    Raises:
        InvalidArgumentError: ``status`` ``MESSAGE_PROPERTIES_TOO_LARGE`` or
            ``ILLEGAL_MESSAGE_PROPERTY_KEY``.
    """
    if len(properties) > MAX_USER_PROPERTIES:
        raise edge_error(
            "MESSAGE_PROPERTIES_TOO_LARGE",
            f"{len(properties)} user properties exceed {MAX_USER_PROPERTIES}",
        )
    size = 0
    for key, value in properties.items():
        if not key.strip():
            raise edge_error("ILLEGAL_MESSAGE_PROPERTY_KEY", f"property key {key!r} is blank")
        size += len(key.encode()) + len(value.encode())
    if size > MAX_USER_PROPERTIES_BYTES:
        raise edge_error(
            "MESSAGE_PROPERTIES_TOO_LARGE",
            f"user properties of {size} bytes exceed {MAX_USER_PROPERTIES_BYTES}",
        )


def check_invisible_ms(invisible_ms: int, minimum_ms: int) -> int:
    """An invisible time: ``minimum_ms`` (at least 1 ms) .. 12 h.

    Raises:
        InvalidArgumentError: ``status`` ``ILLEGAL_INVISIBLE_TIME``.
    """
    low = max(minimum_ms, 1)
    if invisible_ms < low:
        raise edge_error(
            "ILLEGAL_INVISIBLE_TIME", f"invisible time {invisible_ms} ms is too small, min is {low} ms"
        )
    if invisible_ms > MAX_INVISIBLE_MS:
        raise edge_error(
            "ILLEGAL_INVISIBLE_TIME",
            f"invisible time {invisible_ms} ms is too large, max is {MAX_INVISIBLE_MS} ms",
        )
    return invisible_ms


def long_polling_ms(requested_ms: int | None, remaining_ms: int | None, request_timeout_ms: int) -> int:
    """How long a receive waits for messages, as the proxy clamps it.

    Args:
        requested_ms: the request's ``long_polling_timeout`` (None when not set: what is left of
            the call's deadline less half the client's request timeout).
        remaining_ms: what is left of the call's deadline (None: no deadline).
        request_timeout_ms: the client's request timeout (its settings).

    Returns:
        The wait, within 5..20 s and never past the call's deadline.

    Raises:
        InvalidArgumentError: ``status`` ``ILLEGAL_POLLING_TIME``: less than 5 s is left of the call.
    """
    if requested_ms is None:
        requested_ms = (
            MAX_LONG_POLLING_MS if remaining_ms is None else remaining_ms
        ) - request_timeout_ms // 2
    polling = min(max(requested_ms, MIN_LONG_POLLING_MS), MAX_LONG_POLLING_MS)
    if remaining_ms is not None and polling > remaining_ms:
        if remaining_ms < MIN_LONG_POLLING_MS:
            raise edge_error(
                "ILLEGAL_POLLING_TIME",
                "the deadline time remaining is not enough for polling, please check network condition",
            )
        polling = remaining_ms
    return polling


@dataclass(frozen=True)
class ReceiptHandle:
    """What the door needs to find a lease again: the consumer (group and client id), the message
    (topic, queue, offset) and the engine's own handle of the delivery (consumer id and lease
    sequence, :class:`~engine.client.simple.ReceivedMessage`)."""

    group: str
    client_id: str
    topic: str
    queue_id: int
    offset: int
    lease: str

    def encode(self) -> str:
        """The handle as the client sees it (URL-safe base64, no padding)."""
        text = "\n".join(
            (self.group, self.client_id, self.topic, str(self.queue_id), str(self.offset), self.lease)
        )
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, handle: str) -> ReceiptHandle:
        """The handle a client sent back.

        Raises:
            InvalidReceiptHandleError: not a handle this door made (``status``
                ``INVALID_RECEIPT_HANDLE``).
        """
        try:
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode()
            group, client_id, topic, queue_id, offset, lease = raw.split("\n")
            parsed = cls(group, client_id, topic, int(queue_id), int(offset), lease)
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise InvalidReceiptHandleError(
                f"receipt handle {handle[:64]!r} is not one this server made",
                status="INVALID_RECEIPT_HANDLE",
            ) from None
        if not (parsed.group and parsed.topic and parsed.lease) or parsed.queue_id < 0 or parsed.offset < 0:
            raise InvalidReceiptHandleError(
                f"receipt handle {handle[:64]!r} is not one this server made",
                status="INVALID_RECEIPT_HANDLE",
            )
        return parsed


@dataclass(frozen=True)
class TransactionId:
    """A transactional send's id as the door hands it out (``SendResultEntry.transaction_id``) and
    takes it back (``EndTransaction``): the half message's physical offset and its message id."""

    half_offset: int
    message_id: str

    def encode(self) -> str:
        """The id as the client sees it (URL-safe base64, no padding)."""
        text = f"{self.half_offset}\n{self.message_id}"
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> TransactionId:
        """An id a client sent back.

        Raises:
            InvalidArgumentError: not an id this door made (``status`` ``INVALID_TRANSACTION_ID``).
        """
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            offset, message_id = raw.split("\n")
            parsed = cls(int(offset), message_id)
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise edge_error(
                "INVALID_TRANSACTION_ID", f"transaction id {text[:64]!r} is not one this server made"
            ) from None
        if parsed.half_offset < 0 or not parsed.message_id:
            raise edge_error(
                "INVALID_TRANSACTION_ID", f"transaction id {text[:64]!r} is not one this server made"
            )
        return parsed


def client_queue(language: str | None, queue_id: int, queues: int) -> int | None:
    """The queue a 5.x client chose for a message (``system_properties.queue_id``), or None when
    its client names none (a language of :data:`QUEUE_BLIND_LANGUAGES`, or no ``x-mq-language``
    header): the door then chooses (by the message group, else round robin).

    Raises:
        InvalidArgumentError: a queue outside the topic's ``0..queues-1`` (``BAD_REQUEST``).
    """
    if language is None or language.upper() in QUEUE_BLIND_LANGUAGES:
        return None
    if not 0 <= queue_id < queues:
        raise edge_error(
            "BAD_REQUEST", f"queue {queue_id} is not a queue of the topic (0..{queues - 1})", queue=queue_id
        )
    return queue_id
