"""The name server's requests: where a topic's queues live (always this one broker)."""

from __future__ import annotations

import contextlib

from engine.client.admin import Admin
from engine.errors import InvalidArgumentError, InvalidTopicError, TopicExistsError, TopicNotFoundError
from engine.model import TopicConfig
from engine.protocol.names import TRACE_TOPIC
from engine.protocol.permissions import Perm
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import BROKER_NAME, BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header, json_bytes
from engine.remoting.wire_messages import CLUSTER_NAME, REPLY_TOPIC

DEFAULT_TOPIC = "TBW102"  # the template topic a producer asks for before its topic exists


def broker_data(ctx: BrokerContext) -> dict[str, object]:
    """The one broker (``BrokerData``): master id 0 at the endpoint's address."""
    return {"cluster": CLUSTER_NAME, "brokerName": BROKER_NAME, "brokerAddrs": {"0": ctx.address}}


def route_data(ctx: BrokerContext, topic: TopicConfig) -> dict[str, object]:
    """``TopicRouteData`` of a topic: its queues, all on this broker."""
    queue = {
        "brokerName": BROKER_NAME,
        "readQueueNums": topic.queues,
        "writeQueueNums": topic.queues,
        "perm": topic.perm,
        "topicSysFlag": 0,
    }
    return {"queueDatas": [queue], "brokerDatas": [broker_data(ctx)], "filterServerTable": {}}


# The template's permission as RocketMQ's broker registers it: read, write and inherit (a topic made
# from it on a send takes its queues).
TEMPLATE_PERM = int(Perm.READ | Perm.WRITE | Perm.INHERIT)


def find_topic(ctx: BrokerContext, name: str) -> TopicConfig | None:
    """A topic's config, or None. With auto-creation on, as RocketMQ's broker with
    ``autoCreateTopicEnable``: the template topic TBW102 has a route (never stored), with the store's
    default queue count; a producer whose topic has no route sends through it, and the broker
    creates the topic on that first send (:func:`ensure_sent_topic`). Any other missing topic has
    no route: a consumer or a tool asking for one learns it does not exist, and creates nothing."""
    try:
        return ctx.store.topic(name)
    except TopicNotFoundError:
        if not ctx.auto_create_topics:
            return None
    if name == DEFAULT_TOPIC:
        return TopicConfig(DEFAULT_TOPIC, ctx.store.config.default_queues, TEMPLATE_PERM)
    if name == TRACE_TOPIC:  # a client with message trace on: RocketMQ's broker has it ready
        return Admin(ctx.store).ensure_system_topic(name)
    if name == REPLY_TOPIC:
        return ensure_reply_topic(ctx)
    return None


def ensure_reply_topic(ctx: BrokerContext) -> TopicConfig:
    """The topic a request's responder replies to (one queue), created if missing: RocketMQ's broker
    has it ready, whatever its auto-creation setting."""
    with contextlib.suppress(TopicExistsError):
        Admin(ctx.store).create_topic(REPLY_TOPIC, queues=1)
    return ctx.store.topic(REPLY_TOPIC)


def ensure_sent_topic(ctx: BrokerContext, name: str, client_queues: int) -> None:
    """Before a send: with auto-creation on, create a missing topic with the queues the client asked
    for (its ``defaultTopicQueueNums``, 4 by default), at most the template's, as RocketMQ's
    ``createTopicInSendMessageMethod``. A name no topic may have is left to the send to refuse."""
    if not ctx.auto_create_topics:
        return
    try:
        ctx.store.topic(name)
        return
    except TopicNotFoundError:
        pass
    queues = max(1, min(client_queues, ctx.store.config.default_queues))
    with contextlib.suppress(TopicExistsError, InvalidTopicError, InvalidArgumentError):
        Admin(ctx.store).create_topic(name, queues=queues)


async def get_route(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_ROUTEINFO_BY_TOPIC: the topic's route, or TOPIC_NOT_EXIST."""
    name = Header(cmd.ext_fields).text("topic")
    topic = await ctx.run(find_topic, ctx, name)
    if topic is None:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {name}"
        )
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes(route_data(ctx, topic)))


async def get_cluster_info(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_BROKER_CLUSTER_INFO: one cluster of one broker."""
    body = {
        "brokerAddrTable": {BROKER_NAME: broker_data(ctx)},
        "clusterAddrTable": {CLUSTER_NAME: [BROKER_NAME]},
    }
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes(body))


async def get_topic_list(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_ALL_TOPIC_LIST_FROM_NAMESERVER: every topic's name."""
    # As read now: a topic another process (the CLI, a Python producer) created is listed at once.
    configs = await ctx.run(lambda: ctx.store.topic_configs(refresh=True))
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes({"topicList": sorted(configs)}))


HANDLERS: dict[int, Handler] = {
    RequestCode.GET_ROUTEINFO_BY_TOPIC: get_route,
    RequestCode.GET_BROKER_CLUSTER_INFO: get_cluster_info,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: get_topic_list,
}
