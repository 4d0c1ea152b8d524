"""RocketMQ 5's status codes for what the gRPC door's calls raise.

Every call of :class:`~engine.grpc.service.Service` answers a ``Status`` and never raises to grpc:
an error of the engine's hierarchy (:mod:`engine.errors`) is the code the proxy answers for it (an
error that names its code, as :func:`~engine.protocol.rocketmq5.edge_error`'s do, is that code);
anything else is ``INTERNAL_SERVER_ERROR``, and logged.
"""

from __future__ import annotations

import logging

from engine.errors import (
    CommitConflictError,
    ConsumerError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidReceiptHandleError,
    InvalidSelectorError,
    InvalidTopicError,
    MQError,
    TopicNotFoundError,
)
from engine.grpc.v2 import definition_pb2 as pb

_log = logging.getLogger(__name__)


def status(code: int, message: str = "") -> pb.Status:
    return pb.Status(code=code, message=message or pb.Code.Name(code))  # type: ignore[arg-type]


def status_of(exc: BaseException) -> pb.Status:
    """RocketMQ 5's status for an error a call raised."""
    named = getattr(exc, "status", None)
    if isinstance(named, str) and named in pb.Code.keys():  # noqa: SIM118 (an enum wrapper)
        return status(pb.Code.Value(named), str(exc))
    code: int
    if isinstance(exc, TopicNotFoundError):
        code = pb.TOPIC_NOT_FOUND
    elif isinstance(exc, InvalidTopicError):
        code = pb.ILLEGAL_TOPIC
    elif isinstance(exc, InvalidReceiptHandleError):
        code = pb.INVALID_RECEIPT_HANDLE
    elif isinstance(exc, InvalidSelectorError):
        code = pb.ILLEGAL_FILTER_EXPRESSION
    elif isinstance(exc, InvalidMessageError | InvalidArgumentError | ConsumerError):
        code = pb.BAD_REQUEST
    elif isinstance(exc, CommitConflictError):
        code = pb.TOO_MANY_REQUESTS
    else:
        if not isinstance(exc, MQError):
            _log.exception("gRPC door: unexpected error", exc_info=exc)
        code = pb.INTERNAL_SERVER_ERROR
    return status(code, str(exc) or type(exc).__name__)


__all__ = ["status", "status_of"]
