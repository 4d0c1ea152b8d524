"""Pure rules of the RocketMQ protocol, shared by clients and the broker: one concern per module.

Nothing here does I/O; every function is tested without a JVM or a disk.

- :mod:`~engine.protocol.names`: topic and group names, limits, system topics, property keys
- :mod:`~engine.protocol.tags`: tags codes and TAG subscription expressions
- :mod:`~engine.protocol.selectors`: message selectors (TAG and SQL92), filtering Arrow batches;
  :mod:`~engine.protocol.sql92_parser`, :mod:`~engine.protocol.sql92_ast` and
  :mod:`~engine.protocol.sql92_eval` hold RocketMQ's SQL92 grammar and its vectorised evaluation
- :mod:`~engine.protocol.messages`: message validation, record size, queue selection by key
- :mod:`~engine.protocol.message_ids`: offset message ids and client unique ids
- :mod:`~engine.protocol.delays`: delay levels and the retry policy
- :mod:`~engine.protocol.permissions`: topic permissions (RocketMQ's ``PermName``)
- :mod:`~engine.protocol.topics`: topic settings and the broker's own topics
- :mod:`~engine.protocol.actions`: the consumer actions of the ``action_log`` table
- :mod:`~engine.protocol.rebalance`: which queues each consumer of a group takes
- :mod:`~engine.protocol.pull`: limits of a pull and the offset checks before reading
- :mod:`~engine.protocol.schedule`: the schedule envelope of delayed, timer and retried messages
- :mod:`~engine.protocol.transactions`: transaction records and the check policy
- :mod:`~engine.protocol.shards`: which commit-log shard holds a queue, and which a physical offset names
- :mod:`~engine.protocol.queue_choice`: which queue a producer sends to when the caller names none

The names listed in ``__all__`` are re-exported here. :mod:`~engine.protocol.pull`,
:mod:`~engine.protocol.topics` and :mod:`~engine.protocol.transactions` build :mod:`engine.model`
values, so they are imported by their own paths: :mod:`engine.model` uses the permissions without
an import cycle.
"""

from __future__ import annotations

from engine.protocol.actions import (
    ACK,
    ACTIONS,
    CHANGE_INVISIBLE,
    EXPIRED,
    NACK,
    OFFLINE,
    PULL,
    RELEASE,
    RESET,
    ROUTED_ACTIONS,
)
from engine.protocol.delays import (
    DELAY_LEVELS_MS,
    MAX_DELAY_LEVEL,
    MaxReconsume,
    delay_due_ms,
    is_dead_letter,
    max_reconsume_times,
    retry_delay_level,
    validate_delay_level,
    validate_max_reconsume,
)
from engine.protocol.message_ids import (
    UniqKeyGenerator,
    make_msg_id,
    parse_msg_id,
    uniq_key_time_ms,
)
from engine.protocol.messages import (
    MAX_BODY_BYTES,
    RecordSizes,
    encode_properties,
    record_size,
    select_queue_by_hash,
    validate_message_fields,
)
from engine.protocol.names import (
    DLQ_PREFIX,
    MAX_GROUP_LENGTH,
    MAX_QUEUES,
    MAX_TOPIC_LENGTH,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    RESERVED_PROPERTIES,
    RETRY_PREFIX,
    SCHEDULE_TOPIC,
    SYSTEM_TOPICS,
    TOPIC_PATTERN,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    dlq_topic,
    is_system_topic,
    is_valid_topic_name,
    retry_topic,
    validate_group_name,
    validate_topic_name,
)
from engine.protocol.permissions import (
    DEFAULT_PERM,
    READ_WRITE,
    TOPIC_PERMS,
    Perm,
    is_readable,
    is_writeable,
)
from engine.protocol.rebalance import (
    STRATEGIES,
    AllocateStrategy,
    MessageModel,
    MessageQueue,
    StrategyName,
    allocate_averagely,
    allocate_averagely_by_circle,
    allocate_consistent_hash,
    resolve_strategy,
)
from engine.protocol.schedule import (
    LEVEL_QUEUES,
    MAX_TIMER_DELAY_MS,
    SCHEDULE_PROPERTIES,
    SCHEDULE_QUEUES,
    TIMER_QUEUE_ID,
    RealDestination,
    ScheduleEnvelope,
    real_destination,
    schedule_envelope,
    schedule_queue_id,
    without_schedule_properties,
)
from engine.protocol.selectors import ExpressionType, MessageSelector
from engine.protocol.sql92_parser import parse_sql92
from engine.protocol.tags import (
    TagFilter,
    java_string_hashcode,
    parse_tag_expression,
    tags_code,
)

__all__ = [
    "ACK",
    "ACTIONS",
    "CHANGE_INVISIBLE",
    "DEFAULT_PERM",
    "DELAY_LEVELS_MS",
    "DLQ_PREFIX",
    "EXPIRED",
    "LEVEL_QUEUES",
    "MAX_BODY_BYTES",
    "MAX_DELAY_LEVEL",
    "MAX_GROUP_LENGTH",
    "MAX_QUEUES",
    "MAX_TIMER_DELAY_MS",
    "MAX_TOPIC_LENGTH",
    "NACK",
    "OFFLINE",
    "PROPERTY_DELAY",
    "PROPERTY_KEYS",
    "PROPERTY_MAX_RECONSUME_TIMES",
    "PROPERTY_ORIGIN_MESSAGE_ID",
    "PROPERTY_REAL_QUEUE_ID",
    "PROPERTY_REAL_TOPIC",
    "PROPERTY_RECONSUME_TIME",
    "PROPERTY_RETRY_TOPIC",
    "PROPERTY_SHARDING_KEY",
    "PROPERTY_TAGS",
    "PROPERTY_TIMER_DELIVER_MS",
    "PROPERTY_TRANSACTION_PREPARED",
    "PROPERTY_UNIQ_KEY",
    "PULL",
    "READ_WRITE",
    "RELEASE",
    "RESERVED_PROPERTIES",
    "RESET",
    "RETRY_PREFIX",
    "ROUTED_ACTIONS",
    "SCHEDULE_PROPERTIES",
    "SCHEDULE_QUEUES",
    "SCHEDULE_TOPIC",
    "STRATEGIES",
    "SYSTEM_TOPICS",
    "TIMER_QUEUE_ID",
    "TOPIC_PATTERN",
    "TOPIC_PERMS",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "TRANS_HALF_TOPIC",
    "TRANS_OP_HALF_TOPIC",
    "AllocateStrategy",
    "ExpressionType",
    "MaxReconsume",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "Perm",
    "RealDestination",
    "RecordSizes",
    "ScheduleEnvelope",
    "StrategyName",
    "TagFilter",
    "UniqKeyGenerator",
    "allocate_averagely",
    "allocate_averagely_by_circle",
    "allocate_consistent_hash",
    "delay_due_ms",
    "dlq_topic",
    "encode_properties",
    "is_dead_letter",
    "is_readable",
    "is_system_topic",
    "is_valid_topic_name",
    "is_writeable",
    "java_string_hashcode",
    "make_msg_id",
    "max_reconsume_times",
    "parse_msg_id",
    "parse_sql92",
    "parse_tag_expression",
    "real_destination",
    "record_size",
    "resolve_strategy",
    "retry_delay_level",
    "retry_topic",
    "schedule_envelope",
    "schedule_queue_id",
    "select_queue_by_hash",
    "tags_code",
    "uniq_key_time_ms",
    "validate_delay_level",
    "validate_group_name",
    "validate_max_reconsume",
    "validate_message_fields",
    "validate_topic_name",
    "without_schedule_properties",
]
