"""Requests whose bytes are not their protobuf message, answered as RocketMQ 5's proxy answers them.

The generated code registers its method handlers through :class:`Guarded`, which wraps each so
that an unparsable request never reaches grpc.aio's own handling (an ``UNKNOWN`` and a logged
traceback): a unary call is answered ``INTERNAL`` with grpc-java's words (:data:`BAD_PROTOBUF`), and
a command of a stream reaches the method as :data:`UNPARSABLE`, for the method to end the stream.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc import aio


class _Unparsable:
    """A request whose bytes are not its protobuf message."""


UNPARSABLE = _Unparsable()
BAD_PROTOBUF = "Invalid protobuf byte sequence"  # grpc-java's words (the proxy's answer), INTERNAL


def _parse_or_mark(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse_request(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:  # DecodeError, or anything a corrupt message makes protobuf raise
            return UNPARSABLE

    return parse_request


def _guarded(handler: Any) -> Any:
    """A generated method handler whose unparsable requests are answered ``INTERNAL`` as the
    proxy's (grpc.aio would answer ``UNKNOWN`` and log a traceback); a stream's unparsable command
    reaches the method as :data:`UNPARSABLE`."""
    parse = _parse_or_mark(handler.request_deserializer)
    if handler.unary_unary is not None and inspect.iscoroutinefunction(handler.unary_unary):
        call = handler.unary_unary

        async def unary(request: Any, context: Any) -> Any:
            if request is UNPARSABLE:
                await context.abort(grpc.StatusCode.INTERNAL, BAD_PROTOBUF)
            return await call(request, context)

        return handler._replace(request_deserializer=parse, unary_unary=unary)
    if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
        stream = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if request is UNPARSABLE:
                await context.abort(grpc.StatusCode.INTERNAL, BAD_PROTOBUF)
            async for answer in stream(request, context):
                yield answer

        return handler._replace(request_deserializer=parse, unary_stream=unary_stream)
    return handler._replace(request_deserializer=parse)


class Guarded:
    """Takes the generated code's method handlers for a server, :func:`_guarded`."""

    def __init__(self, server: aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers come to add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        guarded = {name: _guarded(handler) for name, handler in handlers.items()}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, guarded),))
        self.server.add_registered_method_handlers(service, guarded)


__all__ = ["BAD_PROTOBUF", "UNPARSABLE", "Guarded"]
