"""Offset requests: consumer offsets (query, update), queue offsets (min, max, by time) and offset
resets (INVOKE_BROKER_TO_RESET_OFFSET in, RESET_CONSUMER_CLIENT_OFFSET out to the group's clients)."""

from __future__ import annotations

import logging

from engine.client.admin_offsets import (
    committed_offsets,
    offsets_for_time,
    reset_offset,
    reset_offset_by_time,
)
from engine.client.offsets import is_young, offset_by_time
from engine.protocol.names import validate_group_name
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import BROKER_NAME, BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header
from engine.remoting.reset_push import reset_offset_body, reset_request

_log = logging.getLogger(__name__)
# A time past every stored message: RocketMQ's timestamp -1 ("reset to the max offset").
_END_OF_TIME_MS = 2**62


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
    """UPDATE_CONSUMER_OFFSET (clients send it one-way every 5 s); committed with the next flush,
    kept in the order the connection's reports arrive (:meth:`BrokerContext.keep_offset`)."""
    header = Header(cmd.ext_fields)
    group, topic, queue_id = header.text("consumerGroup"), header.text("topic"), header.int32("queueId")
    await ctx.keep_offset(group, topic, queue_id, header.int64("commitOffset"))
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


def reset_by_time_sync(
    ctx: BrokerContext, group: str, topic: str, timestamp_ms: int, force: bool
) -> dict[int, int]:
    """Reset ``group``'s offsets of ``topic`` in the store to the first message stored at or after
    ``timestamp_ms`` (-1: the max offset), with the engine's admin reset (what ``mq group reset``
    runs); without ``force`` a queue only moves back, as RocketMQ's broker decides. Returns every
    queue's offset after the reset.

    Raises:
        TopicNotFoundError: no such topic.
        InvalidArgumentError: a bad group or time.
    """
    group = validate_group_name(group)
    when = _END_OF_TIME_MS if timestamp_ms == -1 else timestamp_ms
    if force:
        return reset_offset_by_time(ctx.store, group, topic, when)
    current = committed_offsets(ctx.store, group, topic)
    targets = offsets_for_time(ctx.store, topic, when)
    out = {}
    for queue_id, target in targets.items():
        now = current.get(queue_id)
        if now is None or target < now:
            reset_offset(ctx.store, group, topic, queue_id, target)
            now = target
        out[queue_id] = now
    return out


async def push_resets(ctx: BrokerContext) -> int:
    """Push the resets made in the store since the last call to every connected client of each
    reset group (one-way RESET_CONSUMER_CLIENT_OFFSET), and report the reset offsets so they win
    over offsets reported before the clients followed. Returns how many pushes were written."""
    pushed = 0
    for reset in await ctx.run(ctx.resets.poll):
        for queue_id, offset in reset.offsets.items():
            try:
                await ctx.run(ctx.offsets.put, reset.group, reset.topic, queue_id, offset)
            except Exception as exc:  # a topic deleted since: nothing to hold
                _log.debug("reset of %s %s:%s not re-reported: %s", reset.group, reset.topic, queue_id, exc)
        request = reset_request(BROKER_NAME, reset)
        for conn in list(ctx.connections):
            if reset.group not in conn.consumer_groups:
                continue
            try:
                await conn.send(request)
                pushed += 1
            except (ConnectionError, OSError, RuntimeError) as exc:
                _log.debug("reset push to %s lost: %s", conn.peer, exc)
    return pushed


async def invoke_reset(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """INVOKE_BROKER_TO_RESET_OFFSET (``mqadmin resetOffsetByTime``): reset the group's offsets in
    the store and push the reset to its connected clients; answers the new offsets.

    Unlike RocketMQ's broker, which answers CONSUMER_NOT_ONLINE and changes nothing when no
    consumer of the group is connected, the reset is made in the store either way (a consumer
    started later begins there), and answered SUCCESS.
    """
    header = Header(cmd.ext_fields)
    topic, group = header.text("topic"), header.text("group")
    timestamp = header.int64("timestamp")
    force = header.flag("isForce", True)
    offsets = await ctx.run(reset_by_time_sync, ctx, group, topic, timestamp, force)
    await push_resets(ctx)
    return cmd.response(ResponseCode.SUCCESS, body=reset_offset_body(BROKER_NAME, topic, offsets))


HANDLERS: dict[int, Handler] = {
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: invoke_reset,
    RequestCode.QUERY_CONSUMER_OFFSET: query_consumer_offset,
    RequestCode.UPDATE_CONSUMER_OFFSET: update_consumer_offset,
    RequestCode.GET_MAX_OFFSET: get_max_offset,
    RequestCode.GET_MIN_OFFSET: get_min_offset,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: search_offset,
    RequestCode.GET_EARLIEST_MSG_STORETIME: earliest_store_time,
}
