"""One error hierarchy for the whole engine.

Every error carries the context it is about (topic, queue, offset, cause) and says what was wrong and
what is allowed. Errors that mean "the operation failed and changed nothing" are distinct from
errors that mean "the outcome is unknown" (:class:`CommitStateUnknownError`), as pyiceberg does.
"""

from __future__ import annotations

from typing import Any


class MQError(Exception):
    """Base class of every error the engine raises on purpose."""

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context: dict[str, Any] = context
        for key, value in context.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return self.message


class ConfigError(MQError):
    """A configuration value is missing or invalid."""


class InvalidMessageError(MQError):
    """A message (body, tags, keys, properties) breaks a rule; nothing was written."""


class InvalidTopicError(MQError):
    """A topic name breaks RocketMQ's naming rules or is reserved for the system."""


class TopicNotFoundError(MQError):
    """The topic does not exist in this store."""


class TopicExistsError(MQError):
    """A topic with this name already exists with a different configuration."""


class InvalidArgumentError(MQError):
    """An argument (queue id, offset, batch size, expression, group, …) is out of range."""


class InvalidSelectorError(InvalidArgumentError):
    """A message selector (``MessageSelector.by_sql`` / ``by_tag``) does not parse or breaks a type
    rule of RocketMQ's SQL92 grammar; ``expression`` is the text and ``position`` the 0-based offset
    of the offending token (None when the whole expression is at fault)."""


class TopicShrinkError(InvalidArgumentError):
    """An update asked a topic for fewer queues than it has: queues are only ever added (messages
    and offsets of a removed queue would be stranded). ``queues`` is the current count."""


class TopicInUseError(MQError):
    """A topic cannot be deleted while consumer groups still consume it; ``groups`` names them.
    Deleting anyway (``force=True``) leaves those groups without the topic."""


class OffsetOutOfRangeError(InvalidArgumentError):
    """An offset lies outside what a queue holds."""


class MessageNotFoundError(InvalidArgumentError):
    """A well-formed message id of this store names no stored message (never written, or removed
    by retention)."""


class StoreError(MQError):
    """The store is unreadable or a table is not what the engine expects."""


class TableMissingError(StoreError):
    """No Delta table where one was expected (a store creates its own tables when it opens)."""


class BucketNotFoundError(StoreError):
    """The object store has no bucket (container) of the store's name; ``bucket`` names it."""


class StoreAccessDeniedError(StoreError):
    """The object store refused the store's credentials, or they may not do what was asked."""


class StoreUnreachableError(StoreError):
    """The object store cannot be reached (connection refused, name unresolved, timed out);
    ``endpoint`` names where it was looked for."""


class StoreCorruptedError(StoreError):
    """A table's Delta log is damaged in a way the store does not repair by itself (it repairs only
    a torn last commit file); ``path`` names the damaged file."""


class CommitTruncatedError(StoreCorruptedError):
    """A commit file of a table's log is cut short (whole lines missing, so it still parses): the
    count of actions its commitInfo records does not match the lines present; ``path`` names it."""


class CommitConflictError(MQError):
    """A commit lost every race for the next table version; nothing was written. Retryable."""

    retryable = True


class CommitStateUnknownError(MQError):
    """A commit may or may not have happened (I/O failed mid-commit). Check before retrying."""


class ProducerClosedError(MQError):
    """The producer was closed; it accepts no more work."""


class ConsumerError(MQError):
    """A consumer was used out of order (not subscribed, not started, closed, …)."""


class ConsumerClosedError(ConsumerError):
    """The consumer was closed; it accepts no more work."""


class InvalidReceiptHandleError(InvalidArgumentError):
    """A receipt handle this consumer does not hold: never received here, already acked or nacked,
    superseded, or the message was taken over (RocketMQ 5's ``INVALID_RECEIPT_HANDLE``)."""


class ReceiptHandleExpiredError(InvalidReceiptHandleError):
    """A receipt handle whose invisible time has passed: the message may be redelivered already, so
    acking or changing it is refused (RocketMQ 5 refuses an expired receipt handle)."""


class TransactionError(MQError):
    """A transactional send or its check-back failed."""


class CliError(MQError):
    """A command-line problem: a bad argument, a missing runtime, a failed Spark statement."""


class RemotingProtocolError(MQError):
    """A remoting frame or header that breaks RocketMQ's wire protocol (bad length, bad JSON, an
    unknown serialize type, a missing or malformed header field); ``field`` names the culprit when
    one field is at fault. The connection that sent a bad frame is closed; a bad field is answered."""
