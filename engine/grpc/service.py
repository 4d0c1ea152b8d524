"""The door's ``MessagingService`` calls (what each answers: :mod:`engine.grpc.server`).

Each call checks its request, asks the :class:`~engine.grpc.server.GrpcServer` it serves for the
engine's work (on the door's threads: :meth:`~engine.grpc.server.GrpcServer.call`) and answers a
status (:mod:`engine.grpc.statuses`); none raises to grpc. ``Telemetry`` reads what a client sends
on its stream while the door's commands go out on it (:mod:`engine.grpc.telemetry`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio

from engine.client.simple import MAX_RECEIVE_NUMS
from engine.errors import InvalidArgumentError
from engine.grpc.messages import ACCEPTED_TYPES, to_proto
from engine.grpc.statuses import status, status_of
from engine.grpc.telemetry import ANSWERS, Stream
from engine.grpc.transactions import transaction_id
from engine.grpc.unparsable import BAD_PROTOBUF, UNPARSABLE
from engine.grpc.v2 import definition_pb2 as pb
from engine.grpc.v2 import service_pb2 as spb
from engine.grpc.v2 import service_pb2_grpc as spb_grpc
from engine.protocol.rocketmq5 import (
    MIN_INVISIBLE_MS_FOR_RECEIVE,
    check_group,
    check_invisible_ms,
    edge_error,
    long_polling_ms,
)
from engine.protocol.selectors import MessageSelector
from engine.protocol.transactions import HalfMessage
from engine.store.store import now_ms

if TYPE_CHECKING:
    from engine.grpc.server import ClientState, GrpcServer

AUTO_RENEW_INVISIBLE_MS = 60_000  # the proxy's defaultInvisibleTimeMills
CLIENT_ID = "x-mq-client-id"
LANGUAGE = "x-mq-language"
# RocketMQ's lite topics (LitePushConsumer / LiteSimpleConsumer) are not served: their settings
# say a quota of 0 lite subscriptions (the client refuses subscribe_lite itself), their heartbeats
# and receives are answered UNRECOGNIZED_CLIENT_TYPE as RocketMQ 5.3's proxy answers a client type
# it does not know, and SyncLiteSubscription is UNIMPLEMENTED (a method the proxy lacks).
LITE_CLIENTS = frozenset({pb.LITE_PUSH_CONSUMER, pb.LITE_SIMPLE_CONSUMER})


def _client_id(context: aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID and isinstance(value, str) and value:
            return value
    raise edge_error("CLIENT_ID_REQUIRED", f"the request carries no {CLIENT_ID} header")


def _language(context: aio.ServicerContext) -> str | None:
    """The client's ``x-mq-language`` header (JAVA, PYTHON, ...), if it sent one."""
    for key, value in context.invocation_metadata() or ():
        if key == LANGUAGE and isinstance(value, str) and value:
            return value
    return None


def _unrecognized(client_type: int) -> InvalidArgumentError:
    name = pb.ClientType.Name(client_type)  # type: ignore[arg-type]
    return edge_error("UNRECOGNIZED_CLIENT_TYPE", f"{name}: lite topics are not served here")


def _duration_ms(duration: Any) -> int:
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000


def _selector(expression: pb.FilterExpression) -> MessageSelector:
    if expression.type == pb.SQL:
        return MessageSelector.by_sql(expression.expression)
    return MessageSelector.by_tag(expression.expression or "*")


