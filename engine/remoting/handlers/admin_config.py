"""The broker's and the name server's configuration as ``mqadmin`` reads it (``getBrokerConfig``,
``getNamesrvConfig``, ``exportConfigs``), and the admin requests lakemq refuses, each with the reason
as its remark (ACL, KV config, broker write permissions, manual retention, configuration changes at
run time): REQUEST_CODE_NOT_SUPPORTED or NO_PERMISSION, and nothing written.
"""

from __future__ import annotations

import json

from engine.protocol.delays import DELAY_LEVELS_MS
from engine.protocol.messages import MAX_BODY_BYTES
from engine.protocol.permissions import DEFAULT_PERM
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import BROKER_NAME, BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header
from engine.remoting.wire_messages import CLUSTER_NAME


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
    RequestCode.GET_BROKER_CONFIG: get_broker_config,
    RequestCode.UPDATE_BROKER_CONFIG: update_broker_config,
    RequestCode.UPDATE_AND_CREATE_ACL_CONFIG: NO_ACL,
    RequestCode.DELETE_ACL_CONFIG: NO_ACL,
    RequestCode.GET_BROKER_CLUSTER_ACL_INFO: NO_ACL,
    RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: NO_ACL,
    RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE: RETENTION,
    RequestCode.CLEAN_UNUSED_TOPIC: RETENTION,
    RequestCode.DELETE_EXPIRED_COMMITLOG: RETENTION,
}
NAMESRV_HANDLERS: dict[int, Handler] = {
    RequestCode.GET_NAMESRV_CONFIG: get_namesrv_config,
    RequestCode.UPDATE_NAMESRV_CONFIG: NAMESRV_FIXED,
    RequestCode.GET_KV_CONFIG: get_kv_config,
    RequestCode.PUT_KV_CONFIG: NO_KV,
    RequestCode.DELETE_KV_CONFIG: NO_KV,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER: PERM,
    RequestCode.ADD_WRITE_PERM_OF_BROKER: PERM,
}
