"""The push consumer's pulling side: one thread per assigned queue long-polls it and caches what it
finds in the queue's :class:`~engine.client.push.process_queue.ProcessQueue`, handing each batch to
the consume service (RocketMQ's ``PullMessageService`` and ``DefaultMQPushConsumerImpl.pullMessage``).

Pulling never waits for a listener. It pauses, RocketMQ's flow control, while the queue's cache
holds more than ``pull_threshold_for_queue`` messages or ``pull_threshold_size_for_queue`` MiB of
bodies, or (concurrently) spans more than ``consume_concurrently_max_span`` offsets, and resumes as
soon as consumed messages leave it (RocketMQ looks again after 50 ms; here a message leaving wakes
it, with the same 50 ms as a fallback).
"""

from __future__ import annotations

import logging

from engine.client.push.consume_service import ConsumeService, ConsumeSetup, log_failure
from engine.client.push.process_queue import ProcessQueue
from engine.model import PullStatus
from engine.protocol.selectors import MessageSelector

_log = logging.getLogger(__name__)

# RocketMQ's PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL.
FLOW_CONTROL_PAUSE_S = 0.05


def pull_loop(pq: ProcessQueue, setup: ConsumeSetup, consume: ConsumeService) -> None:
    """The pull thread of one queue: runs until the queue is dropped or the consumer stops."""
    mq = pq.mq
    max_span = None if setup.orderly else setup.consume_concurrently_max_span
    while not pq.dropped and not setup.stop.is_set():
        if setup.uses_locks and not setup.membership.is_locked(mq):
            pq.pause(setup.relock_wait_s)  # the rebalance thread relocks it
            continue
        if not pq.has_room(setup.pull_threshold_for_queue, setup.pull_threshold_bytes_for_queue, max_span):
            pq.pause(FLOW_CONTROL_PAUSE_S)
            continue
        offset = pq.next_pull
        try:
            result = setup.puller.pull(
                mq.topic,
                mq.queue_id,
                offset,
                max_nums=setup.pull_batch_size,
                expression=pq.expression,
                suspend_ms=setup.pull_suspend_ms,
            )
        except Exception as exc:  # logged; background work goes on
            log_failure(setup.consumer_id, f"pull of {mq} failed", exc)
            pq.pause(setup.suspend_s)
            continue
        if pq.dropped:
            break
        # The offset moves only past entries the pull has shown to us. A pull's queue bounds can
        # run one dispatch commit ahead of the entries it read (QueueIndex takes them from table
        # history, which on a stale snapshot already holds newer commits), so "the rest of the
        # window was filtered out" is trusted only when a second pull agrees.
        if result.status is PullStatus.FOUND:
            pq.put(result.messages)
            pq.no_match = None
            consume.submit(pq, result.messages)
        elif result.status is PullStatus.OFFSET_ILLEGAL:
            _log.warning(
                "push consumer %s: offset %d of %s is illegal; corrected to %d",
                setup.consumer_id,
                offset,
                mq,
                result.next_begin_offset,
            )
            pq.skip_to(result.next_begin_offset)
        elif result.status is PullStatus.NO_MATCHED_MSG:
            seen = (offset, result.next_begin_offset)
            if pq.no_match == seen and not MessageSelector.of(pq.expression).matches_all:
                pq.skip_to(result.next_begin_offset)
                pq.no_match = None
            else:
                pq.no_match = seen  # "*" matches every entry: this can only be a stale view
        # NO_NEW_MSG: next_begin_offset is the offset pulled; nothing to move.
