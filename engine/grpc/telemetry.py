"""The door's live ``Telemetry`` streams, as RocketMQ 5's proxy keeps them (its ``GrpcClientChannel``).

A 5.x client opens one stream per endpoint and sends its settings first; the door answers with its
own and then keeps the stream to send what only a server starts:

* ``RecoverOrphanedTransactionCommand`` to a producer of the half message's group (the proxy's
  producer group of a 5.x client is the topic it publishes to), answered by its ``EndTransaction``;
* ``PrintThreadStackTraceCommand`` and ``VerifyMessageCommand`` (RocketMQ's admin asks, through the
  proxy, for a client's stacks or to consume one message directly), answered on the stream by
  ``ThreadStackTrace`` / ``VerifyMessageResult`` with the command's nonce: :meth:`Streams.ask` waits
  for that answer, never longer than its timeout.

What a client sends the door matches to what the door asked by nonce; an answer to nothing is
dropped, as the proxy drops it. Everything here runs on the door's event loop.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from engine.errors import InvalidArgumentError
from engine.grpc.v2 import definition_pb2 as pb
from engine.grpc.v2 import service_pb2 as spb


@dataclass(eq=False)
class Stream:
    """One client's open Telemetry stream: what the door sends it waits in :attr:`outbox` (None:
    the stream ends)."""

    client_id: str
    outbox: asyncio.Queue[spb.TelemetryCommand | None] = field(default_factory=asyncio.Queue)
    settings: pb.Settings | None = None
    refused: str | None = None  # why the door ends the stream INVALID_ARGUMENT

    def producer_groups(self) -> set[str]:
        """The producer groups the client stands for: the topics it publishes to (the proxy's)."""
        if self.settings is None or not self.settings.HasField("publishing"):
            return set()
        return {topic.name for topic in self.settings.publishing.topics}

    def send(self, command: spb.TelemetryCommand) -> None:
        self.outbox.put_nowait(command)


# The kinds of answer a client sends to a server's command, and the command each answers.
ANSWERS = {
    "thread_stack_trace": "print_thread_stack_trace_command",
    "verify_message_result": "verify_message_command",
}


class Streams:
    """The door's open Telemetry streams, and the answers it waits for."""

    def __init__(self) -> None:
        self._streams: list[Stream] = []
        self._waiting: dict[str, asyncio.Future[spb.TelemetryCommand]] = {}
        self._nonces = itertools.count(1)

    def open(self, client_id: str) -> Stream:
        stream = Stream(client_id)
        self._streams.append(stream)
        return stream

    def close(self, stream: Stream) -> None:
        if stream in self._streams:
            self._streams.remove(stream)

    def producer_groups(self) -> set[str]:
        """Every producer group with an open stream."""
        return {group for stream in self._streams for group in stream.producer_groups()}

    def producers_of(self, group: str) -> list[Stream]:
        """The open streams of producers of ``group``, the newest first."""
        return [s for s in reversed(self._streams) if group in s.producer_groups()]

    def of_client(self, client_id: str) -> Stream | None:
        """The newest open stream of a client."""
        return next((s for s in reversed(self._streams) if s.client_id == client_id), None)

    def take_answer(self, command: spb.TelemetryCommand) -> bool:
        """A client's answer to a command the door sent (matched by nonce); False for an answer to
        nothing (dropped, as the proxy drops it)."""
        kind = command.WhichOneof("command")
        if kind not in ANSWERS:
            return False
        waiting = self._waiting.pop(getattr(command, kind).nonce, None)
        if waiting is None or waiting.done():
            return False
        waiting.set_result(command)
        return True

    async def ask(
        self, client_id: str, command: spb.TelemetryCommand, timeout_s: float
    ) -> spb.TelemetryCommand:
        """Send a client ``command`` (a thread-stack or verify command; its nonce is set here) and
        wait for the client's answer.

        Raises:
            InvalidArgumentError: the client has no open stream, or it did not answer in ``timeout_s``.
        """
        stream = self.of_client(client_id)
        if stream is None:
            raise InvalidArgumentError(
                f"client {client_id!r} has no open telemetry stream", status="NOT_FOUND"
            )
        kind = command.WhichOneof("command")
        if kind not in ANSWERS.values():
            raise InvalidArgumentError(f"{kind!r} is not a command a client answers", status="BAD_REQUEST")
        nonce = f"lakemq-{next(self._nonces)}"
        getattr(command, kind).nonce = nonce
        answer: asyncio.Future[spb.TelemetryCommand] = asyncio.get_running_loop().create_future()
        self._waiting[nonce] = answer
        try:
            stream.send(command)
            return await asyncio.wait_for(answer, timeout_s)
        except TimeoutError:
            raise InvalidArgumentError(
                f"client {client_id!r} did not answer {kind} in {timeout_s} s", status="PROXY_TIMEOUT"
            ) from None
        finally:
            self._waiting.pop(nonce, None)
