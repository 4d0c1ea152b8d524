"""PULL_MESSAGE: the engine's pull primitive (with its long polling) over the wire.

Statuses map as RocketMQ's broker answers them: FOUND -> SUCCESS (the messages in the stored
layout), NO_NEW_MSG -> PULL_NOT_FOUND, NO_MATCHED_MSG -> PULL_RETRY_IMMEDIATELY, OFFSET_ILLEGAL ->
PULL_OFFSET_MOVED; the offset corrections travel in nextBeginOffset / minOffset / maxOffset.
"""

from __future__ import annotations

import asyncio
import logging
import time

from engine.client.pull import PullConsumer
from engine.errors import InvalidSelectorError
from engine.model import PullResult, PullStatus
from engine.protocol.pull import MAX_PULL_NUMS
from engine.protocol.selectors import ExpressionType, MessageSelector
from engine.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from engine.remoting.context import BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header
from engine.remoting.recent import READ_AHEAD_LOW, READ_ON_MISS, PullAnswer, Recent, encode, read_ahead

_log = logging.getLogger(__name__)

PULL_CODES = {
    PullStatus.FOUND: ResponseCode.SUCCESS,
    PullStatus.NO_NEW_MSG: ResponseCode.PULL_NOT_FOUND,
    PullStatus.NO_MATCHED_MSG: ResponseCode.PULL_RETRY_IMMEDIATELY,
    PullStatus.OFFSET_ILLEGAL: ResponseCode.PULL_OFFSET_MOVED,
}


def selector_of(expression: str | None, expression_type: str | None) -> MessageSelector:
    """The engine's selector for a subscription as a client sends it (TAG by default; ``SQL92``).

    Raises:
        InvalidSelectorError: an unknown expression type or an expression that does not parse.
    """
    kind = (expression_type or "TAG").upper()
    if kind == "SQL92":
        return MessageSelector.by_sql(expression or "")
    if kind != "TAG":
        raise InvalidSelectorError(
            f"expression type {expression_type!r} is not TAG or SQL92", expression=expression
        )
    return MessageSelector.by_tag(expression or "*")


def engine_answer(store_host: tuple[str, int], result: PullResult) -> PullAnswer:
    """A pull's answer from the engine's :class:`PullResult` (the messages in their wire encoding)."""
    body = b""
    if result.status is PullStatus.FOUND:
        body = b"".join(encode(m, store_host) for m in result.messages)
    return PullAnswer(result.status, body, result.next_begin_offset, result.min_offset, result.max_offset)


def answer_response(cmd: RemotingCommand, answer: PullAnswer) -> RemotingCommand:
    """The response to a pull: its status code, offsets and, when FOUND, the messages."""
    fields = {
        "suggestWhichBrokerId": 0,
        "nextBeginOffset": answer.next_begin_offset,
        "minOffset": answer.min_offset,
        "maxOffset": answer.max_offset,
    }
    return cmd.response(PULL_CODES[answer.status], ext_fields=fields, body=answer.body)


def _engine_pull(
    ctx: BrokerContext, puller: PullConsumer, args: tuple[str, int, int, int, MessageSelector, int]
) -> PullAnswer:
    return engine_answer((ctx.host, ctx.port), puller.pull(*args))


def _bounds_and_ahead(
    ctx: BrokerContext, puller: PullConsumer, topic: str, queue_id: int, offset: int, ahead: bool
) -> tuple[int, int, list[tuple[int, Recent]]]:
    """The queue's bounds as a pull refreshes them and, with ``ahead``, the messages from
    ``offset`` on (:func:`read_ahead`). On a pull thread."""
    low, high = puller.bounds_now(topic, queue_id, offset)
    if not ahead or not low <= offset < high:
        return low, high, []
    host = (ctx.host, ctx.port)
    return low, high, read_ahead(ctx.index, host, topic, queue_id, offset, high, READ_ON_MISS)


async def read_pull(
    ctx: BrokerContext,
    puller: PullConsumer,
    topic: str,
    queue_id: int,
    offset: int,
    max_nums: int,
    selector: MessageSelector,
) -> PullAnswer:
    """One read of a pull: from the recent messages (:mod:`engine.remoting.recent`) when they hold
    its answer, else from the engine.

    When the queue index has nothing new to read (a file check on a local store), the bounds are
    the index's as they stand and a held answer is given on the event loop, without a thread hop.
    Otherwise the index is refreshed on a pull thread, which also reads ahead from ``offset`` when
    that message is not held, and the answer is given from what is held then. A pull that still
    needs messages not held (a sparse tag filter, SQL92) is the engine's."""
    recent = ctx.recent
    args = (topic, queue_id, offset, max_nums, selector, 0)
    if not recent.enabled or not (selector.matches_all or selector.type is ExpressionType.TAG):
        return await ctx.run(_engine_pull, ctx, puller, args, pull=True)
    answer = None
    bounds = ctx.index.current_bounds(topic, queue_id) if ctx.store.is_local else None
    if bounds is not None:
        puller.check_queue(topic, queue_id)
        answer = recent.answer(topic, queue_id, offset, max_nums, selector, *bounds)
    reading = recent.reading.get((topic, queue_id))
    if answer is None and reading is not None and not recent.holds(topic, queue_id, offset):
        await asyncio.shield(reading)  # the read under way may bring this pull's messages
    if answer is None:
        ahead = not recent.holds(topic, queue_id, offset)
        low, high, items = await ctx.run(
            _bounds_and_ahead, ctx, puller, topic, queue_id, offset, ahead, pull=True
        )
        recent.put(topic, queue_id, items)
        answer = recent.answer(topic, queue_id, offset, max_nums, selector, low, high)
        if answer is None:
            return await ctx.run(_engine_pull, ctx, puller, args, pull=True)
    if answer.status is PullStatus.FOUND:
        _read_on(ctx, topic, queue_id, answer.next_begin_offset, answer.max_offset)
    return answer


