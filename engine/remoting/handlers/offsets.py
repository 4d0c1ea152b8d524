"""Offset requests: consumer offsets (query, update) and queue offsets (min, max, by time)."""

from __future__ import annotations

from engine.client.offsets import is_young, offset_by_time
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header


def query_offset_sync(ctx: BrokerContext, group: str, topic: str, queue_id: int) -> int | None:
    """The group's committed offset; for a group that never committed, 0 while the queue is young
    (RocketMQ's "first message still in memory" rule), else None (QUERY_NOT_FOUND: the client then
    applies its CONSUME_FROM_* setting)."""
    reported = ctx.offsets.pending(group, topic, queue_id)
    if reported is not None:
        return reported
    committed = ctx.puller(group).committed_offset(topic, queue_id)
    if committed is not None:
        return committed
    ctx.index.refresh()
    if is_young(ctx.store, ctx.index, topic, queue_id):
        return 0
    return None


async def query_consumer_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """QUERY_CONSUMER_OFFSET."""
    header = Header(cmd.ext_fields)
    group, topic, queue_id = header.text("consumerGroup"), header.text("topic"), header.int32("queueId")
    offset = await ctx.run(query_offset_sync, ctx, group, topic, queue_id)
    if offset is None:
        return cmd.response(ResponseCode.QUERY_NOT_FOUND, "Not found, maybe this group consumer boot first")
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": offset})


async def update_consumer_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """UPDATE_CONSUMER_OFFSET (clients send it one-way every 5 s); committed with the next flush."""
    header = Header(cmd.ext_fields)
    group, topic, queue_id = header.text("consumerGroup"), header.text("topic"), header.int32("queueId")
    offset = header.int64("commitOffset")
    await ctx.run(ctx.offsets.put, group, topic, queue_id, offset)
    return cmd.response(ResponseCode.SUCCESS)


def _queue(cmd: RemotingCommand) -> tuple[Header, str, int]:
    header = Header(cmd.ext_fields)
    return header, header.text("topic"), header.int32("queueId")


async def get_max_offset(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_MAX_OFFSET: the next offset to be written in a queue."""
    _, topic, queue_id = _queue(cmd)
    offset = await ctx.run(ctx.puller("TOOLS_CONSUMER").max_offset, topic, queue_id)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": offset})


async def get_min_offset(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_MIN_OFFSET: the smallest offset still stored in a queue."""
    _, topic, queue_id = _queue(cmd)
    offset = await ctx.run(ctx.puller("TOOLS_CONSUMER").min_offset, topic, queue_id)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": offset})


def _search(ctx: BrokerContext, topic: str, queue_id: int, timestamp: int) -> int:
    ctx.puller("TOOLS_CONSUMER").min_offset(topic, queue_id)  # checks the topic and queue
    return offset_by_time(ctx.index, topic, queue_id, timestamp)


async def search_offset(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after the time."""
    header, topic, queue_id = _queue(cmd)
    offset = await ctx.run(_search, ctx, topic, queue_id, header.int64("timestamp"))
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": offset})


def _earliest(ctx: BrokerContext, topic: str, queue_id: int) -> int:
    low = ctx.puller("TOOLS_CONSUMER").min_offset(topic, queue_id)
    ctx.index.refresh()
    entry = ctx.index.entries(topic, queue_id, low, low + 1)
    return int(entry["store_ts_ms"][0].as_py()) if entry.num_rows else -1


async def earliest_store_time(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_EARLIEST_MSG_STORETIME: store time of a queue's first stored message (-1 when empty)."""
    _, topic, queue_id = _queue(cmd)
    ts = await ctx.run(_earliest, ctx, topic, queue_id)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"timestamp": ts})


HANDLERS: dict[int, Handler] = {
    RequestCode.QUERY_CONSUMER_OFFSET: query_consumer_offset,
    RequestCode.UPDATE_CONSUMER_OFFSET: update_consumer_offset,
    RequestCode.GET_MAX_OFFSET: get_max_offset,
    RequestCode.GET_MIN_OFFSET: get_min_offset,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: search_offset,
    RequestCode.GET_EARLIEST_MSG_STORETIME: earliest_store_time,
}
