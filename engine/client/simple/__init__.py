"""Per-message ack (RocketMQ 5 ``SimpleConsumer`` / POP) on QMQ's pull and action logs.

- :mod:`.consumer`: :class:`SimpleConsumer`, the public face (subscriptions, receive, ack, nack,
  change of invisible time, the background flusher, offsets persisted for retention and tools);
- :mod:`.leases`: :class:`~engine.client.simple.leases.Leases`, all of one consumer's lease state
  and the lease protocol over ``action_log`` (its pure rules: :mod:`engine.protocol.lease_book`).
"""

from __future__ import annotations

from engine.client.simple.consumer import (
    MAX_INVISIBLE_MS,
    MAX_RECEIVE_NUMS,
    OFFSET_PERSIST_MS,
    SimpleConsumer,
)
from engine.client.simple.leases import ReceivedMessage

__all__ = ["MAX_INVISIBLE_MS", "MAX_RECEIVE_NUMS", "OFFSET_PERSIST_MS", "ReceivedMessage", "SimpleConsumer"]
