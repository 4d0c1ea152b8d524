"""The admin requests about connected clients (what ``mqadmin consumerConnection``,
``producerConnection``, ``consumerStatus`` and ``queryMsgById -g -d`` send): consumer and producer
connection lists, and the two requests the broker forwards to one consumer client and answers with
that client's own response (GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY).

Who is a member of a group comes from the store's ``groups`` table (live heartbeats, wire and Python
consumers alike); how a member connects (address, language, version, consume type) comes from its
heartbeats over the wire, recorded here as they pass on to :mod:`engine.remoting.handlers.clients`.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from dataclasses import dataclass, field

from engine.client.membership import live_subscriptions
from engine.client.queries import view_message
from engine.errors import RemotingProtocolError
from engine.protocol.message_ids import make_msg_id
from engine.protocol.names import validate_group_name
from engine.protocol.tags import java_string_hashcode
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import BROKER_NAME, WIRE_MEMBER_TIMEOUT_MS, BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.handlers import clients
from engine.remoting.headers import Header, json_body, json_bytes
from engine.remoting.message_layout import encode_stored, parse_offset_msg_id
from engine.remoting.wire_messages import to_wire
from engine.store.store import now_ms

CALL_CLIENT_TIMEOUT_S = 10.0  # Broker2Client.callClient waits 10 s for the client's answer


@dataclass
class ConsumerSeen:
    """What a consumer's latest heartbeat said about one group."""

    consume_type: str
    message_model: str
    consume_from_where: str
    expression_types: dict[str, str]
    heartbeat_ms: int


@dataclass
class ClientSeen:
    """What a connection's heartbeats said: the client's language and version, its consumers."""

    language: str = "JAVA"
    version: int = 0
    heartbeat_ms: int = 0
    consumers: dict[str, ConsumerSeen] = field(default_factory=dict)


_SEEN: weakref.WeakKeyDictionary[Connection, ClientSeen] = weakref.WeakKeyDictionary()


def seen(conn: Connection) -> ClientSeen | None:
    """What the heartbeats over ``conn`` said, None when none came."""
    return _SEEN.get(conn)


def record_heartbeat(conn: Connection, cmd: RemotingCommand) -> None:
    """Remember a heartbeat's client details (a body that is not a heartbeat is left to its handler)."""
    try:
        body = json_body(cmd.body, "heartbeat")
    except RemotingProtocolError:
        return
    if not isinstance(body, dict):
        return
    info = _SEEN.setdefault(conn, ClientSeen())
    info.language, info.version, info.heartbeat_ms = cmd.language, cmd.version, now_ms()
    for data in body.get("consumerDataSet") or []:
        if not isinstance(data, dict) or not isinstance(data.get("groupName"), str):
            continue
        types = {
            str(s["topic"]): str(s.get("expressionType") or "TAG")
            for s in data.get("subscriptionDataSet") or []
            if isinstance(s, dict) and s.get("topic")
        }
        info.consumers[data["groupName"]] = ConsumerSeen(
            str(data.get("consumeType") or "CONSUME_PASSIVELY"),
            str(data.get("messageModel") or "CLUSTERING"),
            str(data.get("consumeFromWhere") or "CONSUME_FROM_LAST_OFFSET"),
            types,
            now_ms(),
        )


