"""Per-message ack (RocketMQ 5 ``SimpleConsumer`` / POP) on QMQ's pull and action logs.

- :mod:`.consumer`: :class:`SimpleConsumer`, the public face (subscriptions, receive, ack, nack,
  change of invisible time, the background flusher, offsets persisted for retention and tools);
- :mod:`.leases`: :class:`~engine.client.simple.leases.Leases`, all of one consumer's lease state
  and the lease protocol over ``action_log`` (its pure rules: :mod:`engine.protocol.lease_book`),
  with the scan and the hand-out of the buffer; its parts: :mod:`.lease_state` (the state, its reads
  and commits of the log), :mod:`.leasing` (fresh leases, redeliveries and FIFO ranges, under
  contention), :mod:`.holding` (what the user holds: checks, decisions, acks, recovery);
- :mod:`.deliveries`: where receives read from, and the records of a delivery
  (:class:`ReceivedMessage`, the buffer's and the holder's records).
"""

from __future__ import annotations

from engine.client.simple.consumer import (
    MAX_INVISIBLE_MS,
    MAX_RECEIVE_NUMS,
    OFFSET_PERSIST_MS,
    SimpleConsumer,
)
from engine.client.simple.deliveries import ReceivedMessage

__all__ = ["MAX_INVISIBLE_MS", "MAX_RECEIVE_NUMS", "OFFSET_PERSIST_MS", "ReceivedMessage", "SimpleConsumer"]
