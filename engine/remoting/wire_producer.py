"""The engine's producer, fed by wire requests: a client's unique id and queue choice are kept."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Generic, NamedTuple, TypeVar

from engine.client.producer import Producer
from engine.client.sending import PreparedSend, has_timer
from engine.closing import Closing
from engine.errors import InvalidMessageError, MQError
from engine.model import SendResult
from engine.protocol.messages import batch_bytes, check_body_size
from engine.protocol.names import PROPERTY_UNIQ_KEY
from engine.protocol.transactions import HalfMessage, LocalTransactionState
from engine.remoting.message_layout import BatchRecord, decode_properties, split_property
from engine.remoting.wire_messages import IncomingMessage, incoming
from engine.store.commit_log import LOCK_WAIT_S
from engine.store.commit_log.stamping import PendingMessage
from engine.store.store import Store
from engine.store.transactions import Decision

REASON_WIRE = "wire"  # a decision a wire producer sent (END_TRANSACTION)


def _batch_bytes(item: IncomingMessage) -> int:
    """What a message adds to a batch's size (RocketMQ's ``MessageBatch`` count)."""
    m = item.message
    return batch_bytes(m.body, m.tags, m.properties, m.keys)


T = TypeVar("T")


class Queued(NamedTuple, Generic[T]):
    """A send or batch queued for a group commit: its future and what it stores, as prepared."""

    future: Future[T]
    prepared: tuple[PreparedSend, ...]


class WireProducer(Closing):
    """Sends of RocketMQ clients, through a :class:`Producer`'s "prepare, then append" seam.

    Validation, queue checks, delays, timers and the commit path are the producer's own; what
    differs is that a message keeps the unique id its client gave it (``UNIQ_KEY``, what the
    client's ``SendResult.getMsgId()`` returns) and lands in the queue the client chose.

    Args:
        store: an open store.
        group, linger_ms, batch_size, regroup_ms: as :class:`Producer` (they pace group commits).
        lock_wait_s: as :class:`Producer`: how long a commit queues for the host lock.
    """

    def __init__(
        self,
        store: Store,
        group: str = "LAKEMQ_WIRE",
        *,
        linger_ms: int | None = None,
        batch_size: int | None = None,
        regroup_ms: int = 0,
        lock_wait_s: float = LOCK_WAIT_S,
    ) -> None:
        self._producer = Producer(
            store,
            group,
            linger_ms=linger_ms,
            batch_size=batch_size,
            regroup_ms=regroup_ms,
            lock_wait_s=lock_wait_s,
        )
        self._max_batch_bytes = store.config.max_batch_bytes

    @property
    def lock_wait_s(self) -> float:
        """How long a commit queues for the host lock (:class:`Producer`'s ``lock_wait_s``)."""
        return self._producer.lock_wait_s

    def _prepare(self, item: IncomingMessage, queue_id: int, delay_level: int = 0) -> PreparedSend:
        return self._producer.prepare(
            item.message,
            queue_id,
            delay_level=delay_level,
            uniq_key=item.uniq_key or None,
            born_ts_ms=item.born_ts_ms,
            broker_properties=item.broker_properties,
        )

    def send_wire_grouped(self, item: IncomingMessage, queue_id: int) -> Queued[SendResult]:
        """Queue one client message for a group commit: the future resolves once its commit lands.

        RocketMQ's broker acknowledges a synchronous send after the group commit that holds it;
        here the producer's async worker commits whatever sends are waiting in one Delta commit,
        so concurrent clients (and a client's threads) share commits instead of queueing for one
        each. Checks run here, before anything is queued. Also returns the send as prepared (what
        the commit stores).

        Raises:
            InvalidMessageError, TopicNotFoundError, InvalidArgumentError: bad input; nothing is queued.
            ProducerClosedError: the producer is closed.
        """
        prepared = self.prepare_wire(item, queue_id)
        return Queued(self._producer.append_async(prepared), (prepared,))

    def prepare_wire(self, item: IncomingMessage, queue_id: int) -> PreparedSend:
        """A client message checked and prepared for a commit (delay level and timers honoured), as
        :meth:`send_wire_grouped` queues it; for :meth:`commit_groups`.

        Raises:
            InvalidMessageError, TopicNotFoundError, InvalidArgumentError: bad input.
        """
        return self._prepare(item, queue_id, item.delay_level)

    def commit_groups(self, groups: Sequence[Sequence[PreparedSend]]) -> list[list[SendResult] | MQError]:
        """Commit prepared sends and batches now, on the calling thread, as the producer's group
        commit does (:meth:`Producer.commit_groups`): for each group its results, or its error."""
        return self._producer.commit_groups(groups)

    def append_prepared(self, prepared: PreparedSend) -> SendResult:
        """Commit a send the endpoint built itself (a retry send's copy), as :meth:`Producer.append`."""
        return self._producer.append(prepared)

    def send_half(self, item: IncomingMessage, queue_id: int, group: str) -> HalfMessage:
        """Store a client's transactional message as a half message of producer group ``group``.

        Raises:
            InvalidMessageError: a delayed or timer message (transactions are not delayed).
        """
        if item.delay_level or item.message.deliver_at_ms is not None or has_timer(item.message.properties):
            raise InvalidMessageError(
                "transactional messages cannot be delayed or timed", topic=item.message.topic
            )
        return self._producer.append_half(self._prepare(item, queue_id), group)

    def end_wire_transaction(
        self, half: HalfMessage, state: LocalTransactionState, *, check_times: int = 0
    ) -> Decision:
        """Decide a half message as its producer said (commit re-puts it, rollback records it)."""
        return self._producer.end_transaction(half, state, reason=REASON_WIRE, check_times=check_times)

    def prepare_client_batch(
        self,
        topic: str,
        queue_id: int,
        items: Sequence[BatchRecord],
        *,
        born_host: tuple[str, int] | None = None,
        born_ts_ms: int = 0,
    ) -> tuple[PreparedSend, ...]:
        """A client's SEND_BATCH_MESSAGE, as its messages came (records, properties still encoded),
        checked and prepared for one commit, whole: what :meth:`prepare_wire_batch` makes of them
        after :func:`~engine.remoting.wire_messages.incoming` split each one.

        The messages of a batch mostly differ only in their bodies and ``UNIQ_KEY``s (the Java
        client's batches share tags, keys and properties), so each distinct rest (the properties
        but ``UNIQ_KEY``, and the flag) is split and checked once, by those two, and the messages
        that share it take a copy with their own body and unique id: the per-message work of
        splitting, checking and preparing was most of a batch's time in the door.

        Raises:
            InvalidMessageError, TopicNotFoundError, InvalidArgumentError: as
                :meth:`prepare_wire_batch`.
        """
        if not items:
            raise InvalidMessageError("a batch holds at least one message", topic=topic)
        shapes: dict[tuple[int, str], int] = {}
        firsts: list[IncomingMessage] = []
        plan: list[tuple[int, bytes, str | None]] = []  # each message: its shape, body, unique id
        for body, text, flag in items:
            check_body_size(len(body), topic)
            split = split_property(text, PROPERTY_UNIQ_KEY)
            if split is None:  # UNIQ_KEY more than once: the decoded one (the last), a shape alone
                uniq, rest = decode_properties(text).get(PROPERTY_UNIQ_KEY), text
            else:
                uniq, rest = split
            index = shapes.get((flag, rest))
            if index is None:
                index = shapes[(flag, rest)] = len(firsts)
                props = decode_properties(text)
                firsts.append(
                    incoming(topic, body, props, born_host=born_host, flag=flag, born_ts_ms=born_ts_ms)
                )
            plan.append((index, body, uniq or None))
        checked = self.prepare_wire_batch(firsts, queue_id)
        if len(plan) == len(firsts):
            return checked
        # each shape's row around the body and unique id (a PendingMessage is topic, queue_id, body,
        # uniq_key, then the rest), and what it adds to the batch's size besides the body
        # (RocketMQ's MessageBatch count)
        rows = [(p.pending[:2], p.pending[4:]) for p in checked]
        extra = [_batch_bytes(i) - len(i.message.body) for i in firsts]
        new_key = self._producer.new_uniq_key
        make = PendingMessage._make
        out = tuple(
            PreparedSend(make((*rows[index][0], body, uniq or new_key(), *rows[index][1])))
            for index, body, uniq in plan
        )
        self._check_batch_bytes(sum(len(body) + extra[index] for index, body, _ in plan))
        return out

    def queue_batch(self, prepared: tuple[PreparedSend, ...]) -> Queued[list[SendResult]]:
        """Queue a client's batch, checked and prepared (:meth:`prepare_client_batch`), for the next
        group commit: stored whole in one commit (one queue), as :meth:`Producer.send_batch` stores
        it, beside the other clients' sends and batches waiting then. The future resolves to the
        results in order once the commit lands.

        Raises:
            ProducerClosedError: the producer is closed.
        """
        return Queued(self._producer.append_batch_async(prepared), prepared)

    def prepare_wire_batch(self, items: Sequence[IncomingMessage], queue_id: int) -> tuple[PreparedSend, ...]:
        """A client's batch checked and prepared for one commit, whole, as :meth:`queue_batch`
        queues it; for :meth:`commit_groups`.

        Raises:
            InvalidMessageError: no message, a delayed or timer message, or more than
                ``max_batch_bytes``.
            TopicNotFoundError, InvalidArgumentError: bad input.
        """
        if not items:
            raise InvalidMessageError("a batch holds at least one message")
        if any(i.delay_level for i in items):
            raise InvalidMessageError(
                "a batch cannot hold delayed or timer messages", topic=items[0].message.topic
            )
        prepared = self._producer.prepare_batch(  # refuses timers and bad messages
            [i.message for i in items],
            queue_id,
            uniq_keys=[i.uniq_key for i in items],
            born_ts_ms=items[0].born_ts_ms,
            broker_properties=[i.broker_properties for i in items],
        )
        self._check_batch_bytes(sum(_batch_bytes(i) for i in items))
        return tuple(prepared)

    def _check_batch_bytes(self, total: int) -> None:
        """Refuse a batch of ``total`` bytes (bodies and properties) over ``max_batch_bytes``."""
        limit = self._max_batch_bytes
        if total > limit:
            raise InvalidMessageError(
                f"batch takes {total} bytes (bodies and properties, tags and keys included); "
                f"at most {limit} are allowed"
            )

    def close(self) -> None:
        """Flush queued sends and stop, as :meth:`Producer.close`."""
        self._producer.close()
