"""PULL_MESSAGE: the engine's pull primitive (with its long polling) over the wire.

Statuses map as RocketMQ's broker answers them: FOUND -> SUCCESS (the messages in the stored
layout), NO_NEW_MSG -> PULL_NOT_FOUND, NO_MATCHED_MSG -> PULL_RETRY_IMMEDIATELY, OFFSET_ILLEGAL ->
PULL_OFFSET_MOVED; the offset corrections travel in nextBeginOffset / minOffset / maxOffset.
"""

from __future__ import annotations

import time

from engine.errors import InvalidSelectorError
from engine.model import PullResult, PullStatus
from engine.protocol.pull import MAX_PULL_NUMS
from engine.protocol.selectors import MessageSelector
from engine.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from engine.remoting.context import BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header
from engine.remoting.message_layout import encode_stored
from engine.remoting.wire_messages import to_wire

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


def pull_response(ctx: BrokerContext, cmd: RemotingCommand, result: PullResult) -> RemotingCommand:
    """The response to a pull: its status code, offsets and, when FOUND, the messages."""
    body = b""
    if result.status is PullStatus.FOUND:
        host = (ctx.host, ctx.port)
        body = b"".join(encode_stored(to_wire(m, host)) for m in result.messages)
    fields = {
        "suggestWhichBrokerId": 0,
        "nextBeginOffset": result.next_begin_offset,
        "minOffset": result.min_offset,
        "maxOffset": result.max_offset,
    }
    return cmd.response(PULL_CODES[result.status], ext_fields=fields, body=body)


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
    if PullSysFlag.COMMIT_OFFSET in flags and commit_offset >= 0:
        # Kept before the long poll, as RocketMQ's broker does: a connection dropped while the
        # pull is parked must not lose the consumer's progress.
        await ctx.run(ctx.report_offset, puller.group, topic, queue_id, commit_offset)
    suspend_s = max(0, min(suspend_ms, ctx.store.config.long_poll_max_ms)) / 1000
    deadline = time.monotonic() + suspend_s
    args = (topic, queue_id, offset, max_nums, selector, 0)
    result = await ctx.run(puller.pull, *args, pull=True)
    check = True
    # Long polling: parked on the event loop (not a thread) until this queue grows or time is up.
    while result.status is PullStatus.NO_NEW_MSG and await ctx.hold.wait(
        topic, queue_id, result.max_offset, deadline - time.monotonic(), check=check
    ):
        seen = result.max_offset
        result = await ctx.run(puller.pull, *args, pull=True)
        check = result.max_offset != seen
    return pull_response(ctx, cmd, result)


HANDLERS: dict[int, Handler] = {RequestCode.PULL_MESSAGE: pull_message}
