"""The push consumer (RocketMQ's ``DefaultMQPushConsumer``): messages pushed to a listener, with
rebalance, offsets, retries and orderly consumption.

- :mod:`.consumer`: :class:`PushConsumer`, its lifecycle, rebalance and offset commits;
- :mod:`.listener`: what a listener is given and returns (:class:`ConsumeResult`, the contexts);
- :mod:`.queue_workers`: :class:`~.queue_workers.ProcessQueue`, one assigned queue and the thread
  consuming it;
- :mod:`.resets`: offset resets an admin makes while the consumer runs;
- :mod:`.settings`: the consumer's settings, checked once.

The rest of the engine uses the names below.
"""

from __future__ import annotations

from engine.client.push.consumer import PushConsumer
from engine.client.push.listener import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeResult,
    Listener,
    MessageListener,
)

__all__ = [
    "ConsumeConcurrentlyContext",
    "ConsumeOrderlyContext",
    "ConsumeResult",
    "Listener",
    "MessageListener",
    "PushConsumer",
]
