"""The push consumer (RocketMQ's ``DefaultMQPushConsumer``): messages pushed to a listener, with
rebalance, offsets, retries and orderly consumption.

- :mod:`.consumer`: :class:`PushConsumer`, its lifecycle, rebalance and offset commits;
- :mod:`.listener`: what a listener is given and returns (:class:`ConsumeResult`, the contexts), and
  when it gets a context;
- :mod:`.process_queue`: :class:`~.process_queue.ProcessQueue`, one assigned queue's cache of pulled
  messages and the offset a commit may record;
- :mod:`.pull_service`: the thread per queue pulling into its cache, with flow control;
- :mod:`.consume_service` and :mod:`.consume_pool`: listener calls on a pool of consume threads,
  concurrently or orderly, and ``consume_timeout``;
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
from engine.client.push.process_queue import ProcessQueueInfo

__all__ = [
    "ConsumeConcurrentlyContext",
    "ConsumeOrderlyContext",
    "ConsumeResult",
    "Listener",
    "MessageListener",
    "ProcessQueueInfo",
    "PushConsumer",
]
