"""Transactions through RocketMQ 5's gRPC door, with the engine's calls the remoting door makes.

* ``SendMessage`` of a ``TRANSACTION`` message stores a half message
  (:meth:`~engine.client.producer.Producer.append_half`) of producer group = its topic (the proxy's
  producer group for 5.x clients), and answers a :class:`~engine.protocol.rocketmq5.TransactionId`.
* ``EndTransaction`` decides it (:meth:`~engine.client.producer.Producer.end_transaction`): COMMIT
  re-puts it into its queue, ROLLBACK records it; ``UNSPECIFIED`` leaves it to the check. A decision
  that comes after another one stands is answered OK (the first one stays), as the proxy answers.
* Check-back: the engine's check job (:func:`engine.broker.transactions.check_transactions`)
  records CHECK requests for halves left undecided; the door sends each, once per check number, as a
  ``RecoverOrphanedTransactionCommand`` on the Telemetry stream of a producer of the group, whose
  checker answers with ``EndTransaction`` (source ``SOURCE_SERVER_CHECK``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from engine.grpc.messages import IncomingMessage, to_proto
from engine.grpc.v2 import definition_pb2 as pb
from engine.grpc.v2 import service_pb2 as spb
from engine.model import MessageExt
from engine.protocol.rocketmq5 import TransactionId, edge_error
from engine.protocol.transactions import REASON_CHECK, HalfMessage, LocalTransactionState
from engine.store.transactions import CheckBack, load_half

if TYPE_CHECKING:
    from engine.grpc.server import GrpcServer

_log = logging.getLogger(__name__)
REASON_GRPC = "grpc"  # a decision a 5.x producer sent (EndTransaction from its own transaction)
CHECK_BACK_INTERVAL_S = 1.0
_STATES = {pb.COMMIT: LocalTransactionState.COMMIT, pb.ROLLBACK: LocalTransactionState.ROLLBACK}


def transaction_id(half: HalfMessage) -> str:
    """The id a client gets for its half message, and gives back to decide it."""
    return TransactionId(half.physical_offset, half.uniq_key).encode()


def recover_command(half: HalfMessage) -> spb.TelemetryCommand:
    """The ``RecoverOrphanedTransactionCommand`` that asks a producer's checker about ``half``: the
    message as it was sent (real topic, id, body, properties) and its transaction id."""
    message = to_proto(MessageExt.from_row(half.view_row()), "", 1, 0)
    message.system_properties.message_type = pb.TRANSACTION
    message.system_properties.ClearField("invisible_duration")
    command = spb.TelemetryCommand()
    command.recover_orphaned_transaction_command.message.CopyFrom(message)
    command.recover_orphaned_transaction_command.transaction_id = transaction_id(half)
    return command


class Transactions:
    """The gRPC door's transactions: halves, decisions and the check-back to producers' streams."""

    def __init__(self, door: GrpcServer) -> None:
        self.door = door
        self.checks = CheckBack()

    def send_half(self, incoming: IncomingMessage, queue_id: int | None = None) -> HalfMessage:
        """Store a client's transactional message as a half message of its topic's producer group
        (for ``queue_id``, the queue the client chose; None: the door chooses).

        Raises:
            InvalidMessageError: a delayed or timer message (transactions are not delayed).
            TopicNotFoundError, InvalidTopicError, InvalidArgumentError: bad input; nothing written.
        """
        return self.door.producer.append_half(self.door.prepare(incoming, queue_id), incoming.message.topic)

    def end(self, request: spb.EndTransactionRequest) -> None:
        """Decide the half a client's ``EndTransaction`` names (nothing for ``UNSPECIFIED``).

        Raises:
            InvalidArgumentError: an id this door did not give out, or not of this topic and
                message (``INVALID_TRANSACTION_ID``).
        """
        if not request.transaction_id:
            raise edge_error("INVALID_TRANSACTION_ID", "transaction id cannot be empty")
        parsed = TransactionId.decode(request.transaction_id)
        if request.message_id and request.message_id != parsed.message_id:
            raise edge_error(
                "INVALID_TRANSACTION_ID",
                f"transaction id is of message {parsed.message_id}, not {request.message_id}",
            )
        half = load_half(self.door.store, parsed.half_offset)
        if half is None or half.uniq_key != parsed.message_id or half.topic != request.topic.name:
            raise edge_error(
                "INVALID_TRANSACTION_ID",
                f"no transactional message {parsed.message_id} of topic {request.topic.name!r} here",
            )
        state = _STATES.get(request.resolution)
        if state is None:  # UNKNOWN: the check asks again later
            return
        checked = request.source == pb.SOURCE_SERVER_CHECK
        self.door.producer.end_transaction(
            half,
            state,
            reason=REASON_CHECK if checked else REASON_GRPC,
            check_times=self.checks.sent.get(half.physical_offset, 0) if checked else 0,
        )

    async def check_back_loop(self, interval_s: float = CHECK_BACK_INTERVAL_S) -> None:
        """Forward the engine's check requests to producers' streams until cancelled."""
        streams = self.door.streams
        while True:
            await asyncio.sleep(interval_s)
            groups = streams.producer_groups()
            if not groups:
                continue
            try:
                pending = await self.door.call(self.checks.pending, self.door.store, groups)
            except Exception as exc:
                _log.warning("gRPC door: transaction check-back scan failed: %s", exc)
                continue
            for group, half, _ in pending:
                producers = streams.producers_of(group)
                if producers:
                    producers[0].send(recover_command(half))
