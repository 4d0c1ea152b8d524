"""A client's send to ``%RETRY%<group>``: how a Java consumer sends a message back when
CONSUMER_SEND_MSG_BACK fails, and how an orderly consumer dead-letters a message past its maximum.

RocketMQ's broker handles such a send itself (``handleRetryAndDLQ``): at or past the maximum
reconsume times the message goes to ``%DLQ%<group>``, otherwise it waits its delay level in the
schedule topic and then lands in the retry topic. The copies are made with the retry job's own
re-put and schedule envelope, so a retried message looks the same whichever way it came back.
"""

from __future__ import annotations

from engine.client.sending import PreparedSend
from engine.model import SendResult
from engine.protocol.delays import clamp_delay_level, retry_delay_level
from engine.protocol.names import RETRY_PREFIX, dlq_topic, retry_topic, validate_group_name
from engine.protocol.rebalance import MessageQueue
from engine.protocol.schedule import schedule_envelope
from engine.protocol.topics import system_topic_config
from engine.remoting.wire_messages import IncomingMessage
from engine.remoting.wire_producer import WireProducer
from engine.store.commit_log import reput
from engine.store.store import Store, now_ms


def is_retry_send(topic: str) -> bool:
    """True for a send to a retry topic (``%RETRY%<group>``)."""
    return topic.startswith(RETRY_PREFIX)


def retry_copy(
    item: IncomingMessage,
    group: str,
    reconsume_times: int,
    max_reconsume_times: int,
    born_ts_ms: int,
    now: int,
) -> PreparedSend:
    """Where a client's retry send goes: the DLQ at or past the maximum, else the schedule topic
    (its DELAY, or 3 + reconsume times) bound for the retry topic's queue 0, its destination; pure."""
    m = item.message
    props = dict(m.properties) | dict(item.extra)  # RETRY_TOPIC, ORIGIN_MESSAGE_ID, ... kept
    props.pop("DELAY", None)
    row = {
        "body": m.body,
        "uniq_key": item.uniq_key or "",
        "tags": m.tags,
        "keys": tuple(m.keys),
        "born_ts_ms": born_ts_ms,
    }
    if reconsume_times >= max_reconsume_times or item.delay_level < 0:
        return PreparedSend(
            reput(row, topic=dlq_topic(group), queue_id=0, properties=props, reconsume_times=reconsume_times)
        )
    level = (
        clamp_delay_level(item.delay_level) if item.delay_level > 0 else retry_delay_level(reconsume_times)
    )
    destination = MessageQueue(retry_topic(group), 0)
    envelope = schedule_envelope(
        destination.topic, destination.queue_id, props, sent_ms=now, delay_level=level
    )
    return PreparedSend(reput(row, **envelope._asdict(), reconsume_times=reconsume_times), destination)


def send_retry(
    store: Store,
    producer: WireProducer,
    topic: str,
    item: IncomingMessage,
    reconsume_times: int,
    max_reconsume_times: int,
    born_ts_ms: int,
) -> SendResult:
    """Store a client's retry send (see :func:`retry_copy`), creating the system topics it needs.

    Raises:
        InvalidArgumentError: a bad group name in the topic.
    """
    group = validate_group_name(topic[len(RETRY_PREFIX) :])
    limit = store.config.max_reconsume_times if max_reconsume_times < 0 else max_reconsume_times
    copy = retry_copy(item, group, reconsume_times, limit, born_ts_ms, now_ms())
    needed = {copy.pending.topic} | ({copy.destination.topic} if copy.destination is not None else set())
    known = store.topic_configs(refresh=True)
    for name in sorted(needed - set(known)):
        store.put_topic(system_topic_config(name, now_ms()))
    return producer.append_prepared(copy)