class Service(spb_grpc.MessagingServiceServicer):
    """The calls; each answers a status, never raises to grpc (an error is a status)."""

    def __init__(self, door: GrpcServer) -> None:
        self.door = door

    def _client(self, context: Any) -> ClientState:
        """The calling client (seen now).

        Raises:
            InvalidArgumentError: no client id (``CLIENT_ID_REQUIRED``).
        """
        return self.door.client(_client_id(context))

    async def QueryRoute(self, request: Any, context: Any) -> Any:
        try:
            self._client(context)
            config = await self.door.call(self.door.topic, request.topic.name)
        except Exception as exc:
            return spb.QueryRouteResponse(status=status_of(exc))
        return spb.QueryRouteResponse(status=status(pb.OK), message_queues=self.door.route_queues(config))

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        try:
            self._client(context)
            if request.client_type in LITE_CLIENTS:
                raise _unrecognized(request.client_type)
            if request.HasField("group"):
                check_group(request.group.name)
        except Exception as exc:
            return spb.HeartbeatResponse(status=status_of(exc))
        return spb.HeartbeatResponse(status=status(pb.OK))

    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        try:
            self._client(context)
            check_group(request.group.name)
            config = await self.door.call(self.door.topic, request.topic.name)
        except Exception as exc:
            return spb.QueryAssignmentResponse(status=status_of(exc))
        queue = pb.MessageQueue(id=-1, permission=pb.READ_WRITE)
        queue.topic.name = config.name
        self.door.fill_broker(queue.broker)
        queue.accept_message_types.extend(ACCEPTED_TYPES.get(config.type, (pb.NORMAL,)))
        return spb.QueryAssignmentResponse(
            status=status(pb.OK), assignments=[pb.Assignment(message_queue=queue)]
        )

    async def SendMessage(self, request: Any, context: Any) -> Any:
        try:
            self._client(context)
            if not request.messages:
                raise edge_error("BAD_REQUEST", "no message to send")
            results = await self.door.call(self.door.send, request, _language(context))
        except Exception as exc:
            return spb.SendMessageResponse(status=status_of(exc))
        entries = []
        for result in results:
            if isinstance(result, BaseException):
                entries.append(spb.SendResultEntry(status=status_of(result)))
            elif isinstance(result, HalfMessage):
                entries.append(
                    spb.SendResultEntry(
                        status=status(pb.OK),
                        message_id=result.uniq_key,
                        transaction_id=transaction_id(result),
                    )
                )
            else:
                entries.append(
                    spb.SendResultEntry(
                        status=status(pb.OK), message_id=result.msg_id, offset=result.queue_offset
                    )
                )
        codes = {entry.status.code for entry in entries}
        overall = entries[0].status if len(codes) == 1 else status(pb.MULTIPLE_RESULTS)
        return spb.SendMessageResponse(status=overall, entries=entries)

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            client_id = self._client(context).client_id
            group = check_group(request.group.name)
            topic = request.message_queue.topic.name
            await self.door.call(self.door.topic, topic)
            settings = self.door.client(client_id).settings
            if settings is not None and settings.client_type in LITE_CLIENTS:
                raise _unrecognized(settings.client_type)
            timeout_ms = _duration_ms(settings.request_timeout) if settings is not None else 3000
            remaining = context.time_remaining()
            wait_ms = long_polling_ms(
                _duration_ms(request.long_polling_timeout)
                if request.HasField("long_polling_timeout")
                else None,
                None if remaining is None else int(remaining * 1000),
                timeout_ms,
            )
            if request.auto_renew and not request.HasField("invisible_duration"):
                invisible_ms = AUTO_RENEW_INVISIBLE_MS
            else:
                invisible_ms = check_invisible_ms(
                    _duration_ms(request.invisible_duration), MIN_INVISIBLE_MS_FOR_RECEIVE
                )
            selector = _selector(request.filter_expression)
            batch = min(max(request.batch_size, 1), MAX_RECEIVE_NUMS)
            pending = self.door.submit_receive(
                group, client_id, topic, selector, batch, invisible_ms, wait_ms
            )
            try:
                got = await asyncio.wrap_future(pending)
            except asyncio.CancelledError:  # the client left during the wait
                pending.add_done_callback(functools.partial(self.door.hand_back_later, group, client_id))
                raise
        except Exception as exc:
            yield spb.ReceiveMessageResponse(status=status_of(exc))
            return
        if not got:
            yield spb.ReceiveMessageResponse(status=status(pb.MESSAGE_NOT_FOUND, "no new message"))
            return
        written = 0
        try:
            yield spb.ReceiveMessageResponse(status=status(pb.OK))
            # When delivery starts (the proto's delivery_timestamp): the official Python client's
            # PushConsumer computes its receive latency from it and drops a batch without it.
            delivered = spb.ReceiveMessageResponse()
            delivered.delivery_timestamp.FromMilliseconds(now_ms())
            yield delivered
            for message in got:
                handle = self.door.handle_of(group, client_id, message)
                yield spb.ReceiveMessageResponse(
                    message=to_proto(message, handle, message.reconsume_times + 1, invisible_ms)
                )
                written += 1
        finally:
            if written < len(got):  # the client never got these: visible again soon, as the proxy
                self.door.hand_back_soon(group, client_id, got[written:])

    async def AckMessage(self, request: Any, context: Any) -> Any:
        try:
            client_id = self._client(context).client_id
            group = check_group(request.group.name)
        except Exception as exc:
            return spb.AckMessageResponse(status=status_of(exc))
        entries = []
        for entry in request.entries:
            try:
                await self.door.call(self.door.ack, group, client_id, entry.receipt_handle)
                result = status(pb.OK)
            except Exception as exc:
                result = status_of(exc)
            entries.append(
                spb.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=result
                )
            )
        if not entries:
            return spb.AckMessageResponse(status=status(pb.BAD_REQUEST, "no entry to ack"))
        codes = {e.status.code for e in entries}
        overall = entries[0].status if len(codes) == 1 else status(pb.MULTIPLE_RESULTS)
        return spb.AckMessageResponse(status=overall, entries=entries)

    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        try:
            client_id = self._client(context).client_id
            group = check_group(request.group.name)
            invisible_ms = check_invisible_ms(_duration_ms(request.invisible_duration), 0)
            handle = await self.door.call(
                self.door.change_invisible, group, client_id, request.receipt_handle, invisible_ms
            )
        except Exception as exc:
            return spb.ChangeInvisibleDurationResponse(status=status_of(exc))
        return spb.ChangeInvisibleDurationResponse(status=status(pb.OK), receipt_handle=handle)

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        try:
            client_id = self._client(context).client_id
            if request.HasField("group") and request.group.name:
                await self.door.call(self.door.forget_consumer, request.group.name, client_id)
            self.door.forget_client(client_id)
        except Exception as exc:
            return spb.NotifyClientTerminationResponse(status=status_of(exc))
        return spb.NotifyClientTerminationResponse(status=status(pb.OK))

    async def EndTransaction(self, request: Any, context: Any) -> Any:
        try:
            self._client(context)
            await self.door.call(self.door.topic, request.topic.name)
            await self.door.call(self.door.transactions.end, request)
        except Exception as exc:
            return spb.EndTransactionResponse(status=status_of(exc))
        return spb.EndTransactionResponse(status=status(pb.OK))

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        try:
            client_id = self._client(context).client_id
            group = check_group(request.group.name)
            await self.door.call(self.door.topic, request.topic.name)
            await self.door.call(self.door.dead_letter, group, client_id, request.receipt_handle)
        except Exception as exc:
            return spb.ForwardMessageToDeadLetterQueueResponse(status=status_of(exc))
        return spb.ForwardMessageToDeadLetterQueueResponse(status=status(pb.OK))

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        try:
            client_id = self._client(context).client_id
        except Exception as exc:
            yield pb_telemetry(status_of(exc))
            return
        stream = self.door.streams.open(client_id)
        reader = asyncio.create_task(self._read_telemetry(request_iterator, stream))
        try:
            while (command := await stream.outbox.get()) is not None:
                yield command
            if stream.refused:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, stream.refused)
        finally:
            reader.cancel()
            self.door.streams.close(stream)

    async def _read_telemetry(self, request_iterator: Any, stream: Stream) -> None:
        """What a client sends on its stream: settings (answered with the server's), answers to the
        server's commands (matched by nonce); commands only a server sends are ignored, as the
        proxy ignores them. Ends the stream (None in its outbox) when the client ends its side."""
        try:
            async for command in request_iterator:
                if command is UNPARSABLE:
                    stream.refused = BAD_PROTOBUF
                    break
                kind = command.WhichOneof("command")
                if kind == "settings":
                    if command.settings.WhichOneof("pub_sub") is None:
                        stream.refused = "there is no publishing or subscription data in settings"
                        break
                    state = self.door.client(stream.client_id)
                    state.settings = stream.settings = command.settings
                    try:
                        answer = await self.door.call(self.door.settings_for, command.settings)
                    except Exception as exc:
                        stream.send(pb_telemetry(status_of(exc)))
                        continue
                    reply = pb_telemetry(status(pb.OK))
                    reply.settings.CopyFrom(answer)
                    stream.send(reply)
                elif kind in ANSWERS:
                    self.door.streams.take_answer(command)
        except (aio.AioRpcError, aio.UsageError, ConnectionError):  # the client went away
            pass
        finally:
            stream.outbox.put_nowait(None)


def pb_telemetry(result: pb.Status) -> spb.TelemetryCommand:
    command = spb.TelemetryCommand()
    command.status.CopyFrom(result)
    return command


__all__ = ["LITE_CLIENTS", "Service"]
