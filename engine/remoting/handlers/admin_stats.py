"""Broker statistics as ``mqadmin`` reads them (``clusterList``, ``brokerStatus``, ``statsAll``):
GET_BROKER_RUNTIME_INFO and VIEW_BROKER_STATS_DATA, counted from the store's own tables.

RocketMQ's broker counts puts and gets in memory since it started. Here the tables are the record:
a topic's puts in a window are the consume-queue entries stored in it (the first offset stored at or
after the window's start, by binary search on store time, up to the max offset); a group's gets are
how far its committed offsets moved in the window (``consumer_offset`` rows as of its start and now).
So the figures survive a restart and agree with what ``mq lag`` and SQL over the tables show.
"""

from __future__ import annotations

import datetime as _dt
import math
import shutil
from collections.abc import Iterable
from dataclasses import dataclass

from engine.client.admin_offsets import committed_offsets
from engine.client.offsets import offset_by_time
from engine.model import TopicConfig
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.context import BrokerContext, Connection, Handler
from engine.remoting.frames import SERVER_VERSION, RemotingCommand
from engine.remoting.headers import Header, json_bytes
from engine.store import schemas
from engine.store.store import now_ms

VERSION_DESC = "V4_9_8"  # MQVersion.getVersionDesc(SERVER_VERSION)
MINUTE_MS, HOUR_MS, DAY_MS = 60_000, 3_600_000, 86_400_000
TPS_WINDOWS_MS = (10_000, 60_000, 600_000)  # RocketMQ's putTps / getTransferedTps: 10 s, 1 min, 10 min
# Stats names of BrokerStatsManager that VIEW_BROKER_STATS_DATA answers.
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"


def topic_puts_since(ctx: BrokerContext, topic: TopicConfig, since_ms: int) -> int:
    """Messages of ``topic`` stored at or after ``since_ms`` (dispatched, still retained)."""
    total = 0
    for qid in range(topic.queues):
        _, high = ctx.index.bounds(topic.name, qid)
        total += high - offset_by_time(ctx.index, topic.name, qid, since_ms)
    return total


def topic_puts_total(ctx: BrokerContext, topics: Iterable[TopicConfig]) -> int:
    """Messages ever stored in ``topics``: the sum of their queues' max offsets."""
    ctx.index.refresh()
    return sum(ctx.index.bounds(t.name, qid)[1] for t in topics for qid in range(t.queues))


@dataclass(frozen=True)
class _OffsetRow:
    key: tuple[str, str, str, int]  # group, consumer id, topic, queue id
    offset: int
    ts_ms: int


def _offset_rows(ctx: BrokerContext) -> list[_OffsetRow]:
    table = ctx.store.read(
        schemas.CONSUMER_OFFSET, columns=["group", "consumer_id", "topic", "queue_id", "offset", "ts_ms"]
    )
    return [
        _OffsetRow(
            (r["group"], r["consumer_id"], r["topic"], int(r["queue_id"])), int(r["offset"]), int(r["ts_ms"])
        )
        for r in table.to_pylist()
    ]


def consumed_as_of(rows: Iterable[_OffsetRow], as_of_ms: int) -> int:
    """The sum of every group's committed offsets as they stood at ``as_of_ms`` (latest row wins)."""
    latest: dict[tuple[str, str, str, int], tuple[int, int]] = {}
    for row in rows:
        if row.ts_ms > as_of_ms:
            continue
        seen = latest.get(row.key)
        if seen is None or row.ts_ms >= seen[0]:
            latest[row.key] = (row.ts_ms, row.offset)
    return sum(offset for _, offset in latest.values())


def group_gets_since(ctx: BrokerContext, group: str, topic: str, since_ms: int, now: int) -> int:
    """How far the group's committed offsets of ``topic`` moved since ``since_ms`` (a queue first
    committed since then counts from 0, as :func:`consumed_as_of` does)."""
    before = committed_offsets(ctx.store, group, topic, as_of_ms=since_ms)
    after = committed_offsets(ctx.store, group, topic, as_of_ms=now)
    return sum(max(0, offset - before.get(qid, 0)) for qid, offset in after.items())


def _midnight(now: int, days_back: int) -> int:
    day = _dt.datetime.fromtimestamp(now / 1000).date() - _dt.timedelta(days=days_back)
    return int(_dt.datetime.combine(day, _dt.time()).timestamp() * 1000)


def _tps(count_since: dict[int, int]) -> str:
    return " ".join(f"{count_since[w] / (w / 1000):.1f}" for w in TPS_WINDOWS_MS)


