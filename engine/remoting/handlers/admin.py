"""The admin requests ``mqadmin`` and the RocketMQ dashboard send about topics, groups and the
broker's configuration, answered from the store's own tables through the engine's admin calls:
topic stats, consume stats (one group, or every group in the broker), who consumes a topic, consume
time spans, the consume queue, topic deletion (broker and name server).

Bodies follow RocketMQ's classes field by field, as fastjson writes them; a map keyed by a
``MessageQueue`` is written as fastjson does, with JSON objects as keys (see :func:`fastjson_bytes`).
Client connections live in :mod:`.admin_clients`, broker statistics in :mod:`.admin_stats`,
subscription groups in :mod:`.admin_groups`, configuration and refusals in :mod:`.admin_config`.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.client.admin import Admin
from engine.client.admin_groups import group_progress
from engine.client.admin_offsets import committed_offsets, lag_rows
from engine.client.membership import live_subscriptions
from engine.errors import InvalidArgumentError, InvalidTopicError, TopicNotFoundError
from engine.model import QueueStats
from engine.protocol.names import DLQ_PREFIX, RETRY_PREFIX, is_system_topic, validate_group_name
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import (
    BROKER_NAME,
    WIRE_MEMBER_TIMEOUT_MS,
    BrokerContext,
    Connection,
    Handler,
)
from engine.remoting.frames import RemotingCommand
from engine.remoting.handlers import admin_groups
from engine.remoting.headers import Header
from engine.store.store import now_ms

CONSUME_TPS_WINDOW_MS = 60_000  # RocketMQ's consumeTps is the per-minute rate of GROUP_GET_NUMS


# ----------------------------------------------------------------- fastjson bodies
@dataclass(frozen=True)
class Keyed:
    """A map whose keys are objects (``HashMap<MessageQueue, …>``): fastjson writes each key as a
    JSON object, which its parser reads back; plain JSON cannot say it."""

    items: tuple[tuple[Any, Any], ...]


def fastjson(value: Any) -> str:
    """``value`` as fastjson writes it: JSON, except :class:`Keyed` maps with object keys."""
    if isinstance(value, Keyed):
        return "{" + ",".join(f"{fastjson(k)}:{fastjson(v)}" for k, v in value.items) + "}"
    if isinstance(value, Mapping):
        return (
            "{"
            + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{fastjson(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ",".join(fastjson(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def fastjson_bytes(value: Any) -> bytes:
    """:func:`fastjson` as a response body."""
    return fastjson(value).encode()


def message_queue(topic: str, queue_id: int) -> dict[str, object]:
    """RocketMQ's ``MessageQueue`` of a queue of this broker."""
    return {"brokerName": BROKER_NAME, "queueId": queue_id, "topic": topic}


_ADMINS: weakref.WeakKeyDictionary[BrokerContext, Admin] = weakref.WeakKeyDictionary()


def admin_of(ctx: BrokerContext) -> Admin:
    """The engine's admin of the endpoint's store (one per endpoint: it keeps a queue index)."""
    admin = _ADMINS.get(ctx)
    if admin is None:
        admin = _ADMINS[ctx] = Admin(ctx.store)
    return admin


# ----------------------------------------------------------------- topics
def topic_stats_sync(ctx: BrokerContext, topic: str) -> list[QueueStats]:
    """Per queue of ``topic``: min, max offset and last store time.

    Raises:
        TopicNotFoundError: no such topic.
    """
    return admin_of(ctx).topic_stats(topic)


