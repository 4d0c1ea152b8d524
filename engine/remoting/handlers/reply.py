"""Request-reply (RocketMQ 4.7+): SEND_REPLY_MESSAGE (V1 and V2 headers) and the broker's
PUSH_REPLY_MESSAGE_TO_CLIENT, as RocketMQ's ReplyMessageProcessor does them.

A requester (``DefaultMQProducer.request``) sends an ordinary message carrying CORRELATION_ID,
REPLY_TO_CLIENT (its client id) and TTL; the door keeps them, and every message leaves with the
cluster's name (CLUSTER). The responder builds its reply with ``MessageUtil.createReplyMessage``:
topic ``<cluster>_REPLY_TOPIC``, sent with SEND_REPLY_MESSAGE_V2. The broker pushes the reply to
the connection the requester's client id heartbeated over (PUSH_REPLY_MESSAGE_TO_CLIENT, answered
by the client) and, as RocketMQ's ``storeReplyMessageEnable`` (on by default), stores it in the
reply topic too. The responder's send succeeds when the push did (else SYSTEM_ERROR with why).
"""

from __future__ import annotations

import logging

from engine.errors import InvalidMessageError
from engine.model import SendResult
from engine.protocol.messages import MAX_BODY_BYTES
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.handlers.admin_clients import client_calls
from engine.remoting.handlers.namesrv import ensure_reply_topic
from engine.remoting.handlers.send import V2_ALIASES
from engine.remoting.headers import Header
from engine.remoting.message_layout import decode_properties, encode_properties, offset_msg_id
from engine.remoting.wire_messages import (
    PROPERTY_PUSH_REPLY_TIME,
    PROPERTY_REPLY_TO_CLIENT,
    REPLY_TOPIC,
    incoming,
    inflate,
)
from engine.store.store import now_ms

_log = logging.getLogger(__name__)

# How long the broker waits for the requester's client to take a pushed reply (Broker2Client's).
PUSH_TIMEOUT_S = 10.0
# The header fields of the send passed on in the push (ReplyMessageRequestHeader's own).
_PASSED_ON = (
    "producerGroup",
    "topic",
    "defaultTopic",
    "defaultTopicQueueNums",
    "queueId",
    "sysFlag",
    "bornTimestamp",
    "flag",
    "reconsumeTimes",
    "unitMode",
)


def requester_of(ctx: BrokerContext, client_id: str) -> Connection | None:
    """The connection a client id last heartbeated over (None: not connected here)."""
    found = [c for c in ctx.connections if client_id in c.client_ids]
    return found[-1] if found else None


async def send_reply(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """SEND_REPLY_MESSAGE / SEND_REPLY_MESSAGE_V2: push the reply to its requester, then store it."""
    header = Header(cmd.ext_fields, V2_ALIASES if cmd.code == RequestCode.SEND_REPLY_MESSAGE_V2 else None)
    topic = header.text("topic")
    queue_id = header.int32("queueId", 0)
    if not cmd.body or len(cmd.body) > MAX_BODY_BYTES:
        raise InvalidMessageError(f"reply body is {len(cmd.body)} bytes; 1..{MAX_BODY_BYTES} are allowed")
    properties = decode_properties(header.text("properties", ""))
    born_host = conn.address
    pushed, why = await _push(ctx, header, cmd.body, properties, born_host)
    stored: SendResult | None = None
    try:  # stored whether or not the push went through, as RocketMQ's broker does
        if topic == REPLY_TOPIC:
            await ctx.run(ensure_reply_topic, ctx)
        item = incoming(
            topic,
            inflate(cmd.body, header.int32("sysFlag", 0)),
            properties,
            born_host=born_host,
            flag=header.int32("flag", 0),
            born_ts_ms=header.int64("bornTimestamp", 0),
        )
        queued = await ctx.run(ctx.producer.send_wire_grouped, item, queue_id)
        stored = await ctx.landings.wait(queued.future)
    except Exception as exc:  # the reply reached its requester all the same
        _log.warning("reply to %s not stored: %s", topic, exc)
    if not pushed:
        return cmd.response(ResponseCode.SYSTEM_ERROR, why)
    fields: dict[str, object] = {"msgId": "0", "queueId": queue_id, "queueOffset": 0}
    if stored is not None:
        fields = {
            "msgId": offset_msg_id(ctx.host, ctx.port, stored.physical_offset),
            "queueId": stored.queue_id,
            "queueOffset": stored.queue_offset,
        }
    return cmd.response(ResponseCode.SUCCESS, ext_fields=fields)


async def _push(
    ctx: BrokerContext,
    header: Header,
    body: bytes,
    properties: dict[str, str],
    born_host: tuple[str, int] | None,
) -> tuple[bool, str]:
    """PUSH_REPLY_MESSAGE_TO_CLIENT to the requester: (pushed, why not)."""
    client_id = properties.get(PROPERTY_REPLY_TO_CLIENT)
    if not client_id:
        return False, f"reply message properties[{PROPERTY_REPLY_TO_CLIENT}] is null"
    requester = requester_of(ctx, client_id)
    if requester is None:
        return False, f"push reply message fail, channel of <{client_id}> not found."
    fields = {name: value for name in _PASSED_ON if (value := header.optional(name)) is not None}
    fields["properties"] = encode_properties({**properties, PROPERTY_PUSH_REPLY_TIME: str(now_ms())})
    fields["bornHost"] = f"{born_host[0]}:{born_host[1]}" if born_host else ""
    fields["storeHost"] = ctx.address
    fields["storeTimestamp"] = str(now_ms())
    push = RemotingCommand(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, ext_fields=fields, body=body)
    try:
        answer = await client_calls(ctx).call(requester, push, PUSH_TIMEOUT_S)
    except (TimeoutError, ConnectionError, OSError) as exc:
        return False, f"push reply message to {client_id} fail: {exc!r}"
    if answer.code != ResponseCode.SUCCESS:
        return False, f"push reply message to {client_id} fail: {answer.remark}"
    return True, ""


HANDLERS: dict[int, Handler] = {
    RequestCode.SEND_REPLY_MESSAGE: send_reply,
    RequestCode.SEND_REPLY_MESSAGE_V2: send_reply,
}