def _read_on(ctx: BrokerContext, topic: str, queue_id: int, offset: int, high: int) -> None:
    """Start reading ahead of a queue's reader in the background when fewer than
    :data:`READ_AHEAD_LOW` messages are held past ``offset`` (one read per queue at a time), so its
    next pulls find their messages held."""
    recent = ctx.recent
    start = recent.missing_from(topic, queue_id, offset, READ_AHEAD_LOW)
    if start is None or start >= high or (topic, queue_id) in recent.reading:
        return
    task = asyncio.get_running_loop().create_task(_read_ahead(ctx, topic, queue_id, start, high))
    recent.reading[(topic, queue_id)] = task


async def _read_ahead(ctx: BrokerContext, topic: str, queue_id: int, start: int, high: int) -> None:
    try:
        host = (ctx.host, ctx.port)
        items = await ctx.run(read_ahead, ctx.index, host, topic, queue_id, start, high, pull=True)
        ctx.recent.put(topic, queue_id, items)
    except Exception as exc:  # the pulls read through the engine instead
        _log.debug("reading ahead of %s:%s from %s failed: %s", topic, queue_id, start, exc)
    finally:
        ctx.recent.reading.pop((topic, queue_id), None)


async def pull_message(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """PULL_MESSAGE, with suspension (:mod:`engine.remoting.pull_hold`) and the piggybacked offset
    commit.

    A pull that does not carry its subscription (the push consumer's) is filtered by the one its
    group's latest heartbeat named; before any heartbeat named it (after a server restart) the
    answer is SUBSCRIPTION_NOT_EXIST, as RocketMQ's PullMessageProcessor answers, never an
    unfiltered pull. The client retries after its next heartbeat."""
    header = Header(cmd.ext_fields)
    group = header.text("consumerGroup")
    topic = header.text("topic")
    queue_id = header.int32("queueId")
    offset = header.int64("queueOffset")
    max_nums = min(max(header.int32("maxMsgNums", 32), 1), MAX_PULL_NUMS)
    flags = PullSysFlag(header.int32("sysFlag", 0) & 0x1F)
    commit_offset = header.int64("commitOffset", -1)
    suspend_ms = header.int64("suspendTimeoutMillis", 0) if PullSysFlag.SUSPEND in flags else 0
    if PullSysFlag.SUBSCRIPTION in flags:
        selector = selector_of(header.optional("subscription"), header.optional("expressionType"))
    else:  # the subscription of the group's latest heartbeat; none known yet: the client must say
        subs = ctx.subscriptions.get(group)
        if subs is None:
            return cmd.response(ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's group info not exist")
        if topic not in subs:
            return cmd.response(ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist")
        selector = selector_of(*subs[topic])
    puller = ctx.puller(group)
    ctx.resets.pulled(group, topic, queue_id, offset)
    if PullSysFlag.COMMIT_OFFSET in flags and commit_offset >= 0:
        # Kept before the long poll, as RocketMQ's broker does: a connection dropped while the
        # pull is parked must not lose the consumer's progress.
        await ctx.keep_offset(puller.group, topic, queue_id, commit_offset)
    suspend_s = max(0, min(suspend_ms, ctx.store.config.long_poll_max_ms)) / 1000
    deadline = time.monotonic() + suspend_s
    args = (puller, topic, queue_id, offset, max_nums, selector)
    answer = await read_pull(ctx, *args)
    check = True
    # Long polling: parked on the event loop (not a thread) until this queue grows or time is up.
    while answer.status is PullStatus.NO_NEW_MSG and await ctx.hold.wait(
        topic, queue_id, answer.max_offset, deadline - time.monotonic(), check=check
    ):
        seen = answer.max_offset
        answer = await read_pull(ctx, *args)
        check = answer.max_offset != seen
    return answer_response(cmd, answer)


HANDLERS: dict[int, Handler] = {RequestCode.PULL_MESSAGE: pull_message}
