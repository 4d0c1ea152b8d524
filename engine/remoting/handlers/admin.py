"""The admin requests ``mqadmin`` and the RocketMQ dashboard send about topics, groups and the
broker's configuration, answered from the store's own tables through the engine's admin calls:
topic stats, consume stats (one group, or every group in the broker), who consumes a topic, consume
time spans, topic deletion (broker and name server), subscription groups, broker config.

Bodies follow RocketMQ's classes field by field, as fastjson writes them; a map keyed by a
``MessageQueue`` is written as fastjson does, with JSON objects as keys (see :func:`fastjson_bytes`).
Client connections live in :mod:`.admin_clients`, broker statistics in :mod:`.admin_stats`.
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
from engine.model import QueueStats, TopicConfig
from engine.protocol.delays import DELAY_LEVELS_MS
from engine.protocol.messages import MAX_BODY_BYTES
from engine.protocol.names import DLQ_PREFIX, RETRY_PREFIX, is_system_topic, retry_topic, validate_group_name
from engine.protocol.permissions import DEFAULT_PERM
from engine.protocol.topics import system_topic_config, system_topic_queues
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import (
    BROKER_NAME,
    CLUSTER_NAME,
    WIRE_MEMBER_TIMEOUT_MS,
    BrokerContext,
    Connection,
    Handler,
)
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header, json_body
from engine.store.consumer_offset import OffsetStore
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
    for group in subscription_groups_sync(ctx):
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


# ----------------------------------------------------------------- subscription groups
def group_config(ctx: BrokerContext, group: str) -> dict[str, object]:
    """The ``SubscriptionGroupConfig`` a group has here: RocketMQ's defaults, which are what the
    engine does (retries as the store's ``max_reconsume_times``, one retry queue)."""
    return {
        "groupName": group,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True,
        "retryQueueNums": system_topic_queues(retry_topic(group)),
        "retryMaxTimes": ctx.store.config.max_reconsume_times,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }


# Settings accepted whatever their value: a store has no slaves (brokerId, whichBrokerWhenConsumeSlowly),
# consumeFromMinEnable does nothing in RocketMQ 4.9's broker either, and broadcasting consumers are
# always allowed here (mqadmin updateSubGroup sends consumeBroadcastEnable=false unless told).
_IGNORED_SETTINGS = frozenset(
    {
        "groupName",
        "consumeFromMinEnable",
        "consumeBroadcastEnable",
        "brokerId",
        "whichBrokerWhenConsumeSlowly",
    }
)


def subscription_groups_sync(ctx: BrokerContext) -> list[str]:
    """The broker's subscription groups: those with a retry topic (made on a consumer's first
    heartbeat or by UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, retired by DELETE_SUBSCRIPTIONGROUP) and
    those with a live member."""
    groups = {
        t[len(RETRY_PREFIX) :] for t in ctx.store.topic_configs(refresh=True) if t.startswith(RETRY_PREFIX)
    }
    groups |= set(live_subscriptions(ctx.store, WIRE_MEMBER_TIMEOUT_MS))
    return sorted(groups)


def create_group_sync(ctx: BrokerContext, config: Mapping[str, Any]) -> str | None:
    """Create or update a subscription group; the reason when a setting cannot be honoured (then
    nothing is written).

    Raises:
        InvalidArgumentError: a bad group name.
    """
    group = validate_group_name(config.get("groupName"))
    ours = group_config(ctx, group)
    refused = [
        f"{k}={config[k]!r} (lakemq: {ours[k]!r})"
        for k in ours
        if k not in _IGNORED_SETTINGS and k in config and config[k] != ours[k]
    ]
    if refused:
        return (
            f"lakemq cannot honour {', '.join(refused)} for group {group}: retries follow the store's "
            "max_reconsume_times (engine.toml), a group always consumes and is always notified"
        )
    name = retry_topic(group)
    if ctx.store.topic_configs(refresh=True).get(name) is None:
        ctx.store.put_topic(system_topic_config(name, now_ms()))
    return None


async def update_subscription_group(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: the group's retry topic made, its settings checked."""
    body = json_body(cmd.body, "subscription group")
    if not isinstance(body, dict):
        return cmd.response(ResponseCode.SYSTEM_ERROR, "subscription group body must be a JSON object")
    refused = await ctx.run(create_group_sync, ctx, body)
    if refused is not None:
        return cmd.response(ResponseCode.NO_PERMISSION, refused)
    return cmd.response(ResponseCode.SUCCESS)


def all_groups_sync(ctx: BrokerContext) -> dict[str, object]:
    """RocketMQ's ``SubscriptionGroupWrapper`` of every subscription group."""
    groups = subscription_groups_sync(ctx)
    return {
        "subscriptionGroupTable": {g: group_config(ctx, g) for g in groups},
        "dataVersion": {"counter": len(groups), "timestamp": now_ms()},
    }


async def all_subscription_groups(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """GET_ALL_SUBSCRIPTIONGROUP_CONFIG."""
    return cmd.response(ResponseCode.SUCCESS, body=fastjson_bytes(await ctx.run(all_groups_sync, ctx)))


def delete_group_sync(ctx: BrokerContext, group: str) -> None:
    """Retire a group's retry topic (its dead letters and committed offsets stay in the logs)."""
    validate_group_name(group)
    name = retry_topic(group)
    current = ctx.store.topic_configs(refresh=True).get(name)
    if current is not None:
        ctx.store.put_topic(TopicConfig(name, 0, current.perm, current.type))


async def delete_subscription_group(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """DELETE_SUBSCRIPTIONGROUP; ``removeOffset`` is refused: committed offsets are an append-only
    history here (``mq group reset`` moves them)."""
    header = Header(cmd.ext_fields)
    group = header.text("groupName")
    if header.flag("removeOffset"):
        return cmd.response(
            ResponseCode.NO_PERMISSION,
            "lakemq keeps consumer offsets as an append-only table: removeOffset is not supported "
            "(delete without it, or move the offsets with mq group reset)",
        )
    await ctx.run(delete_group_sync, ctx, group)
    return cmd.response(ResponseCode.SUCCESS)


# ----------------------------------------------------------------- broker config
def broker_config(ctx: BrokerContext) -> dict[str, str]:
    """The broker's configuration under RocketMQ's names where one exists, then the engine's own
    settings (``engine.toml``) under theirs."""
    config = ctx.store.config
    rocketmq = {
        "brokerClusterName": CLUSTER_NAME,
        "brokerName": BROKER_NAME,
        "brokerId": "0",
        "brokerIP1": ctx.host,
        "listenPort": str(ctx.port),
        "brokerPermission": str(DEFAULT_PERM),
        "autoCreateTopicEnable": str(ctx.auto_create_topics).lower(),
        "autoCreateSubscriptionGroup": "true",
        "defaultTopicQueueNums": str(config.default_queues),
        "flushDiskType": str(config.flush_disk_type),
        "fileReservedTime": str(config.file_reserved_hours),
        "maxTransferCountOnMessageInMemory": str(config.max_transfer_count),
        "maxTransferBytesOnMessageInMemory": str(config.max_transfer_bytes),
        "longPollingEnable": "true",
        "timerMaxDelaySec": str(config.timer_max_delay_sec),
        "storePathRootDir": str(ctx.store.root),
        "brokerRole": "SYNC_MASTER" if config.flush_disk_type == "SYNC_FLUSH" else "ASYNC_MASTER",
        "filterServerNums": "0",
        "maxMessageSize": str(MAX_BODY_BYTES),
        "messageDelayLevel": " ".join(_duration(ms) for ms in DELAY_LEVELS_MS),
        "msgTraceTopicName": "RMQ_SYS_TRACE_TOPIC",
        "traceTopicEnable": "false",
        "traceOn": "true",
        "slaveReadEnable": "false",
        "useTLS": "false",
    }
    engine = {
        k: str(v)
        for k, v in sorted(vars(config).items())
        if k != "storage" and isinstance(v, str | int | float | bool)
    }
    return {**rocketmq, **engine}


def _duration(ms: int) -> str:
    """A delay level as RocketMQ's ``messageDelayLevel`` writes it (``1s``, ``2m``, ``1h``)."""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _properties(text: str) -> dict[str, str]:
    """``key=value`` lines (``MixAll.string2Properties``; ``#`` comments)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


async def get_broker_config(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_BROKER_CONFIG: ``key=value`` lines, the data version in the ``version`` header field."""
    config = broker_config(ctx)
    text = "".join(f"{k}={v}\n" for k, v in config.items())
    version = json.dumps({"counter": 0, "timestamp": 0}, separators=(",", ":"))
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"version": version}, body=text.encode())


async def update_broker_config(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """UPDATE_BROKER_CONFIG: accepted only where it changes nothing; any other value is refused
    (NO_PERMISSION, as RocketMQ refuses its black-listed keys), since the engine reads its settings
    from ``engine.toml`` at start."""
    try:
        wanted = _properties(cmd.body.decode("utf-8"))
    except UnicodeDecodeError:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "string2Properties error")
    current = broker_config(ctx)
    refused = sorted(k for k, v in wanted.items() if current.get(k) != v)
    if refused:
        return cmd.response(
            ResponseCode.NO_PERMISSION,
            f"lakemq cannot change {', '.join(refused)} at run time: set them in conf/engine.toml or "
            "mq serve's options and restart",
        )
    return cmd.response(ResponseCode.SUCCESS)


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


# ----------------------------------------------------------------- offsets
def clone_offsets_sync(ctx: BrokerContext, source: str, dest: str, topic: str | None) -> int:
    """Give ``dest`` the committed offsets ``source`` has (of ``topic``, or of every topic it
    committed): one ``consumer_offset`` commit; how many queues were copied."""
    validate_group_name(source)
    validate_group_name(dest)
    ctx.offsets.flush()
    configs = ctx.store.topic_configs(refresh=True)
    topics = [topic] if topic else sorted({r.topic for r in lag_rows(ctx.store, source) if not r.consumer_id})
    entries = [
        (t, qid, offset)
        for t in topics
        if t in configs
        for qid, offset in sorted(committed_offsets(ctx.store, source, t).items())
    ]
    if entries:
        OffsetStore(ctx.store, dest).commit(entries)
    return len(entries)


async def clone_group_offset(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """CLONE_GROUP_OFFSET (``cloneGroupOffset``)."""
    header = Header(cmd.ext_fields)
    source, dest, topic = header.text("srcGroup"), header.text("destGroup"), header.optional("topic") or None
    await ctx.run(clone_offsets_sync, ctx, source, dest, topic)
    return cmd.response(ResponseCode.SUCCESS)


# ----------------------------------------------------------------- name server
def namesrv_config(ctx: BrokerContext, conn: Connection) -> dict[str, str]:
    """The name server's configuration (``NamesrvConfig`` names where one applies); its port is the
    one ``conn`` reached."""
    local = conn.writer.get_extra_info("sockname")
    return {
        "listenPort": str(local[1]) if isinstance(local, tuple) and len(local) >= 2 else "",
        "clusterTest": "false",
        "orderMessageEnable": "false",
        "rocketmqHome": str(ctx.store.root),
    }


async def get_namesrv_config(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_NAMESRV_CONFIG: ``key=value`` lines (``getNamesrvConfig``, ``exportConfigs``)."""
    text = "".join(f"{k}={v}\n" for k, v in namesrv_config(ctx, conn).items())
    return cmd.response(ResponseCode.SUCCESS, body=text.encode())


async def get_kv_config(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_KV_CONFIG: the name server keeps no KV config here (order configs included)."""
    header = Header(cmd.ext_fields)
    return cmd.response(
        ResponseCode.QUERY_NOT_FOUND,
        f"No config item, Namespace: {header.text('namespace', '')} Key: {header.text('key', '')}",
    )


def refusal(reason: str) -> Handler:
    """A handler that refuses its request with ``reason`` (REQUEST_CODE_NOT_SUPPORTED, nothing written)."""

    async def refuse(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request type {cmd.code}: {reason}")

    return refuse


NO_ACL = refusal("lakemq has no ACL; it binds 127.0.0.1 unless told, and the store's own access rules apply")
RETENTION = refusal(
    "retention is the maintenance job's (file_reserved_hours, consumer-aware): run jobs/maintenance.py "
    "or mq serve's broker loop"
)
NO_KV = refusal(
    "the name server keeps no KV config (order configs included): topics are configured in the store"
)
NAMESRV_FIXED = refusal("the name server's settings come from mq serve's options; restart to change them")
PERM = refusal("a broker's write permission is its topics' perm: change it with updateTopicPerm per topic")

HANDLERS: dict[int, Handler] = {
    RequestCode.GET_TOPIC_STATS_INFO: topic_stats,
    RequestCode.DELETE_TOPIC_IN_BROKER: delete_topic,
    RequestCode.GET_CONSUME_STATS: consume_stats,
    RequestCode.GET_BROKER_CONSUME_STATS: broker_consume_stats,
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: topic_consume_by_who,
    RequestCode.QUERY_CONSUME_TIME_SPAN: consume_time_span,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: update_subscription_group,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: all_subscription_groups,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: delete_subscription_group,
    RequestCode.GET_BROKER_CONFIG: get_broker_config,
    RequestCode.UPDATE_BROKER_CONFIG: update_broker_config,
    RequestCode.CLONE_GROUP_OFFSET: clone_group_offset,
    RequestCode.QUERY_CONSUME_QUEUE: query_consume_queue,
    RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: system_topic_list,
    RequestCode.UPDATE_AND_CREATE_ACL_CONFIG: NO_ACL,
    RequestCode.DELETE_ACL_CONFIG: NO_ACL,
    RequestCode.GET_BROKER_CLUSTER_ACL_INFO: NO_ACL,
    RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: NO_ACL,
    RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE: RETENTION,
    RequestCode.CLEAN_UNUSED_TOPIC: RETENTION,
    RequestCode.DELETE_EXPIRED_COMMITLOG: RETENTION,
}
NAMESRV_HANDLERS: dict[int, Handler] = {
    RequestCode.DELETE_TOPIC_IN_NAMESRV: delete_topic,
    RequestCode.GET_NAMESRV_CONFIG: get_namesrv_config,
    RequestCode.UPDATE_NAMESRV_CONFIG: NAMESRV_FIXED,
    RequestCode.GET_KV_CONFIG: get_kv_config,
    RequestCode.PUT_KV_CONFIG: NO_KV,
    RequestCode.DELETE_KV_CONFIG: NO_KV,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER: PERM,
    RequestCode.ADD_WRITE_PERM_OF_BROKER: PERM,
}
