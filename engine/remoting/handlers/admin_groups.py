"""Subscription groups as ``mqadmin`` manages them (``updateSubGroup``, ``deleteSubGroup``,
``getConsumerConfig``, ``cloneGroupOffset``): UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG, DELETE_SUBSCRIPTIONGROUP and CLONE_GROUP_OFFSET.

A group here is what the store knows of it: its ``%RETRY%`` topic (made on a consumer's first
heartbeat, as RocketMQ's broker auto-creates a subscription group, or by UPDATE_AND_CREATE) and its
live members; its settings are the engine's behaviour, which RocketMQ's defaults describe. A setting
the engine cannot honour is refused, not stored and ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.client.admin_offsets import committed_offsets, lag_rows
from engine.client.membership import live_subscriptions
from engine.model import TopicConfig
from engine.protocol.names import RETRY_PREFIX, retry_topic, validate_group_name
from engine.protocol.topics import system_topic_config, system_topic_queues
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import WIRE_MEMBER_TIMEOUT_MS, BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header, json_body, json_bytes
from engine.store.consumer_offset import OffsetStore
from engine.store.group_configs import group_config as stored_group_config
from engine.store.group_configs import group_configs, record_group_config
from engine.store.store import now_ms


def group_config(ctx: BrokerContext, group: str, fifo: bool = False) -> dict[str, object]:
    """The ``SubscriptionGroupConfig`` a group has here: RocketMQ's defaults, which are what the
    engine does (retries as the store's ``max_reconsume_times``, one retry queue), and whether it is
    a FIFO group (``consumeMessageOrderly``, RocketMQ 5's field; the store's group setting)."""
    return {
        "consumeMessageOrderly": fifo,
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
        "consumeMessageOrderly",  # stored as the group's FIFO setting (create_group_sync)
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
    orderly = config.get("consumeMessageOrderly")
    if orderly is not None and not isinstance(orderly, bool):
        return f"consumeMessageOrderly={orderly!r} must be true or false"
    name = retry_topic(group)
    if ctx.store.topic_configs(refresh=True).get(name) is None:
        ctx.store.put_topic(system_topic_config(name, now_ms()))
    if orderly is not None and orderly != stored_group_config(ctx.store, group).fifo:
        record_group_config(ctx.store, group, fifo=orderly)
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
    settings = group_configs(ctx.store)
    fifo = {g: c.fifo for g, c in settings.items()}
    return {
        "subscriptionGroupTable": {g: group_config(ctx, g, fifo.get(g, False)) for g in groups},
        "dataVersion": {"counter": len(groups), "timestamp": now_ms()},
    }


async def all_subscription_groups(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """GET_ALL_SUBSCRIPTIONGROUP_CONFIG."""
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes(await ctx.run(all_groups_sync, ctx)))


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


HANDLERS: dict[int, Handler] = {
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: update_subscription_group,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: all_subscription_groups,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: delete_subscription_group,
    RequestCode.CLONE_GROUP_OFFSET: clone_group_offset,
}
