"""What a simple consumer's user holds: received messages checked, decided and acked.

:class:`Holding` checks a received message against what this consumer holds (its receipt handle and
deadline), acks it (buffered, or committed at once shortly before its deadline), commits the
holder's other decisions (``NACK``, ``CHANGE_INVISIBLE``) under the queue's lease lock, appends the
buffered acks and releases when they are due, and takes back what this consumer id holds as of the
log: at start, or a handle another process with the same id gave out (adopt). The protocol:
:mod:`engine.client.simple.leases`.
"""

from __future__ import annotations

import time

from engine.client.simple.deliveries import MATCH_ALL, Held, Key, Leased, ReceivedMessage, received_message
from engine.client.simple.lease_state import LeaseState
from engine.errors import (
    CommitConflictError,
    InvalidArgumentError,
    InvalidReceiptHandleError,
    ReceiptHandleExpiredError,
)
from engine.model import MessageExt
from engine.protocol.actions import ACK, OFFLINE
from engine.store import schemas
from engine.store.delta import backoff
from engine.store.store import now_ms

ACK_FLUSH_ROWS = 256  # buffered acks that are flushed at once
ACK_DEADLINE_MARGIN_MS = 1000  # acks whose lease ends sooner than this (plus the linger) go at once


class Holding(LeaseState):
    """What :class:`~engine.client.simple.leases.Leases`' user holds (module docstring)."""

    # ----------------------------------------------------------------- recovery
    def start(self) -> None:
        """Read the lease state once and take back the messages this consumer id still holds."""
        if self._version >= 0:
            return
        self._sync()
        now = now_ms()
        recovered: list[Leased] = []
        for (topic, queue_id), book in self._book.queues.items():
            mine = [
                (o, c)
                for o, c in book.held_by(self.consumer_id, now)
                if (topic, queue_id, o) not in self._held
            ]
            if not mine:
                continue
            self._index.refresh()
            leases = dict(mine)
            messages, _ = self._read(topic, queue_id, list(leases), MATCH_ALL)
            for offset, message in messages:
                lease = leases[offset]
                reconsume = message.reconsume_times + lease.deliveries - 1
                recovered.append(
                    Leased(message, lease.sequence, lease.deadline_ms, reconsume, self._version, True)
                )
        self._buffer.extendleft(reversed(recovered))

    # ----------------------------------------------------------------- what the user holds
    def held(self, message: object) -> tuple[Key, Held]:
        """The delivery a received message names, checked against its receipt handle and deadline.

        Raises:
            InvalidArgumentError: not a message.
            InvalidReceiptHandleError: not a message this consumer holds.
            ReceiptHandleExpiredError: its invisible time has passed (it is forgotten).
        """
        if not isinstance(message, MessageExt):
            raise InvalidArgumentError(
                f"expected a message returned by receive(), got {type(message).__name__}"
            )
        if not isinstance(message, ReceivedMessage):
            raise InvalidReceiptHandleError(
                f"a {type(message).__name__} carries no receipt handle: it is not held by consumer "
                f"{self.consumer_id} (ack, nack and change_invisible_time take messages from receive())"
            )
        key = (message.topic, message.queue_id, message.queue_offset)
        where = f"{key[0]}:{key[1]}@{key[2]}"
        held = self._held.get(key)
        if held is None or message.receipt_handle not in held.handles:
            raise InvalidReceiptHandleError(
                f"receipt handle {message.receipt_handle!r} of message {where} is not held by consumer "
                f"{self.consumer_id}: it was not received here, was already acked or nacked, or was "
                "delivered again",
                topic=key[0],
                queue_id=key[1],
                offset=key[2],
            )
        if now_ms() >= held.deadline_ms:
            del self._held[key]
            raise ReceiptHandleExpiredError(
                f"receipt handle {message.receipt_handle!r} of message {where} expired at "
                f"{held.deadline_ms}: its invisible time ended (it may be delivered again)",
                topic=key[0],
                queue_id=key[1],
                offset=key[2],
            )
        return key, held

    def adopt(self, topic: str, queue_id: int, offset: int, handle: str) -> ReceivedMessage:
        """Hold a delivery this consumer id got through another process with the same id (a client
        that reconnected elsewhere): the message at ``offset`` as of the action log, held under
        ``handle`` when that is the live lease of this id on it.

        Raises:
            InvalidReceiptHandleError: not a handle of this id, or its lease ended, was superseded
                (delivered again, or changed under a newer handle) or the message is finished.
        """
        key = (topic, queue_id, offset)
        where = f"{topic}:{queue_id}@{offset}"
        owner, _, number = handle.rpartition("#")
        if owner != self.consumer_id or not number.isdigit():
            raise InvalidReceiptHandleError(
                f"receipt handle {handle!r} is not one of consumer {self.consumer_id}",
                topic=topic,
                queue_id=queue_id,
                offset=offset,
            )
        sequence = int(number)
        self.start()
        if self._writer.buffered_acks:  # an ack of it buffered here finishes it
            self.flush()
        self._sync()
        lease = self._book.lease(key)
        now = now_ms()
        if (
            lease is None
            or lease.consumer_id != self.consumer_id
            or lease.sequence != sequence
            or now >= lease.deadline_ms
            or self._book.is_done(key)
        ):
            raise InvalidReceiptHandleError(
                f"receipt handle {handle!r} of message {where} is not the live lease of consumer "
                f"{self.consumer_id}: its invisible time ended, it was delivered again or changed, "
                "or the message was acked",
                topic=topic,
                queue_id=queue_id,
                offset=offset,
            )
        self._index.refresh()
        messages, _ = self._read(topic, queue_id, [offset], MATCH_ALL)
        if not messages:
            raise InvalidReceiptHandleError(f"message {where} is gone", topic=topic, queue_id=queue_id)
        message = messages[0][1]
        reconsume = message.reconsume_times + lease.deliveries - 1
        held = self._held.get(key)
        if held is None or held.sequence != sequence:
            held = self._held[key] = Held(
                sequence,
                lease.deadline_ms,
                reconsume,
                message.msg_id,
                message.physical_offset,
                self._version,
                set(),
            )
        held.handles.add(handle)
        return received_message(message, held.reconsume_times, handle, held.deadline_ms)

    def ack(self, message: ReceivedMessage, attempts: int) -> None:
        """Acknowledge a held message: buffered, or committed at once less than a second before its
        deadline (under the queue's lease lock, so an ack never lands after another consumer's lease
        of the same message).

        Raises:
            InvalidReceiptHandleError, ReceiptHandleExpiredError: see :meth:`held`.
            CommitConflictError: a commit at once lost ``attempts`` races.
        """
        key, held = self.held(message)
        if held.deadline_ms - now_ms() < ACK_DEADLINE_MARGIN_MS:
            self.decide(ACK, message, None, attempts)
            return
        del self._held[key]
        self._writer.buffer_ack(ACK, key[0], key[1], key[2], held.deadline_ms, now_ms())

    def forget(self, message: ReceivedMessage) -> None:
        """Stop holding a received message (a FIFO nack made it visible again)."""
        self._held.pop((message.topic, message.queue_id, message.queue_offset), None)

    def decide(
        self,
        action: str,
        message: ReceivedMessage,
        invisible_ms: int | None,
        attempts: int,
        *,
        reconsume_times: int | None = None,
    ) -> ReceivedMessage | None:
        """Commit the holder's ``action`` about a held message (``ACK``, ``NACK``, or
        ``CHANGE_INVISIBLE`` to ``invisible_ms`` from now) under the queue's lease lock.

        Returns:
            For ``CHANGE_INVISIBLE``, the message with its new receipt handle (the old one stays
            valid); else None (the message is no longer held).

        Raises:
            InvalidReceiptHandleError, ReceiptHandleExpiredError: see :meth:`held`; also when the
                lease ended meanwhile.
            CommitConflictError: lost ``attempts`` races for the action log in a row.

        ``reconsume_times`` replaces the delivery count the row records (a count past the group's
        most deliveries makes the retry job dead-letter a ``NACK`` at once).
        """
        key, held = self.held(message)
        topic, queue_id, offset = key
        writer = self._writer
        for attempt in range(attempts):
            self._sync()
            lease = self._book.lease(key)
            ts = now_ms()
            if (
                lease is None
                or lease.consumer_id != self.consumer_id
                or lease.sequence != held.sequence
                or ts >= lease.deadline_ms
                or self._book.is_done(key)
            ):
                self._held.pop(key, None)
                raise ReceiptHandleExpiredError(
                    f"message {topic}:{queue_id}@{offset} is no longer held by {self.consumer_id}: "
                    "its invisible time ended (it may have been delivered again)",
                    topic=topic,
                    queue_id=queue_id,
                    offset=offset,
                )
            deadline = ts + invisible_ms if invisible_ms is not None else None
            sequence = writer.next_sequence()
            row = writer.row(
                action,
                topic,
                queue_id,
                offset,
                physical_offset=held.physical_offset,
                msg_id=held.msg_id,
                reconsume_times=held.reconsume_times if reconsume_times is None else reconsume_times,
                deadline_ms=deadline,
                ts=ts,
                sequence=sequence,
            )
            try:
                self._commit([row], topic, queue_id, writer.frontier(topic, queue_id, refresh=False))
            except CommitConflictError:
                backoff(attempt)
                continue
            if deadline is None:
                self._held.pop(key, None)
                return None
            handle = f"{self.consumer_id}#{sequence}"
            held.sequence, held.deadline_ms = sequence, deadline
            held.handles.add(handle)
            return received_message(message, held.reconsume_times, handle, deadline)
        raise CommitConflictError(
            f"{action.lower()} lost {attempts} races for the action log in a row; retry later",
            table=schemas.ACTION_LOG,
            group=self.group,
        )

    # ----------------------------------------------------------------- acks
    @property
    def buffered_acks(self) -> int:
        """Acks and releases waiting to be appended."""
        return self._writer.buffered_acks

    @property
    def ack_batch(self) -> float | None:
        """Names the batch of buffered acks and releases (when its first was buffered; None: none
        is buffered): a new value means a new batch began since the last flush."""
        return self._writer.oldest_ack

    def ack_flush_due_in(self, linger_s: float) -> float | None:
        """Seconds until the buffered acks are due (0: now; None: nothing buffered): after
        ``linger_s``, at :data:`ACK_FLUSH_ROWS`, or a margin before the earliest lease they end."""
        oldest = self._writer.oldest_ack
        if oldest is None:
            return None
        if self._writer.buffered_acks >= ACK_FLUSH_ROWS:
            return 0.0
        wait = oldest + linger_s - time.monotonic()
        earliest = self._writer.earliest_deadline
        if earliest is not None:
            wait = min(wait, (earliest - now_ms() - ACK_DEADLINE_MARGIN_MS) / 1000 - linger_s)
        return max(0.0, wait)

    def flush(self, *, offline: bool = False) -> int:
        """Append the buffered acks and releases; returns how many messages they cover. With
        ``offline`` an ``OFFLINE`` row goes with them (QMQ's FOREVER_OFFLINE: every lease of this
        consumer id ends now). Without ``offline`` only the writer is used, which is thread-safe:
        callable without the consumer's lock.

        Raises:
            StoreError, CommitConflictError: the write failed; they stay buffered.
        """
        extra = None
        if offline:
            if self._version < 0:
                self._sync()  # this id's last sequence
            extra = [self._writer.row(OFFLINE, "", 0, 0, ts=now_ms())]
        done = self._writer.flush(extra)
        if done or extra:
            self._writes += 1
        return done


__all__ = ["Holding"]
