"""Transactions over the wire: END_TRANSACTION from a producer, and CHECK_TRANSACTION_STATE sent to
a connected producer of the group for each check request the engine's check job records (the job
decides when to ask and when to give up; the client's listener answers)."""

from __future__ import annotations

import asyncio
import logging

from engine.model import MessageExt
from engine.protocol.transactions import HalfMessage, LocalTransactionState
from engine.remoting.codes import RPC_ONEWAY, MessageSysFlag, RequestCode, ResponseCode
from engine.remoting.context import BrokerContext, Connection, Handler
from engine.remoting.frames import RemotingCommand
from engine.remoting.headers import Header
from engine.remoting.message_layout import encode_stored, offset_msg_id
from engine.remoting.wire_messages import to_wire
from engine.store.transactions import CheckBack, load_half

_log = logging.getLogger(__name__)
_STATES = {
    int(MessageSysFlag.TRANSACTION_COMMIT): LocalTransactionState.COMMIT,
    int(MessageSysFlag.TRANSACTION_ROLLBACK): LocalTransactionState.ROLLBACK,
}


def check_request(ctx: BrokerContext, half: HalfMessage) -> RemotingCommand:
    """A CHECK_TRANSACTION_STATE request for one half message (one-way, as RocketMQ's broker sends it)."""
    extra = {"PGROUP": half.producer_group, "TRAN_MSG": "true"}
    wire = to_wire(
        MessageExt.from_row(half.view_row()),
        (ctx.host, ctx.port),
        extra=extra,
        sys_flag=int(MessageSysFlag.TRANSACTION_PREPARED),
    )
    fields = {
        "tranStateTableOffset": "0",
        "commitLogOffset": str(half.physical_offset),
        "msgId": half.uniq_key,
        "transactionId": half.uniq_key,
        "offsetMsgId": offset_msg_id(ctx.host, ctx.port, half.physical_offset),
    }
    return RemotingCommand(
        RequestCode.CHECK_TRANSACTION_STATE, flag=RPC_ONEWAY, ext_fields=fields, body=encode_stored(wire)
    )


async def check_back_loop(ctx: BrokerContext, checks: CheckBack, interval_s: float = 1.0) -> None:
    """Forward the engine's check requests to connected producers until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        groups = {g for c in ctx.connections for g in c.producer_groups}
        try:
            pending = await ctx.run(checks.pending, ctx.store, groups)
        except Exception as exc:
            _log.warning("transaction check-back scan failed: %s", exc)
            continue
        for group, half, _ in pending:
            producers = ctx.producers_of(group)
            if producers:
                try:
                    await producers[0].send(check_request(ctx, half))
                except (ConnectionError, OSError) as exc:
                    _log.debug("check-back to %s failed: %s", producers[0].peer, exc)


def _end_sync(ctx: BrokerContext, offset: int, state: LocalTransactionState, check_times: int) -> bool:
    half = load_half(ctx.store, offset)
    if half is None:
        return False
    ctx.producer.end_wire_transaction(half, state, check_times=check_times)
    return True


async def end_transaction(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """END_TRANSACTION: commit (re-put into the real queue) or roll back; UNKNOWN leaves it to the check."""
    header = Header(cmd.ext_fields)
    offset = header.int64("commitLogOffset")
    kind = header.int32("commitOrRollback")
    state = _STATES.get(kind)
    if state is None:
        return cmd.response(ResponseCode.SUCCESS)
    checks: CheckBack | None = getattr(ctx, "check_back", None)
    times = checks.sent.get(offset, 0) if checks is not None and header.flag("fromTransactionCheck") else 0
    if not await ctx.run(_end_sync, ctx, offset, state, times):
        return cmd.response(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
    return cmd.response(ResponseCode.SUCCESS)


HANDLERS: dict[int, Handler] = {RequestCode.END_TRANSACTION: end_transaction}