def runtime_info_sync(ctx: BrokerContext) -> dict[str, str]:
    """RocketMQ's broker runtime table (``KVTable``), from the store's tables."""
    now = now_ms()
    topics = list(ctx.store.topic_configs(refresh=True).values())
    ctx.index.refresh()
    put_now = topic_puts_total(ctx, topics)
    morning, yesterday = _midnight(now, 0), _midnight(now, 1)

    def puts_before(ts: int) -> int:
        return put_now - sum(topic_puts_since(ctx, t, ts) for t in topics)

    rows = _offset_rows(ctx)
    got_now = consumed_as_of(rows, now)
    earliest = [
        int(entry["store_ts_ms"][0].as_py())
        for t in topics
        for qid in range(t.queues)
        if (entry := ctx.index.entries(t.name, qid, *_first(ctx, t.name, qid))).num_rows
    ]
    info = {
        "brokerVersionDesc": VERSION_DESC,
        "brokerVersion": str(SERVER_VERSION),
        "msgPutTotalYesterdayMorning": str(puts_before(yesterday)),
        "msgPutTotalTodayMorning": str(puts_before(morning)),
        "msgPutTotalTodayNow": str(put_now),
        "msgGetTotalYesterdayMorning": str(consumed_as_of(rows, yesterday)),
        "msgGetTotalTodayMorning": str(consumed_as_of(rows, morning)),
        "msgGetTotalTodayNow": str(got_now),
        "putTps": _tps({w: put_now - puts_before(now - w) for w in TPS_WINDOWS_MS}),
        "getTransferedTps": _tps({w: got_now - consumed_as_of(rows, now - w) for w in TPS_WINDOWS_MS}),
        # The request pools' backlogs (RocketMQ's send and pull thread-pool queues).
        "sendThreadPoolQueueSize": str(ctx.executor._work_queue.qsize()),
        "pullThreadPoolQueueSize": str(ctx.pull_executor._work_queue.qsize()),
        # No request waits in a queue head nor behind a page-cache lock here: sends are group commits.
        "sendThreadPoolQueueHeadWaitTimeMills": "0",
        "pullThreadPoolQueueHeadWaitTimeMills": "0",
        "pageCacheLockTimeMills": "0",
        "earliestMessageTimeStamp": str(min(earliest) if earliest else now),
    }
    if ctx.store.is_local:
        usage = shutil.disk_usage(ctx.store.root)
        info["commitLogDiskRatio"] = f"{(usage.total - usage.free) / usage.total:.4f}"
        info["commitLogDirCapacity"] = f"Total : {_human(usage.total)}, Free : {_human(usage.free)}."
    return info


def _first(ctx: BrokerContext, topic: str, qid: int) -> tuple[int, int]:
    low, high = ctx.index.bounds(topic, qid)
    return (low, low + 1) if high > low else (low, low)


def _human(size: int) -> str:
    """Bytes as RocketMQ's ``MixAll.humanReadableByteCount(bytes, false)`` prints them (KiB, MiB …)."""
    if size < 1024:
        return f"{size} B"
    exp = min(int(math.log(size) / math.log(1024)), 6)
    return f"{size / 1024**exp:.1f} {'KMGTPE'[exp - 1]}iB"


def _stats_item(count: int, window_ms: int) -> dict[str, float | int]:
    # avgpt (RocketMQ: value per put call) is not recorded by the tables: 0 says "not measured".
    return {"sum": count, "tps": count / (window_ms / 1000), "avgpt": 0.0}


def broker_stats_sync(ctx: BrokerContext, name: str, key: str) -> dict[str, object] | None:
    """``BrokerStatsData`` of one stats item (minute, hour, day); None when the item is unknown."""
    now = now_ms()
    topics = ctx.store.topic_configs(refresh=True)
    ctx.index.refresh()
    windows = (MINUTE_MS, HOUR_MS, DAY_MS)
    counts: list[int]
    if name == TOPIC_PUT_NUMS:
        topic = topics.get(key)
        if topic is None:
            return None
        counts = [topic_puts_since(ctx, topic, now - w) for w in windows]
    elif name == GROUP_GET_NUMS:
        topic_name, _, group = key.partition("@")
        if topic_name not in topics or not group:
            return None
        counts = [group_gets_since(ctx, group, topic_name, now - w, now) for w in windows]
    elif name == BROKER_PUT_NUMS:
        counts = [sum(topic_puts_since(ctx, t, now - w) for t in topics.values()) for w in windows]
    elif name == BROKER_GET_NUMS:
        rows = _offset_rows(ctx)
        got = consumed_as_of(rows, now)
        counts = [got - consumed_as_of(rows, now - w) for w in windows]
    else:
        return None
    minute, hour, day = (_stats_item(c, w) for c, w in zip(counts, windows, strict=True))
    return {"statsMinute": minute, "statsHour": hour, "statsDay": day}


async def broker_runtime_info(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """GET_BROKER_RUNTIME_INFO: the runtime table ``clusterList`` and ``brokerStatus`` print."""
    table = await ctx.run(runtime_info_sync, ctx)
    table.update(ctx.put_stats.runtime_fields())  # the event loop's own counters, read on it
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes({"table": table}))


async def view_broker_stats(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """VIEW_BROKER_STATS_DATA: puts of a topic, gets of a group on a topic, or the broker's, over the
    last minute, hour and day (what ``statsAll`` prints)."""
    header = Header(cmd.ext_fields)
    name, key = header.text("statsName"), header.text("statsKey")
    data = await ctx.run(broker_stats_sync, ctx, name, key)
    if data is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
    return cmd.response(ResponseCode.SUCCESS, body=json_bytes(data))


HANDLERS: dict[int, Handler] = {
    RequestCode.GET_BROKER_RUNTIME_INFO: broker_runtime_info,
    RequestCode.VIEW_BROKER_STATS_DATA: view_broker_stats,
}
