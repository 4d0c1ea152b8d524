"""Names: topic and group name rules, limits, the broker's system topics and property keys."""

from __future__ import annotations

import re
from functools import lru_cache

from engine.errors import InvalidArgumentError, InvalidTopicError

MAX_TOPIC_LENGTH = 127
MAX_GROUP_LENGTH = 255
MAX_QUEUES = 1024
# RocketMQ's topic characters ``[%|a-zA-Z0-9_-]`` and ``.`` (QMQ subjects and groups are dotted:
# ``order.changed``). No file path, view name or Delta partition is keyed on a topic or group.
TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_.-]+$")
TOPIC_CHARACTERS = "[%|a-zA-Z0-9_.-]"

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
# Where a half message goes once its check-backs are used up (RocketMQ keeps it there for inspection).
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
# Where RocketMQ clients with message trace on send their trace records: a system topic producers
# may send to (RocketMQ's TopicValidator does not refuse sends to it).
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SYSTEM_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        "TBW102",
        "BenchmarkTest",
        "OFFSET_MOVED_EVENT",
        TRACE_TOPIC,
        "SELF_TEST_TOPIC",
    }
)

# System property names (RocketMQ MessageConst) used by the broker.
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
# Where a door keeps what RocketMQ's stored layout holds outside the properties: the producer's
# address ("ip:port", RocketMQ's own reserved name) and the message's int flag (``Message.flag``,
# this engine's own name). Broker-owned: a client's values are dropped.
PROPERTY_BORN_HOST = "__BORNHOST"
PROPERTY_FLAG = "__FLAG"
PROPERTY_SHARDING_KEY = "SHARDING_KEY"

# Property names RocketMQ keeps for the system (MessageConst.STRING_HASH_SET): refused on user
# messages, as ``Message.putUserProperty`` refuses them, so no user property is re-routed or misread
# by the broker. KEYS is set from ``Message.keys``. The three timer requests (TIMER_DELAY_SEC,
# TIMER_DELAY_MS, TIMER_DELIVER_MS; Java's ``setDelayTimeSec`` / ``setDelayTimeMs`` /
# ``setDeliverTimeMs`` put them) are reserved too, but ``Producer.send`` / ``send_async`` take them
# as a timer request (:data:`TIMER_REQUEST_PROPERTIES`); writers without timers refuse them.
# Broker-side re-puts (retries, schedule, transactions, DLQ resends) write the others.
RESERVED_PROPERTIES = frozenset(
    {
        "TRACE_ON",
        "MSG_REGION",
        PROPERTY_KEYS,
        PROPERTY_TAGS,
        "WAIT",
        PROPERTY_DELAY,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_TRANSACTION_PREPARED,
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        PROPERTY_ORIGIN_MESSAGE_ID,
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        PROPERTY_RECONSUME_TIME,
        PROPERTY_UNIQ_KEY,
        PROPERTY_MAX_RECONSUME_TIMES,
        "CONSUME_START_TIME",
        "POP_CK",
        "POP_CK_OFFSET",
        "1ST_POP_TIME",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "DUP_INFO",
        "EXTEND_UNIQ_INFO",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "ARRIVE_TIME",
        "PUSH_REPLY_TIME",
        "CLUSTER",
        "MSG_TYPE",
        "INNER_MULTI_QUEUE_OFFSET",
        PROPERTY_TIMER_DELAY_MS,
        PROPERTY_TIMER_DELAY_SEC,
        PROPERTY_TIMER_DELIVER_MS,
        "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES",
        "TIMER_OUT_MS",
        "TIMER_DEL_UNIQKEY",
        "TIMER_DELAY_LEVEL",
        PROPERTY_BORN_HOST,
        PROPERTY_FLAG,
        "BORN_TIMESTAMP",
        "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_MESSAGE_ID",
        "__CRC32#",
        "TRAN_HALF_OFFSET",  # this engine's own: the half a transaction decision belongs to
    }
)
# The reserved names a producer's single sends accept as a timer request.
TIMER_REQUEST_PROPERTIES = frozenset(
    {PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS}
)
# Properties a resent dead letter carries over from its original (Admin.resend_dlq).
RESEND_PROPERTIES = frozenset({PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_MAX_RECONSUME_TIMES})
# RocketMQ's broker refuses a message whose properties string is longer than Short.MAX_VALUE.
MAX_PROPERTIES_BYTES = 32_767


def validate_topic_name(name: object) -> str:
    """Check a topic name against RocketMQ's rules (widened by ``.`` for QMQ's subjects) and return it.

    Raises:
        InvalidTopicError: empty, longer than 127 characters, or with characters outside
            ``[%|a-zA-Z0-9_.-]``.
    """
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("topic name must be a non-empty string", topic=name)
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters; at most {MAX_TOPIC_LENGTH} are allowed", topic=name
        )
    if not TOPIC_PATTERN.match(name):
        raise InvalidTopicError(f"topic name {name!r} has characters outside {TOPIC_CHARACTERS}", topic=name)
    return name


@lru_cache(maxsize=1024)
def is_valid_topic_name(name: str) -> bool:
    """Cached yes/no form of :func:`validate_topic_name` for hot paths."""
    return 0 < len(name) <= MAX_TOPIC_LENGTH and TOPIC_PATTERN.match(name) is not None


def is_system_topic(name: str) -> bool:
    """True for topics the broker owns: schedule, transaction, retry and dead-letter topics."""
    return (
        name in SYSTEM_TOPICS
        or name.lower().startswith("rmq_sys_")
        or name.startswith(RETRY_PREFIX)
        or name.startswith(DLQ_PREFIX)
    )


def is_send_refused_topic(name: str) -> bool:
    """True for the system topics a producer may not send to: every one but the trace topic."""
    return is_system_topic(name) and name != TRACE_TOPIC


def retry_topic(group: str) -> str:
    """Name of a group's retry topic."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """Name of a group's dead-letter topic."""
    return DLQ_PREFIX + group


def validate_group_name(group: object) -> str:
    """Check a consumer group name (same character rules as topics)."""
    if not isinstance(group, str) or not group:
        raise InvalidArgumentError("group must be a non-empty string", group=group)
    if len(group) > MAX_GROUP_LENGTH or not TOPIC_PATTERN.match(group):
        raise InvalidArgumentError(
            f"group {group!r} must be at most {MAX_GROUP_LENGTH} characters of {TOPIC_CHARACTERS}",
            group=group,
        )
    return group
