"""The name server's requests: where a topic's queues live (always this one broker)."""

from __future__ import annotations

from engine.client.admin import Admin
from engine.errors import TopicExistsError, TopicNotFoundError
from engine.model import TopicConfig
from engine.protocol.names import TRACE_TOPIC
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import BROKER_NAME, CLUSTER_NAME, BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header, json_bytes

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


def find_topic(ctx: BrokerContext, name: str) -> TopicConfig | None:
    """A topic's config; with auto-creation on, a missing valid topic is created with the store's
    default queue count (the template topic TBW102 never is: clients then ask for the real one)."""
    try:
        return ctx.store.topic(name)
    except TopicNotFoundError:
        if not ctx.auto_create_topics or name == DEFAULT_TOPIC:
            return None
    if name == TRACE_TOPIC:  # a client with message trace on: RocketMQ's broker has it ready
        return Admin(ctx.store).ensure_system_topic(name)
    try:
        return Admin(ctx.store).create_topic(name, queues=ctx.store.config.default_queues)
    except TopicExistsError:
        return ctx.store.topic(name)


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
