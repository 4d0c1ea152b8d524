"""Client management: heartbeats into the engine's group membership, the consumer list a client
rebalances with, unregistering, and the orderly consumer's batch queue locks."""

from __future__ import annotations

import logging
from typing import Any

from engine.client.membership import live_members
from engine.errors import RemotingProtocolError
from engine.protocol.names import validate_group_name
from engine.protocol.rebalance import MessageModel, MessageQueue
from engine.remoting.codes import RPC_ONEWAY, RequestCode, ResponseCode
from engine.remoting.context import BROKER_NAME, WIRE_MEMBER_TIMEOUT_MS, BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header, json_body, json_bytes

_log = logging.getLogger(__name__)
INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"  # every Java client's own producer (send-back fallback)


def _consumers(body: Any) -> list[tuple[str, MessageModel, dict[str, tuple[str, str]]]]:
    """(group, model, topic -> (expression, type)) of each consumer in a heartbeat."""
    out = []
    for data in body.get("consumerDataSet") or []:
        if not isinstance(data, dict):
            raise RemotingProtocolError("consumerDataSet holds a non-object", field="consumerDataSet")
        group = validate_group_name(data.get("groupName"))
        model = (
            MessageModel.BROADCASTING
            if data.get("messageModel") == "BROADCASTING"
            else MessageModel.CLUSTERING
        )
        subs = {
            str(s["topic"]): (str(s.get("subString") or "*"), str(s.get("expressionType") or "TAG"))
            for s in data.get("subscriptionDataSet") or []
            if isinstance(s, dict) and s.get("topic")
        }
        out.append((group, model, subs))
    return out


def _heartbeat_sync(
    ctx: BrokerContext, client_id: str, consumers: list[tuple[str, MessageModel, dict[str, tuple[str, str]]]]
) -> list[str]:
    """Record each consumer's heartbeat; the groups this client just joined."""
    joined = []
    for group, model, subs in consumers:
        member = ctx.membership(group, client_id, model)
        if client_id not in member.live_members():
            joined.append(group)
        member.heartbeat({topic: expr for topic, (expr, _) in subs.items()})
        if model is MessageModel.CLUSTERING:
            ctx.ensure_retry_topic(group)
        ctx.resets.watch(group)
    return joined


