"""Broker requests that store messages: SEND_MESSAGE (V1 and V2 headers), SEND_BATCH_MESSAGE and
CONSUMER_SEND_MSG_BACK. Each goes through the engine's producer or consumer path."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from engine.client.queries import view_message
from engine.client.sending import PreparedSend
from engine.errors import InvalidMessageError, TopicNotFoundError
from engine.model import SendResult
from engine.protocol.actions import NACK
from engine.protocol.delays import nack_plan
from engine.protocol.message_ids import make_msg_id
from engine.protocol.messages import MAX_BODY_BYTES, check_body_size
from engine.protocol.names import validate_group_name
from engine.remoting.codes import TRANSACTION_MASK, MessageSysFlag, RequestCode, ResponseCode
from engine.remoting.context import BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.handlers.namesrv import ensure_sent_topic
from engine.remoting.headers import Header
from engine.remoting.message_layout import (
    BatchRecord,
    decode_batch_records,
    decode_properties,
    offset_msg_id,
    offset_msg_ids,
)
from engine.remoting.recent import sent
from engine.remoting.retry_sends import is_retry_send, send_retry
from engine.remoting.wire_messages import IncomingMessage, incoming, inflate
from engine.store.store import now_ms

T = TypeVar("T")

# SendMessageRequestHeaderV2's one-letter names for SendMessageRequestHeader's.
V2_ALIASES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "brokerName",
}


def _result_fields(ctx: BrokerContext, result: SendResult) -> dict[str, object]:
    return {
        "msgId": offset_msg_id(ctx.host, ctx.port, result.physical_offset),
        "queueId": result.queue_id,
        "queueOffset": result.queue_offset,
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
    }


async def send_message(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE."""
    aliases = (
        V2_ALIASES if cmd.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE) else None
    )
    header = Header(cmd.ext_fields, aliases)
    group = header.text("producerGroup")
    topic = header.text("topic")
    queue_id = header.int32("queueId")
    sys_flag = header.int32("sysFlag", 0)
    batch = cmd.code == RequestCode.SEND_BATCH_MESSAGE or header.flag("batch")
    if len(cmd.body) > ctx.store.config.max_batch_bytes if batch else len(cmd.body) > MAX_BODY_BYTES:
        raise InvalidMessageError(
            f"message body is {len(cmd.body)} bytes; at most {MAX_BODY_BYTES} are allowed"
        )
    conn.producer_groups.add(group)
    born_host = conn.address
    born_ts = header.int64("bornTimestamp", 0)
    if not is_retry_send(topic) and topic not in ctx.sent_topics:
        await ctx.run(ensure_sent_topic, ctx, topic, header.int32("defaultTopicQueueNums", 4))
        ctx.sent_topics.add(topic)
    if batch:
        items = decode_batch_records(cmd.body)
        put = _store_batch(ctx, topic, queue_id, items, born_host, born_ts)
        stored, results = await _timed(ctx, put, len(items), len(cmd.body))
        _hold_soon(ctx, stored, results)
        ctx.hold.arrived(topic, results[-1].queue_id, results[-1].queue_offset + 1)
        fields = _result_fields(ctx, results[0])
        fields["msgId"] = ",".join(offset_msg_ids(ctx.host, ctx.port, (r.physical_offset for r in results)))
        return cmd.response(ResponseCode.SUCCESS, ext_fields=fields)
    body = inflate(cmd.body, sys_flag)
    check_body_size(len(body), topic)
    properties = decode_properties(header.text("properties", ""))
    flag = header.int32("flag", 0)
    item = incoming(topic, body, properties, born_host=born_host, flag=flag, born_ts_ms=born_ts)
    if is_retry_send(topic):
        times, limit = header.int32("reconsumeTimes", 0), header.int32("maxReconsumeTimes", -1)
        args = (ctx.store, ctx.producer, topic, item, times, limit, born_ts)
        retried = await _timed(ctx, ctx.run(send_retry, *args), 1, len(body))
        return cmd.response(ResponseCode.SUCCESS, ext_fields=_result_fields(ctx, retried))
    prepared = (sys_flag & TRANSACTION_MASK) == MessageSysFlag.TRANSACTION_PREPARED
    if item.transactional or prepared:
        put_half = ctx.run(ctx.producer.send_half, item, queue_id, item.producer_group or group)
        half = await _timed(ctx, put_half, 1, len(body))
        fields = {
            "msgId": offset_msg_id(ctx.host, ctx.port, half.physical_offset),
            "queueId": queue_id,
            "queueOffset": 0,
            "transactionId": half.uniq_key,
            "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
        }
        return cmd.response(ResponseCode.SUCCESS, ext_fields=fields)
    try:
        stored, results = await _timed(ctx, _store(ctx, item, queue_id), 1, len(body))
    except TopicNotFoundError:  # deleted since a send found it: created again, as on a first send
        ctx.sent_topics.discard(topic)
        await ctx.run(ensure_sent_topic, ctx, topic, header.int32("defaultTopicQueueNums", 4))
        stored, results = await _timed(ctx, _store(ctx, item, queue_id), 1, len(body))
    result = results[0]
    _hold_soon(ctx, stored, results)
    # (a delayed message's wakes a pull for nothing: it reads, finds nothing yet, and parks again)
    ctx.hold.arrived(topic, result.queue_id, result.queue_offset + 1)
    return cmd.response(ResponseCode.SUCCESS, ext_fields=_result_fields(ctx, result))