async def topic_stats(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_TOPIC_STATS_INFO: ``TopicStatsTable`` (what ``topicStatus`` prints), or TOPIC_NOT_EXIST."""
    topic = Header(cmd.ext_fields).text("topic")
    try:
        stats = await ctx.run(topic_stats_sync, ctx, topic)
    except TopicNotFoundError:
        return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    table = Keyed(
        tuple(
            (
                message_queue(topic, s.queue_id),
                {
                    "lastUpdateTimestamp": s.last_store_ts_ms or 0,
                    "maxOffset": s.max_offset,
                    "minOffset": s.min_offset,
                },
            )
            for s in stats
        )
    )
    return cmd.response(ResponseCode.SUCCESS, body=fastjson_bytes({"offsetTable": table}))


def delete_topic_sync(ctx: BrokerContext, topic: str) -> bool:
    """Remove a topic from routing, as RocketMQ's broker does whoever consumes it; False when it did
    not exist (nothing written).

    Raises:
        InvalidTopicError: a bad name or a system topic.
    """
    try:
        admin_of(ctx).delete_topic(topic, force=True)
    except TopicNotFoundError:
        return False
    return True


async def delete_topic(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """DELETE_TOPIC_IN_BROKER and DELETE_TOPIC_IN_NAMESRV: one store holds both, so either removes
    the topic (the second finds it gone: success, as RocketMQ answers for a topic it does not know)."""
    topic = Header(cmd.ext_fields).text("topic")
    try:
        await ctx.run(delete_topic_sync, ctx, topic)
    except InvalidTopicError as exc:
        return cmd.response(
            ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic. {exc}"
        )
    finally:
        ctx.recent.forget(topic)  # a topic made again numbers its queues from 0 again
    return cmd.response(ResponseCode.SUCCESS)


# ----------------------------------------------------------------- consume stats
def _consume_tps(ctx: BrokerContext, group: str, topics: list[str], now: int) -> float:
    moved = 0
    for topic in topics:
        before = committed_offsets(ctx.store, group, topic, as_of_ms=now - CONSUME_TPS_WINDOW_MS)
        after = committed_offsets(ctx.store, group, topic, as_of_ms=now)
        moved += sum(max(0, off - before.get(qid, 0)) for qid, off in after.items())
    return moved / (CONSUME_TPS_WINDOW_MS / 1000)


def consume_stats_sync(ctx: BrokerContext, group: str, topic: str | None) -> dict[str, object]:
    """RocketMQ's ``ConsumeStats`` of a clustering group: per queue of every topic it committed
    offsets for (only ``topic`` when given, all its queues even before a commit), the broker's max
    offset, the group's committed offset and the store time of the last consumed message."""
    validate_group_name(group)
    ctx.offsets.flush()  # offsets clients reported count as committed, as RocketMQ's memory table does
    configs = ctx.store.topic_configs(refresh=True)
    entries: dict[tuple[str, int], dict[str, int]] = {}
    if topic is not None and topic in configs:
        for s in topic_stats_sync(ctx, topic):
            entries[(topic, s.queue_id)] = {
                "brokerOffset": s.max_offset,
                "consumerOffset": 0,
                "lastTimestamp": 0,
            }
    if topic is None or topic in configs:
        for row in group_progress(ctx.store, group, topic):
            if row.consumer_id:
                continue  # a broadcasting instance's offsets: RocketMQ's broker keeps none
            entries[(row.topic, row.queue_id)] = {
                "brokerOffset": row.max_offset,
                "consumerOffset": row.committed_offset or 0,
                "lastTimestamp": row.last_consumed_ts_ms or 0,
            }
    topics = sorted({t for t, _ in entries})
    table = Keyed(tuple((message_queue(t, q), entries[(t, q)]) for t, q in sorted(entries)))
    return {"consumeTps": _consume_tps(ctx, group, topics, now_ms()), "offsetTable": table}


def _total_diff(stats: Mapping[str, Any]) -> int:
    table: Keyed = stats["offsetTable"]
    return sum(v["brokerOffset"] - v["consumerOffset"] for _, v in table.items)


async def consume_stats(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_CONSUME_STATS: ``consumerProgress -g`` and the dashboard's group view."""
    header = Header(cmd.ext_fields)
    group, topic = header.text("consumerGroup"), header.optional("topic") or None
    stats = await ctx.run(consume_stats_sync, ctx, group, topic)
    return cmd.response(ResponseCode.SUCCESS, body=fastjson_bytes(stats))


def broker_consume_stats_sync(ctx: BrokerContext) -> dict[str, object]:
    """RocketMQ's ``ConsumeStatsList``: every subscription group's consume stats, per topic."""
    per_group: list[dict[str, list[dict[str, object]]]] = []
    total = 0
    for group in admin_groups.subscription_groups_sync(ctx):
        topics = sorted({r.topic for r in lag_rows(ctx.store, group) if not r.consumer_id})
        stats = [consume_stats_sync(ctx, group, t) for t in topics]
        total += sum(_total_diff(s) for s in stats)
        per_group.append({group: stats})
    return {"brokerAddr": ctx.address, "consumeStatsList": per_group, "totalDiff": total}


async def broker_consume_stats(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_BROKER_CONSUME_STATS: ``brokerConsumeStats`` (no topic here is ordered-only, so
    ``isOrder`` lists nothing)."""
    if Header(cmd.ext_fields).flag("isOrder"):
        body: dict[str, object] = {"brokerAddr": ctx.address, "consumeStatsList": [], "totalDiff": 0}
    else:
        body = await ctx.run(broker_consume_stats_sync, ctx)
    return cmd.response(ResponseCode.SUCCESS, body=fastjson_bytes(body))


def consumers_of_sync(ctx: BrokerContext, topic: str) -> list[str]:
    """Groups that consume ``topic``: a live member subscribes to it, or the group committed offsets
    for it (RocketMQ's ``queryTopicConsumeByWho``)."""
    groups = {
        group
        for group, members in live_subscriptions(ctx.store, WIRE_MEMBER_TIMEOUT_MS).items()
        if any(topic in subs for subs in members.values())
    }
    groups |= {r.group for r in lag_rows(ctx.store) if r.topic == topic}
    return sorted(groups)


async def topic_consume_by_who(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """QUERY_TOPIC_CONSUME_BY_WHO: ``GroupList`` of a topic (``statsAll``, ``topicStatus`` views)."""
    topic = Header(cmd.ext_fields).text("topic")
    groups = await ctx.run(consumers_of_sync, ctx, topic)
    return cmd.response(ResponseCode.SUCCESS, body=fastjson_bytes({"groupList": groups}))


def consume_time_span_sync(ctx: BrokerContext, topic: str, group: str) -> list[dict[str, object]]:
    """RocketMQ's ``QueueTimeSpan`` per queue: first and last store time, the store time of the last
    consumed message and how long the next one has waited.

    Raises:
        TopicNotFoundError: no such topic.
    """
    validate_group_name(group)
    stats = topic_stats_sync(ctx, topic)
    committed = committed_offsets(ctx.store, group, topic)
    now = now_ms()
    spans = []
    for s in stats:
        first = _store_ts(ctx, topic, s.queue_id, s.min_offset) if s.max_offset > s.min_offset else 0
        offset = committed.get(s.queue_id, 0)
        consumed = _store_ts(ctx, topic, s.queue_id, offset - 1) if offset > 0 else first
        waiting = _store_ts(ctx, topic, s.queue_id, offset) if offset < s.max_offset else 0
        spans.append(
            {
                "messageQueue": message_queue(topic, s.queue_id),
                "minTimeStamp": first,
                "maxTimeStamp": s.last_store_ts_ms or 0,
                "consumeTimeStamp": consumed,
                "delayTime": now - waiting if waiting else 0,
            }
        )
    return spans


def _store_ts(ctx: BrokerContext, topic: str, queue_id: int, offset: int) -> int:
    ctx.index.refresh()
    entry = ctx.index.entries(topic, queue_id, offset, offset + 1)
    return int(entry["store_ts_ms"][0].as_py()) if entry.num_rows else 0


async def consume_time_span(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """QUERY_CONSUME_TIME_SPAN."""
    header = Header(cmd.ext_fields)
    topic, group = header.text("topic"), header.text("group")
    try:
        spans = await ctx.run(consume_time_span_sync, ctx, topic, group)
    except TopicNotFoundError:
        return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    return cmd.response(ResponseCode.SUCCESS, body=fastjson_bytes({"consumeTimeSpanSet": spans}))


# ----------------------------------------------------------------- consume queue
def consume_queue_sync(
    ctx: BrokerContext, topic: str, queue_id: int, index: int, count: int
) -> dict[str, object]:
    """RocketMQ's ``QueryConsumeQueueResponseBody``: up to ``count`` consume-queue entries of a
    queue from offset ``index`` (``queryCq``).

    Raises:
        TopicNotFoundError: no such topic.
        InvalidArgumentError: a queue id outside the topic.
    """
    config = ctx.store.topic(topic)
    if not 0 <= queue_id < config.queues:
        raise InvalidArgumentError(f"{queue_id}@{topic} is not exist!", topic=topic, queue_id=queue_id)
    ctx.index.refresh()
    low, high = ctx.index.bounds(topic, queue_id)
    count = max(0, min(count, 1024))
    entries = ctx.index.entries(topic, queue_id, max(index, low), min(max(index, low) + count, high))
    data = [
        {
            "physicOffset": r["physical_offset"],
            "physicSize": r["size"],
            "tagsCode": r["tags_code"],
            "eval": False,
        }
        for r in entries.select(["physical_offset", "size", "tags_code"]).to_pylist()
    ]
    return {"maxQueueIndex": high, "minQueueIndex": low, "queueData": data}


async def query_consume_queue(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """QUERY_CONSUME_QUEUE."""
    header = Header(cmd.ext_fields)
    topic, queue_id = header.text("topic"), header.int32("queueId")
    body = await ctx.run(
        consume_queue_sync, ctx, topic, queue_id, header.int64("index", 0), header.int32("count", 1)
    )
    return cmd.response(ResponseCode.SUCCESS, body=fastjson_bytes(body))


async def system_topic_list(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_SYSTEM_TOPIC_LIST_FROM_BROKER: the system topics of this store."""
    configs = await ctx.run(lambda: ctx.store.topic_configs(refresh=True))
    topics = sorted(n for n in configs if is_system_topic(n) and not n.startswith((RETRY_PREFIX, DLQ_PREFIX)))
    return cmd.response(ResponseCode.SUCCESS, body=fastjson_bytes({"topicList": topics}))


HANDLERS: dict[int, Handler] = {
    RequestCode.GET_TOPIC_STATS_INFO: topic_stats,
    RequestCode.DELETE_TOPIC_IN_BROKER: delete_topic,
    RequestCode.GET_CONSUME_STATS: consume_stats,
    RequestCode.GET_BROKER_CONSUME_STATS: broker_consume_stats,
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: topic_consume_by_who,
    RequestCode.QUERY_CONSUME_TIME_SPAN: consume_time_span,
    RequestCode.QUERY_CONSUME_QUEUE: query_consume_queue,
    RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: system_topic_list,
}
NAMESRV_HANDLERS: dict[int, Handler] = {RequestCode.DELETE_TOPIC_IN_NAMESRV: delete_topic}