async def heartbeat(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """HEART_BEAT: producers and consumers of a client, consumers into the group membership."""
    body = json_body(cmd.body, "heartbeat")
    if not isinstance(body, dict) or not isinstance(body.get("clientID"), str) or not body["clientID"]:
        raise RemotingProtocolError("heartbeat body needs a clientID", field="clientID")
    client_id = body["clientID"]
    conn.client_ids.add(client_id)
    for data in body.get("producerDataSet") or []:
        if isinstance(data, dict) and data.get("groupName") and data["groupName"] != INNER_PRODUCER_GROUP:
            conn.producer_groups.add(str(data["groupName"]))
    consumers = _consumers(body)
    changed = set()
    for group, _, subs in consumers:
        known = ctx.subscriptions.get(group)
        if known is not None and known != subs:
            changed.add(group)
        ctx.subscriptions[group] = subs
        conn.consumer_groups[group] = client_id
    joined = await ctx.run(_heartbeat_sync, ctx, client_id, consumers)
    # RocketMQ's ConsumerManager notifies every channel of the group, the joining one included
    # (getAllChannel), when a channel joins or a subscription changes: a joiner whose first rebalance
    # found the list without itself (it asked before its heartbeat counted, or the answer was late)
    # rebalances again now rather than at its next round (20 s by default).
    for group in sorted(changed | set(joined)):
        await notify_ids_changed(ctx, group)
    return cmd.response(ResponseCode.SUCCESS)


async def notify_ids_changed(ctx: BrokerContext, group: str, exclude: Connection | None = None) -> None:
    """Tell the group's connected consumers (but ``exclude``) to rebalance now
    (NOTIFY_CONSUMER_IDS_CHANGED)."""
    for other in list(ctx.connections):
        if other is exclude or group not in other.consumer_groups:
            continue
        note = RemotingCommand(
            RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, flag=RPC_ONEWAY, ext_fields={"consumerGroup": group}
        )
        try:
            await other.send(note)
        except (ConnectionError, OSError) as exc:
            _log.debug("could not notify %s: %s", other.peer, exc)


def leave_sync(ctx: BrokerContext, group: str, client_id: str) -> None:
    """A client left a group: a LEAVE row, so the others rebalance without waiting for expiry."""
    member = ctx.forget_member(group, client_id)
    if member is None:
        member = ctx.membership(group, client_id)
        ctx.forget_member(group, client_id)
    member.leave()


async def unregister_client(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """UNREGISTER_CLIENT: a client shut its producer or consumer of a group down."""
    header = Header(cmd.ext_fields)
    client_id = header.text("clientID")
    producer_group = header.optional("producerGroup")
    if producer_group:
        conn.producer_groups.discard(producer_group)
    group = header.optional("consumerGroup")
    if group:
        conn.consumer_groups.pop(group, None)
        await ctx.run(leave_sync, ctx, validate_group_name(group), client_id)
        await notify_ids_changed(ctx, group, exclude=conn)
    return cmd.response(ResponseCode.SUCCESS)


async def consumer_list(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_CONSUMER_LIST_BY_GROUP: the group's live members, what a client rebalances over."""
    group = validate_group_name(Header(cmd.ext_fields).text("consumerGroup"))
    members = await ctx.run(live_members, ctx.store, group, WIRE_MEMBER_TIMEOUT_MS)
    if not members:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes({"consumerIdList": members}))


def _lock_request(cmd: RemotingCommand) -> tuple[str, str, list[MessageQueue]]:
    body = json_body(cmd.body, "lock")
    if not isinstance(body, dict):
        raise RemotingProtocolError("lock body must be an object", field="body")
    group = validate_group_name(body.get("consumerGroup"))
    client_id = body.get("clientId")
    if not isinstance(client_id, str) or not client_id:
        raise RemotingProtocolError("lock body needs a clientId", field="clientId")
    queues = []
    for mq in body.get("mqSet") or []:
        try:
            queues.append(MessageQueue(str(mq["topic"]), int(mq["queueId"])))
        except (KeyError, TypeError, ValueError):
            raise RemotingProtocolError(f"lock body holds a bad queue: {mq!r}", field="mqSet") from None
    return group, client_id, queues


def _mq_json(mq: MessageQueue) -> dict[str, object]:
    return {"topic": mq.topic, "brokerName": BROKER_NAME, "queueId": mq.queue_id}


async def lock_batch(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """LOCK_BATCH_MQ: the engine's orderly queue locks; answers the queues now held."""
    group, client_id, queues = _lock_request(cmd)
    held = await ctx.run(lambda: ctx.membership(group, client_id).lock(queues))
    body = {"lockOKMQSet": [_mq_json(mq) for mq in sorted(held)]}
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes(body))


async def unlock_batch(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """UNLOCK_BATCH_MQ: release the client's locks."""
    group, client_id, queues = _lock_request(cmd)
    await ctx.run(lambda: ctx.membership(group, client_id).unlock(queues))
    return cmd.response(ResponseCode.SUCCESS)


async def check_client_config(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """CHECK_CLIENT_CONFIG: accepted (the engine's filters need no class server)."""
    return cmd.response(ResponseCode.SUCCESS)


HANDLERS: dict[int, Handler] = {
    RequestCode.HEART_BEAT: heartbeat,
    RequestCode.UNREGISTER_CLIENT: unregister_client,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer_list,
    RequestCode.LOCK_BATCH_MQ: lock_batch,
    RequestCode.UNLOCK_BATCH_MQ: unlock_batch,
    RequestCode.CHECK_CLIENT_CONFIG: check_client_config,
}