async def _timed(ctx: BrokerContext, put: Awaitable[T], messages: int, body_bytes: int) -> T:
    """Await a put of ``messages`` messages of ``body_bytes`` bytes, counted in the broker's put
    statistics once it landed (:class:`~engine.remoting.put_stats.PutStats`)."""
    began = time.monotonic()
    landed = await put
    ctx.put_stats.record(time.monotonic() - began, messages, body_bytes)
    return landed


async def _store(
    ctx: BrokerContext, item: IncomingMessage, queue_id: int
) -> tuple[Sequence[PreparedSend], list[SendResult]]:
    """Store one client message in the next group commit: what the commit stored, and its result."""
    if ctx.commits is not None:  # checked and committed on the event loop
        prepared = (ctx.producer.prepare_wire(item, queue_id),)
        return prepared, await ctx.commits.submit(prepared)
    queued = await _queued(ctx, ctx.producer.send_wire_grouped, item, queue_id)
    return queued.prepared, [await ctx.landings.wait(queued.future)]


async def _store_batch(
    ctx: BrokerContext,
    topic: str,
    queue_id: int,
    items: list[BatchRecord],
    born_host: tuple[str, int] | None,
    born_ts: int,
) -> tuple[Sequence[PreparedSend], list[SendResult]]:
    """Store a client's batch, whole, in the next group commit: what it stored, and the results."""
    if ctx.commits is not None:  # checked and committed on the event loop
        prepared = ctx.producer.prepare_client_batch(
            topic, queue_id, items, born_host=born_host, born_ts_ms=born_ts
        )
        return prepared, await ctx.commits.submit(prepared)
    prepare = functools.partial(ctx.producer.prepare_client_batch, born_host=born_host, born_ts_ms=born_ts)
    queued = ctx.producer.queue_batch(await _queued(ctx, prepare, topic, queue_id, items))
    return queued.prepared, await ctx.landings.wait(queued.future)


def _hold_soon(ctx: BrokerContext, prepared: Sequence[PreparedSend], results: Sequence[SendResult]) -> None:
    """Keep what was just stored among the recent messages (:func:`engine.remoting.recent.sent`), so
    that a pull reading close behind is answered from them: on the event loop, which alone changes
    them, once the send's response is on its way (a pull before that reads them, as before)."""
    if ctx.recent.enabled:
        asyncio.get_running_loop().call_soon(_hold, ctx, prepared, results)


def _hold(ctx: BrokerContext, prepared: Sequence[PreparedSend], results: Sequence[SendResult]) -> None:
    held = sent(prepared, results, (ctx.host, ctx.port))
    if held:
        ctx.recent.put(results[0].topic, results[0].queue_id, held)


async def _queued(ctx: BrokerContext, queue: Callable[..., T], *args: Any) -> T:
    """``queue(*args)``: on a local store checked and queued on the event loop (no I/O then: no
    thread hop each way); elsewhere a topic look-up may ask the object store, so on a worker thread."""
    if ctx.store.is_local:
        return queue(*args)
    return await ctx.run(queue, *args)


def send_back_sync(
    ctx: BrokerContext, group: str, physical_offset: int, delay_level: int, max_times: int | None
) -> None:
    """Record a client's failed message as a NACK of ``group``, as the Python push consumer's
    RECONSUME_LATER does: the retry job sends it to ``%RETRY%<group>`` after delay level 3 +
    reconsume times (``delay_level`` > 0: that level; -1: straight to the DLQ), or to
    ``%DLQ%<group>`` once it failed ``max_times`` times.

    Raises:
        MessageNotFoundError: no message at ``physical_offset``.
    """
    message = view_message(ctx.store, make_msg_id(ctx.store.store_id, physical_offset), index=ctx.index)
    config_max = ctx.store.config.max_reconsume_times
    consumer_max = config_max if max_times is None or max_times < 0 else max_times
    times, retry_at = nack_plan(message.reconsume_times, consumer_max, delay_level, config_max, now_ms())
    writer = ctx.actions(group)
    writer.record(NACK, message, reconsume_times=times, deadline_ms=retry_at)
    writer.flush()


async def consumer_send_back(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """CONSUMER_SEND_MSG_BACK: a push consumer's RECONSUME_LATER."""
    header = Header(cmd.ext_fields)
    group = validate_group_name(header.text("group"))
    offset = header.int64("offset")
    delay_level = header.int32("delayLevel", 0)
    max_times = header.int32("maxReconsumeTimes", -1)
    await ctx.run(ctx.ensure_retry_topic, group)
    await ctx.run(send_back_sync, ctx, group, offset, delay_level, max_times)
    return cmd.response(ResponseCode.SUCCESS)


HANDLERS: dict[int, Handler] = {
    RequestCode.SEND_MESSAGE: send_message,
    RequestCode.SEND_MESSAGE_V2: send_message,
    RequestCode.SEND_BATCH_MESSAGE: send_message,
    RequestCode.CONSUMER_SEND_MSG_BACK: consumer_send_back,
}
