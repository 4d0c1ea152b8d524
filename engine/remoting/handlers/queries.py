"""Look-ups and topic administration: VIEW_MESSAGE_BY_ID, QUERY_MESSAGE (by key or unique key),
GET_ALL_TOPIC_CONFIG and UPDATE_AND_CREATE_TOPIC, through the engine's admin calls."""

from __future__ import annotations

from engine.client.admin import Admin
from engine.client.queries import query_by_key, query_by_uniq_key, view_message
from engine.errors import TopicExistsError
from engine.model import MessageExt
from engine.protocol.message_ids import make_msg_id
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header, json_bytes
from engine.remoting.message_layout import encode_stored
from engine.remoting.wire_messages import to_wire
from engine.store.store import now_ms


def _encoded(ctx: BrokerContext, messages: list[MessageExt]) -> bytes:
    return b"".join(encode_stored(to_wire(m, (ctx.host, ctx.port))) for m in messages)


async def view_by_id(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """VIEW_MESSAGE_BY_ID: the message at a commit-log offset (from an offset message id)."""
    offset = Header(cmd.ext_fields).int64("offset")
    msg_id = make_msg_id(ctx.store.store_id, offset)
    message = await ctx.run(lambda: view_message(ctx.store, msg_id, index=ctx.index))
    return cmd.response(ResponseCode.SUCCESS, body=_encoded(ctx, [message]))


async def query_message(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """QUERY_MESSAGE: by key in a time range, or by unique key (``_UNIQUE_KEY_QUERY``)."""
    header = Header(cmd.ext_fields)
    topic, key = header.text("topic"), header.text("key")
    max_num = max(1, min(header.int32("maxNum", 32), 64))
    begin, end = header.int64("beginTimestamp", 0), header.int64("endTimestamp", now_ms())
    if header.flag("_UNIQUE_KEY_QUERY"):
        found = await ctx.run(lambda: query_by_uniq_key(ctx.store, topic, key, index=ctx.index))
        messages = [found] if found is not None else []
    else:
        messages = await ctx.run(
            lambda: query_by_key(ctx.store, topic, key, begin, end, max_num, index=ctx.index)
        )
    if not messages:
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct"
        )
    fields = {
        "indexLastUpdateTimestamp": now_ms(),
        "indexLastUpdatePhyoffset": max(m.physical_offset for m in messages),
    }
    return cmd.response(ResponseCode.SUCCESS, ext_fields=fields, body=_encoded(ctx, messages))


async def all_topic_config(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_ALL_TOPIC_CONFIG: every topic as RocketMQ's ``TopicConfigSerializeWrapper``."""
    configs = await ctx.run(lambda: ctx.store.topic_configs(refresh=True))
    table = {
        name: {
            "topicName": name,
            "readQueueNums": c.queues,
            "writeQueueNums": c.queues,
            "perm": c.perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": False,
        }
        for name, c in sorted(configs.items())
    }
    body = {"topicConfigTable": table, "dataVersion": {"timestamp": now_ms(), "counter": len(table)}}
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes(body))


def _create_or_update(ctx: BrokerContext, topic: str, queues: int, perm: int) -> None:
    admin = Admin(ctx.store)
    try:
        admin.create_topic(topic, queues, perm=perm)
    except TopicExistsError:
        admin.update_topic(topic, queues=queues, perm=perm)


async def update_and_create_topic(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """UPDATE_AND_CREATE_TOPIC: the engine's create_topic (or update_topic when it exists)."""
    header = Header(cmd.ext_fields)
    topic = header.text("topic")
    queues = header.int32("writeQueueNums", ctx.store.config.default_queues)
    await ctx.run(_create_or_update, ctx, topic, queues, header.int32("perm", 6))
    return cmd.response(ResponseCode.SUCCESS)


HANDLERS: dict[int, Handler] = {
    RequestCode.VIEW_MESSAGE_BY_ID: view_by_id,
    RequestCode.QUERY_MESSAGE: query_message,
    RequestCode.GET_ALL_TOPIC_CONFIG: all_topic_config,
    RequestCode.UPDATE_AND_CREATE_TOPIC: update_and_create_topic,
}
