"""The engine's producer, fed by wire requests: a client's unique id and queue choice are kept."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from engine.client.producer import Producer
from engine.client.sending import as_sent, has_timer, send_results
from engine.errors import InvalidMessageError
from engine.model import SendResult
from engine.protocol.messages import batch_bytes
from engine.protocol.transactions import HalfMessage, LocalTransactionState
from engine.remoting.wire_messages import IncomingMessage
from engine.store.commit_log import PendingMessage
from engine.store.transactions import Decision, end_transaction, half_message, half_writer, stored_half

REASON_WIRE = "wire"  # a decision a wire producer sent (END_TRANSACTION)


class WireProducer(Producer):
    """A :class:`Producer` whose messages come from RocketMQ clients.

    Validation, queue checks, delays, timers and the commit path are the producer's own; what
    differs is that a message keeps the unique id its client gave it (``UNIQ_KEY``, what the
    client's ``SendResult.getMsgId()`` returns) and lands in the queue the client chose.
    """

    def _wire_pending(self, item: IncomingMessage, queue_id: int, delay_level: int = 0) -> PendingMessage:
        pending = self._prepare(item.message, queue_id, None, delay_level)
        return pending._replace(uniq_key=item.uniq_key) if item.uniq_key else pending

    def send_wire_grouped(self, item: IncomingMessage, queue_id: int) -> Future[SendResult]:
        """Queue one client message for a group commit; the future resolves once its commit lands.

        RocketMQ's broker acknowledges a synchronous send after the group commit that holds it;
        here the producer's async worker commits whatever sends are waiting in one Delta commit,
        so concurrent clients (and a client's threads) share commits instead of queueing for one
        each. Checks run here, before anything is queued.

        Raises:
            InvalidMessageError, TopicNotFoundError, InvalidArgumentError: bad input; nothing is queued.
        """
        self._check_open()
        return self._enqueue(self._wire_pending(item, queue_id, item.delay_level))

    def append_prepared(self, pending: PendingMessage) -> SendResult:
        """Commit a message the endpoint built itself (a retry send's copy) through the producer's writer."""
        self._check_open()
        return as_sent(send_results(self._writer.append_batch([pending]))[0], pending)

    def send_half(self, item: IncomingMessage, queue_id: int, group: str) -> HalfMessage:
        """Store a client's transactional message as a half message of producer group ``group``.

        Raises:
            InvalidMessageError: a delayed or timer message (transactions are not delayed).
        """
        self._check_open()
        if item.delay_level or item.message.deliver_at_ms is not None or has_timer(item.message.properties):
            raise InvalidMessageError(
                "transactional messages cannot be delayed or timed", topic=item.message.topic
            )
        half = half_message(self._wire_pending(item, queue_id), group)
        [stamped] = half_writer(self._store, self._writer).append([half])
        return stored_half(half, stamped)

    def end_wire_transaction(
        self, half: HalfMessage, state: LocalTransactionState, *, check_times: int = 0
    ) -> Decision:
        """Decide a half message as its producer said (commit re-puts it, rollback records it)."""
        return end_transaction(
            self._store,
            self._queue_writer(half.topic, half.queue_id),
            half,
            state,
            reason=REASON_WIRE,
            check_times=check_times,
        )

    def send_wire_batch(self, items: Sequence[IncomingMessage], queue_id: int) -> list[SendResult]:
        """Send a client's batch to one queue in one commit, as :meth:`Producer.send_batch` does.

        Raises:
            InvalidMessageError: a delayed or timer message, or more than ``max_batch_bytes``; nothing
                is written.
        """
        self._check_open()
        if not items:
            return []
        if any(
            i.delay_level or i.message.deliver_at_ms is not None or has_timer(i.message.properties)
            for i in items
        ):
            raise InvalidMessageError(
                "a batch cannot hold delayed or timer messages", topic=items[0].message.topic
            )
        total = sum(
            batch_bytes(i.message.body, i.message.tags, i.message.properties, i.message.keys) for i in items
        )
        limit = self._store.config.max_batch_bytes
        if total > limit:
            raise InvalidMessageError(
                f"batch takes {total} bytes (bodies and properties, tags and keys included); "
                f"at most {limit} are allowed"
            )
        pending = [self._wire_pending(i, queue_id) for i in items]
        return send_results(self._writer.append_batch(pending))