async def heartbeat(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
    """HEART_BEAT: recorded for the connection lists, then handled by the clients module's handler
    (looked up at call time, so that handler stays the one place heartbeats are served)."""
    record_heartbeat(conn, cmd)
    return await clients.HANDLERS[RequestCode.HEART_BEAT](ctx, conn, cmd)


def client_addr(conn: Connection) -> str:
    """``ip:port`` of a connection's peer, as RocketMQ's ``parseChannelRemoteAddr`` prints it."""
    address = conn.address
    return conn.peer if address is None else f"{address[0]}:{address[1]}"


def find_consumer(ctx: BrokerContext, group: str, client_id: str) -> Connection | None:
    """The connection over which ``client_id`` consumes in ``group`` (None when not connected)."""
    for conn in list(ctx.connections):
        if conn.consumer_groups.get(group) == client_id:
            return conn
    return None


def _connection_json(client_id: str, conn: Connection | None) -> dict[str, object]:
    info = seen(conn) if conn is not None else None
    if conn is None:
        # A member of the store's groups table that is not on this wire (a Python consumer).
        return {"clientId": client_id, "clientAddr": "", "language": "PYTHON", "version": 0}
    return {
        "clientId": client_id,
        "clientAddr": client_addr(conn),
        "language": info.language if info is not None else "OTHER",
        "version": info.version if info is not None else 0,
    }


def subscription_data(topic: str, expression: str, expression_type: str, version: int) -> dict[str, object]:
    """RocketMQ's ``SubscriptionData`` of one subscription (tags and their hash codes for TAG)."""
    tags: list[str] = []
    if expression_type == "TAG" and expression.strip() not in ("", "*"):
        tags = [t.strip() for t in expression.split("||") if t.strip()]
    return {
        "classFilterMode": False,
        "topic": topic,
        "subString": expression,
        "tagsSet": tags,
        "codeSet": [java_string_hashcode(t) for t in tags],
        "subVersion": version,
        "expressionType": expression_type,
    }


def consumer_connection_sync(ctx: BrokerContext, group: str) -> dict[str, object] | None:
    """RocketMQ's ``ConsumerConnection`` of a group from its live members; None when none is live."""
    members = live_subscriptions(ctx.store, WIRE_MEMBER_TIMEOUT_MS).get(group)
    if not members:
        return None
    connections = []
    subscriptions: dict[str, dict[str, object]] = {}
    group_seen: ConsumerSeen | None = None
    for client_id, subs in sorted(members.items()):
        conn = find_consumer(ctx, group, client_id)
        connections.append(_connection_json(client_id, conn))
        info = seen(conn) if conn is not None else None
        mine = info.consumers.get(group) if info is not None else None
        group_seen = group_seen or mine
        for topic, expression in sorted(subs.items()):
            kind = mine.expression_types.get(topic, "TAG") if mine is not None else "TAG"
            stamp = mine.heartbeat_ms if mine is not None else 0
            subscriptions.setdefault(topic, subscription_data(topic, expression, kind, stamp))
    return {
        "connectionSet": connections,
        "subscriptionTable": subscriptions,
        "consumeType": group_seen.consume_type if group_seen else "CONSUME_PASSIVELY",
        "messageModel": group_seen.message_model if group_seen else "CLUSTERING",
        "consumeFromWhere": group_seen.consume_from_where if group_seen else "CONSUME_FROM_LAST_OFFSET",
    }


async def consumer_connection_list(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """GET_CONSUMER_CONNECTION_LIST: the group's live members and how they connect, or
    CONSUMER_NOT_ONLINE."""
    group = validate_group_name(Header(cmd.ext_fields).text("consumerGroup"))
    body = await ctx.run(consumer_connection_sync, ctx, group)
    if body is None:
        return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes(body))


async def producer_connection_list(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """GET_PRODUCER_CONNECTION_LIST: the connections a producer of the group sent or heartbeat over."""
    group = Header(cmd.ext_fields).text("producerGroup")
    connections = []
    for producer in ctx.producers_of(group):
        for client_id in sorted(producer.client_ids) or [client_addr(producer)]:
            connections.append(_connection_json(client_id, producer))
    if not connections:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes({"connectionSet": connections}))


async def all_producer_info(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_ALL_PRODUCER_INFO: ``ProducerTableInfo``, every producer group's connections (``producer``)."""
    table: dict[str, list[dict[str, object]]] = {}
    for producer in list(ctx.connections):
        info = seen(producer)
        for group in sorted(producer.producer_groups):
            for client_id in sorted(producer.client_ids) or [client_addr(producer)]:
                table.setdefault(group, []).append(
                    {
                        "clientId": client_id,
                        "remoteIP": "/" + client_addr(producer),
                        "language": info.language if info is not None else "OTHER",
                        "version": info.version if info is not None else 0,
                        "lastUpdateTimestamp": info.heartbeat_ms if info is not None else 0,
                    }
                )
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes({"data": table}))


# ----------------------------------------------------------------- requests forwarded to a client
class ClientCalls:
    """Requests the broker sends to a connected client, each awaiting the client's response."""

    def __init__(self) -> None:
        # Opaques of the broker's own requests: far from the ones its check-back and notices use.
        self._ids = itertools.count(1 << 30)
        self._waiting: dict[tuple[int, int], asyncio.Future[RemotingCommand]] = {}

    async def call(self, conn: Connection, request: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send ``request`` to ``conn``'s client and return its response.

        Raises:
            TimeoutError: no response within ``timeout_s``.
            ConnectionError, OSError: the connection broke.
        """
        opaque = next(self._ids) & 0x7FFFFFFF
        key = (id(conn), opaque)
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        try:
            await conn.send(
                RemotingCommand(request.code, opaque=opaque, ext_fields=request.ext_fields, body=request.body)
            )
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._waiting.pop(key, None)

    def deliver(self, conn: Connection, response: RemotingCommand) -> bool:
        """Hand a client's response to the call awaiting it; False when none awaits it."""
        future = self._waiting.get((id(conn), response.opaque))
        if future is None or future.done():
            return False
        future.set_result(response)
        return True


_CALLS: weakref.WeakKeyDictionary[BrokerContext, ClientCalls] = weakref.WeakKeyDictionary()


def client_calls(ctx: BrokerContext) -> ClientCalls:
    """The forwarded calls of one endpoint."""
    calls = _CALLS.get(ctx)
    if calls is None:
        calls = _CALLS[ctx] = ClientCalls()
    return calls


def deliver_response(ctx: BrokerContext, conn: Connection, response: RemotingCommand) -> bool:
    """A response a client sent over ``conn``: to the forwarded call awaiting it (False: none)."""
    return client_calls(ctx).deliver(conn, response)


async def call_consumer(
    ctx: BrokerContext, cmd: RemotingCommand, group: str, client_id: str, *, body: bytes | None = None,
    extra: dict[str, str] | None = None, timeout_s: float = CALL_CLIENT_TIMEOUT_S,
) -> RemotingCommand:  # fmt: skip
    """Forward ``cmd`` to the consumer ``client_id`` of ``group`` and answer with its response, as
    RocketMQ's ``AdminBrokerProcessor#callConsumer`` does (its error codes and remarks included)."""
    target = find_consumer(ctx, group, client_id)
    if target is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online")
    fields = {**cmd.ext_fields, **(extra or {})}
    request = RemotingCommand(cmd.code, ext_fields=fields, body=cmd.body if body is None else body)
    try:
        answer = await client_calls(ctx).call(target, request, timeout_s)
    except TimeoutError as exc:
        return cmd.response(
            ResponseCode.CONSUME_MSG_TIMEOUT, f"consumer <{group}> <{client_id}> Timeout: {exc!r}"
        )
    except (ConnectionError, OSError, RuntimeError) as exc:
        return cmd.response(
            ResponseCode.SYSTEM_ERROR, f"invoke consumer <{group}> <{client_id}> Exception: {exc!r}"
        )
    return cmd.response(answer.code, answer.remark, ext_fields=answer.ext_fields, body=answer.body)


async def consumer_running_info(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """GET_CONSUMER_RUNNING_INFO: asked of the consumer client itself."""
    header = Header(cmd.ext_fields)
    return await call_consumer(ctx, cmd, header.text("consumerGroup"), header.text("clientId"))


def _stored_message(ctx: BrokerContext, msg_id: str) -> bytes:
    message = view_message(
        ctx.store, make_msg_id(ctx.store.store_id, parse_offset_msg_id(msg_id)[2]), index=ctx.index
    )
    return encode_stored(to_wire(message, (ctx.host, ctx.port)))


async def consume_message_directly(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """CONSUME_MESSAGE_DIRECTLY: the stored message handed to one consumer's listener, which answers."""
    header = Header(cmd.ext_fields)
    group, client_id = header.text("consumerGroup"), header.text("clientId", "")
    body = await ctx.run(_stored_message, ctx, header.text("msgId"))
    return await call_consumer(ctx, cmd, group, client_id, body=body, extra={"brokerName": BROKER_NAME})


HANDLERS: dict[int, Handler] = {
    RequestCode.HEART_BEAT: heartbeat,
    RequestCode.GET_CONSUMER_CONNECTION_LIST: consumer_connection_list,
    RequestCode.GET_PRODUCER_CONNECTION_LIST: producer_connection_list,
    RequestCode.GET_ALL_PRODUCER_INFO: all_producer_info,
    RequestCode.GET_CONSUMER_RUNNING_INFO: consumer_running_info,
    RequestCode.CONSUME_MESSAGE_DIRECTLY: consume_message_directly,
}
